"""`InstructionsVerifier`: read the request's checkable instructions, check the answer against them.

What it reads is the request a caller sent: its system messages and its last user message (or a
plain completion's prompt), nothing else; not the request's metadata, where an eval suite's
answer key could sit. `verifiers.instructions.parse` turns those words into constraints, and
`verifiers.instructions.checks` checks each, the same functions IFEval's grader uses.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from router.generation import Generation, GenerationRequest
from verifiers.base import Score, VerifierContext, require_integers
from verifiers.instructions.checks import InstructionError, follows, restates
from verifiers.instructions.constraint import Constraint
from verifiers.instructions.parse import read_constraints, request_to_repeat

STATS = ("fraction", "all")
_INLINE_CHARS = 20_000  # a longer answer is checked off the event loop


def instructions_text(request: GenerationRequest) -> str:
    """The words the verifier reads constraints from: the system messages and the last user
    message of a chat request, or a completion's prompt."""
    if request.messages is None:
        return request.prompt or ""
    system = [m.content for m in request.messages if m.role in ("system", "developer") and m.content]
    return "\n\n".join([*system, request.last_user_text()])


@dataclass(frozen=True)
class InstructionsVerifier:
    """Scores an answer by the instructions its request states (see the package docstring)."""

    stat: str = "fraction"
    max_chars: int = 200_000
    name: str = "instructions"

    def __post_init__(self) -> None:
        if self.stat not in STATS:
            raise ValueError(f"stat must be one of {STATS}, not {self.stat!r}")
        require_integers(self, "max_chars")
        if self.max_chars < 1:
            raise ValueError("max_chars must be at least 1")
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        prompt = instructions_text(request)
        constraints = read_constraints(prompt)
        if not constraints:
            return Score.abstain("the request states no instruction this verifier can check")
        text = candidate.text
        if len(text) > self.max_chars:
            return Score(0.0, f"answer of {len(text)} characters is over max_chars ({self.max_chars})")
        asked = request.last_user_text()
        if len(text) > _INLINE_CHARS:
            return await asyncio.to_thread(self._judge, asked, constraints, text)
        return self._judge(asked, constraints, text)

    def _judge(self, asked: str, constraints: list[Constraint], text: str) -> Score:
        results: list[dict[str, Any]] = []
        for c in constraints:
            try:
                ok = follows(c.kind, c.args, text)
            except InstructionError:
                continue  # arguments read wrong: checking nothing beats checking nonsense
            results.append({"kind": c.kind, "args": c.args, "followed": ok, "read_from": c.where})
        if not results:
            return Score.abstain("no instruction read from the request could be checked")
        details: dict[str, Any] = {"constraints": results, "met": sum(r["followed"] for r in results)}
        details["total"] = len(results)
        if restates(text, asked, request_to_repeat(asked)):
            details["restates_prompt"] = True
            return Score(0.0, "the answer restates the request instead of answering it", details)
        met, total = details["met"], details["total"]
        value = met / total if self.stat == "fraction" else float(met == total)
        missed = [r["kind"] for r in results if not r["followed"]]
        reason = f"{met} of {total} instructions followed" + (f"; missed {', '.join(missed)}" if missed else "")
        return Score(value, reason, details)


def make_instructions(params: dict[str, Any], ctx: VerifierContext) -> InstructionsVerifier:
    return InstructionsVerifier(**params)
