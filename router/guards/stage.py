"""The guard: a request stage that runs one detector over a request (and, if asked, its answer)
and acts on what it finds. Three are built in (`router.pipeline.builtin`): `pii` (personal data,
`router.guards.pii`), `secrets` (`router.guards.secrets`) and `prompt_injection`
(`router.guards.injection`).

Params, all optional (docs/guardrails.md has the whole table):

    action           what to do with a request the detector finds something in:
                     block       a 400 in the surface's shape, code refused_by_<guard>, naming the
                                 kinds found and never the text
                     redact      each span replaced by a typed placeholder (router.guards.redaction)
                                 before any tier sees the request
                     keep_local  answered by the plan's local tiers only (tiers[].local): the plan is
                                 narrowed to them and the request marked `local_only`, which every
                                 remote backend and shadow escalation refuse; no local tier in the
                                 plan: refused
                     log_only    nothing but the note, the metric and a log line (kinds only)
    kinds            the kinds to look for (default: the detector's defaults)
    output           off (default), block, redact or log_only: the answer checked too, before any
                     of it is sent (a stream is then answered whole and streamed after)
    restore          with redact: put the values back where the answer repeats a placeholder
    on_local_reject  with keep_local, when the local tiers rejected their answer (it stands only
                     because no tier may follow): note (default; the `tierroute` object says so)
                     or refuse (a 400, the answer withheld; its cost is on the ledger)
    keys, teams, tasks   apply only to requests of these keys, teams or tasks (each unset: all)
    label            the guard's name in notes, metrics and error codes (default: the stage's
                     name), so one detector can be configured twice, for two teams
    min_score        pii only: Presidio's score a finding needs (default 0.4)

What leaves the request about a finding is its kind, a count and a keyed digest
(router.guards.findings): the `tierroute` object's `stages.<guard>`, /metrics
(`tierroute_stage_actions_total`), and a log line. A request or answer with a finding is never
stored in the response cache; an answer whose values were restored is not offered to shadow
escalation (the shadow tier was sent placeholders).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from router import policy
from router.guards import injection, normalise, pii, secrets
from router.guards.findings import Detector, Finding, digest, merged
from router.guards.redaction import Redaction, replaced
from router.guards.texts import Places, rewritten
from router.pipeline.stages import Stage, StageContext, StageRefused

if TYPE_CHECKING:
    from router.cache.answer import CachedAnswer
    from router.cascade import CascadeResult
    from router.generation import Generation

log = logging.getLogger(__name__)

ACTIONS = ("block", "redact", "keep_local", "log_only")
OUTPUT_ACTIONS = ("off", "block", "redact", "log_only")
_THREAD_CHARS = 8192  # texts longer than this are scanned off the event loop


def _strings(params: dict[str, Any], name: str) -> frozenset[str]:
    value = params.pop(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{name}: a list of non-empty strings")
    return frozenset(value)


def _choice(params: dict[str, Any], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = params.pop(name, default)
    if value not in allowed:
        raise ValueError(f"{name}: one of {', '.join(allowed)} (got {value!r})")
    return str(value)


class Guard(Stage):
    """One detector and the policy for what it finds (module docstring)."""

    default_action = "log_only"

    def __init__(self, params: dict[str, Any], make: Callable[..., Detector]) -> None:
        self.action = _choice(params, "action", ACTIONS, self.default_action)
        self.output = _choice(params, "output", OUTPUT_ACTIONS, "off")
        self.on_local_reject = _choice(params, "on_local_reject", ("note", "refuse"), "note")
        self.restore = params.pop("restore", False)
        if not isinstance(self.restore, bool):
            raise ValueError("restore: true or false")
        if self.restore and self.action != "redact":
            raise ValueError("restore: only with action = 'redact'")
        kinds = params.pop("kinds", None)
        self.keys = _strings(params, "keys")
        self.teams = _strings(params, "teams")
        self.tasks = _strings(params, "tasks")
        label = params.pop("label", None)
        if label is not None and (not isinstance(label, str) or not label.isidentifier()):
            raise ValueError("label: a name of letters, digits and underscores")
        extra = self._own_params(params)
        super().__init__(params)
        if kinds is not None and (
            not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds)
        ):
            raise ValueError("kinds: a non-empty list of kind names")
        self.detector = make(frozenset(kinds) if kinds is not None else None, **extra)
        self.name = label or ""
        # an answer is checked, or has values put back, before any of it is sent
        self.inspects_output = self.output != "off" or self.restore

    def _own_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """A subclass's detector params, popped from `params`."""
        return {}

    # -- which requests -------------------------------------------------------------------------

    def applies(self, ctx: StageContext) -> bool:
        p = ctx.principal
        if self.keys and p.key_id not in self.keys:
            return False
        if self.teams and p.team not in self.teams:
            return False
        return not self.tasks or ctx.task() in self.tasks

    async def _find(self, text: str) -> list[Finding]:
        if len(text) > _THREAD_CHARS:
            found = await asyncio.to_thread(normalise.scan, text, self.detector.detect)
        else:
            found = normalise.scan(text, self.detector.detect)
        return merged(found)

    # -- the request ----------------------------------------------------------------------------

    async def before(self, ctx: StageContext) -> CachedAnswer | None:
        if not self.applies(ctx):
            return None
        places = Places(ctx.request)
        found = await self._find(places.joined)
        if not found:
            return None
        ctx.cacheable = False
        kinds = Counter(f.kind for f in found)
        note: dict[str, Any] = {"action": self.action, "found": dict(sorted(kinds.items()))}
        note["digests"] = sorted({digest(places.joined[f.start : f.end]) for f in found})[:16]
        ctx.notes[self.name] = note
        for kind in sorted(kinds):
            ctx.acted(self.name, self.action, kind)
        log.info("guard %s: %s in a request (%s)", self.name, self.action, ", ".join(sorted(kinds)))
        named = ", ".join(sorted(kinds))
        if self.action == "block":
            raise StageRefused(
                self.name, f"The request was refused: it carries {named} (guard '{self.name}').", param="messages"
            )
        if self.action == "redact":
            ctx.request, redaction = self._redacted(ctx, places, found)
            ctx.state[self.name] = redaction
        elif self.action == "keep_local":
            self._keep_local(ctx, named, note)
        return None

    def _redacted(self, ctx: StageContext, places: Places, found: list[Finding]) -> tuple[Any, Redaction]:
        redaction = Redaction()
        edits: dict[int, list[tuple[int, int, str]]] = {}
        for f in found:
            mark = redaction.placeholder(f.kind, places.joined[f.start : f.end])
            for i, start, end in places.split(f.start, f.end):
                edits.setdefault(i, []).append((start, end, mark))
        new = {places.items[i].where: replaced(places.items[i].text, spans) for i, spans in edits.items()}
        return rewritten(ctx.request, new), redaction

    def _keep_local(self, ctx: StageContext, named: str, note: dict[str, Any]) -> None:
        local = [t.name for t in ctx.plan if t.settings.is_local]
        if not local:
            raise StageRefused(
                self.name,
                f"The request carries {named}, which may not leave this machine, and the model "
                f"'{ctx.model}' is not answered here (guard '{self.name}').",
                param="model",
            )
        narrowed = len(local) < len(ctx.plan)
        ctx.narrow(local)
        ctx.request = ctx.request.with_(local_only=True)
        note["tiers"] = local
        ctx.state[self.name] = narrowed

    # -- the answer ------------------------------------------------------------------------------

    async def after(self, ctx: StageContext, result: CascadeResult) -> None:
        state = ctx.state.get(self.name)
        note = ctx.notes.get(self.name)
        if self.action == "keep_local" and state is True and note is not None:
            final = result.final
            if policy.decide(final.score, final.threshold, last=False) != "accept":
                note["local_rejected"] = True
                if self.on_local_reject == "refuse":
                    raise StageRefused(
                        self.name,
                        "The local tiers did not accept their answer, and this request may not be sent "
                        f"to a remote tier (guard '{self.name}'); the answer is withheld.",
                    )
        if self.output != "off" and result.final.generation is not None and self.applies(ctx):
            await self._check_answer(ctx, result)
        if isinstance(state, Redaction) and result.final.generation is not None:
            restored: Counter[str] = Counter()
            result.final.generation = self._mapped(result.final.generation, lambda t: _counted(state, t, restored))
            if restored:
                ctx.shadowable = False  # the shadow tier was sent placeholders: no fair comparison
                for kind in sorted(restored):
                    ctx.acted(self.name, "restore", kind, "answer")
                if note is not None:
                    note["restored"] = dict(sorted(restored.items()))

    async def _check_answer(self, ctx: StageContext, result: CascadeResult) -> None:
        gen = result.final.generation
        assert gen is not None
        kinds: Counter[str] = Counter()
        spans: dict[str, list[Finding]] = {}
        for text in {t for choice in gen.choices for t in _texts(choice)}:
            found = await self._find(text)
            if found:
                spans[text] = found
                kinds.update(f.kind for f in found)
        if not kinds:
            return
        ctx.cacheable = False
        named = ", ".join(sorted(kinds))
        for kind in sorted(kinds):
            ctx.acted(self.name, self.output, kind, "answer")
        log.info("guard %s: %s in an answer (%s)", self.name, self.output, named)
        note = ctx.notes.setdefault(self.name, {})
        note["answer"] = {"action": self.output, "found": dict(sorted(kinds.items()))}
        if self.output == "block":
            raise StageRefused(self.name, f"The answer was withheld: it carried {named} (guard '{self.name}').")
        if self.output == "redact":

            def redact(text: str) -> str:
                found = spans.get(text)
                return text if not found else replaced(text, [(f.start, f.end, f"<{f.kind}>") for f in found])

            result.final.generation = self._mapped(gen, redact)

    @staticmethod
    def _mapped(gen: Generation, change: Callable[[str], str]) -> Generation:
        """`gen` with `change` applied to every choice's text and tool call arguments."""

        def one(g: Generation) -> Generation:
            calls = (
                None
                if g.tool_calls is None
                else tuple(dataclasses.replace(c, arguments=change(c.arguments)) for c in g.tool_calls)
            )
            return dataclasses.replace(g, text=change(g.text), tool_calls=calls)

        return dataclasses.replace(one(gen), others=tuple(one(o) for o in gen.others))


def _texts(g: Generation) -> list[str]:
    return [g.text, *(c.arguments for c in g.tool_calls or ())]


def _counted(redaction: Redaction, text: str, restored: Counter[str]) -> str:
    new, n = redaction.restore(text)
    restored.update(n)
    return new


class PiiGuard(Guard):
    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params, pii.PiiDetector)

    def _own_params(self, params: dict[str, Any]) -> dict[str, Any]:
        score = params.pop("min_score", 0.4)
        if not isinstance(score, (int, float)) or isinstance(score, bool) or not 0 <= score <= 1:
            raise ValueError("min_score: a number in [0, 1]")
        return {"min_score": float(score)}


class SecretsGuard(Guard):
    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params, _known(secrets.SecretsDetector, secrets.KINDS))


class InjectionGuard(Guard):
    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params, _known(injection.InjectionDetector, injection.KINDS))


def _known(make: Callable[[frozenset[str] | None], Detector], known: frozenset[str]) -> Callable[..., Detector]:
    def checked(kinds: frozenset[str] | None) -> Detector:
        if kinds is not None and kinds - known:
            raise ValueError(f"unknown kinds {sorted(kinds - known)}; known: {', '.join(sorted(known))}")
        return make(kinds)

    return checked
