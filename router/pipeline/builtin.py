"""The built-in stages, registered through the entry-point group as a plugin's are.

`deny_phrases`: refuse a request whose messages (or prompt) contain one of the operator's phrases,
before any tier sees it: the smallest useful guard, and the worked example of docs/plugins.md.
Params: `phrases` (a list of strings, required), `case_sensitive` (default false). The refusal
names the stage, never the phrase matched (a client probing the list learns only that one
matched).

The guards (router.guards): `pii` (personal data, by Microsoft Presidio's pattern recognizers),
`secrets` (API keys, private keys, tokens) and `prompt_injection` (text aimed at the verifiers and
judges), each blocking, redacting, keeping the request on the machine or only logging what it
finds (docs/guardrails.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from router.guards.stage import InjectionGuard, PiiGuard, SecretsGuard
from router.pipeline.stages import Stage, StageContext, StageFactory, StageRefused

if TYPE_CHECKING:
    from router.cache.answer import CachedAnswer


class DenyPhrases(Stage):
    def __init__(self, params: dict[str, Any]) -> None:
        phrases = params.pop("phrases", None)
        self.case_sensitive = params.pop("case_sensitive", False)
        super().__init__(params)
        if not isinstance(phrases, list) or not phrases or not all(isinstance(p, str) and p for p in phrases):
            raise ValueError("phrases: a non-empty list of non-empty strings")
        if not isinstance(self.case_sensitive, bool):
            raise ValueError("case_sensitive: true or false")
        self.phrases = tuple(phrases if self.case_sensitive else (p.casefold() for p in phrases))

    async def before(self, ctx: StageContext) -> CachedAnswer | None:
        r = ctx.request
        texts = [r.prompt] if r.prompt is not None else [m.content for m in r.messages or ()]
        for text in texts:
            seen = text if self.case_sensitive else text.casefold()
            if any(p in seen for p in self.phrases):
                ctx.notes[self.name] = {"action": "refused"}
                raise StageRefused(self.name, "The request was refused by the operator's content policy.")
        return None


def register_builtin_stages(register: Callable[[str, StageFactory], None]) -> None:
    register("deny_phrases", DenyPhrases)
    register("pii", PiiGuard)
    register("secrets", SecretsGuard)
    register("prompt_injection", InjectionGuard)
