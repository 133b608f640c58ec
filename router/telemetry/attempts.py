"""The spans of a request's work, and the facts of its log line: what each part of the cascade
puts on its span, in the OpenTelemetry GenAI names where they exist (`gen_ai.*`), else ours
(`tierroute.*`).

- a tier attempt: `chat {tier}` (or `text_completion {tier}`), the request's server span its
  parent: the generation's tokens, time to first token, finish reason, and the attempt's score,
  threshold, outcome and cost;
- its decision: `tierroute.decision`, a child of the attempt: accepted or escalated, the score
  against the threshold, the task;
- each verifier: `verify {name}`, a child of the attempt (`router.verification`);
- the upstream call of an OpenAI-compatible tier: `POST {host}`, a child of the attempt: attempts
  made, retries, the breaker's state before and after;
- the ledger write (`router.ledger.writer`) and shadow work (a trace of its own, linked to the
  request's span: `router.quality.shadow`).

Nothing here carries a prompt, an answer's text, an error's message (an upstream may echo the
prompt in it) or a key: counts, names, scores and the reasons the cascade gives, less each
verifier's own words (a schema error names the answer's values, `arithmetic` the prompt's sum,
`math_answer` the answer's number: the ledger keeps them, with the rest of the request).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from router.generation import Generation
from router.tasks import TaskLabel
from router.telemetry import spans
from router.telemetry.spans import NOOP, Span

_REASON_CHARS = 300  # a reason is the cascade's own words, cut so a long one cannot flood a span


class _Tokens(Protocol):
    @property
    def tokens(self) -> int: ...


class _ScoreView(Protocol):
    @property
    def value(self) -> float | None: ...
    @property
    def reason(self) -> str: ...


class AttemptView(Protocol):
    """What a span reads of a tier attempt (`router.cascade.Attempt`)."""

    @property
    def tier(self) -> str: ...
    @property
    def threshold(self) -> float: ...
    @property
    def generation(self) -> Generation | None: ...
    @property
    def score(self) -> float | None: ...
    @property
    def accepted(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def scores(self) -> Mapping[str, _ScoreView]: ...
    @property
    def error(self) -> str | None: ...
    @property
    def skipped(self) -> bool: ...
    @property
    def abandoned(self) -> bool: ...
    @property
    def cost_usd(self) -> float: ...
    @property
    def verifier_cost_usd(self) -> float: ...
    @property
    def verifier_cost(self) -> _Tokens: ...
    @property
    def verify_s(self) -> float: ...


class ResultView(Protocol):
    """What the log line reads of a settled request (`router.cascade.CascadeResult`)."""

    @property
    def attempts(self) -> Sequence[AttemptView]: ...
    @property
    def final(self) -> AttemptView: ...
    @property
    def task(self) -> TaskLabel | None: ...
    @property
    def escalated(self) -> bool: ...
    @property
    def unverified(self) -> bool: ...
    @property
    def cost_usd(self) -> float: ...


def _short(reason: str) -> str:
    return reason if len(reason) <= _REASON_CHARS else reason[: _REASON_CHARS - 1] + "…"


def reason_of(attempt: AttemptView) -> str:
    """The attempt's reason as a span or a log line tells it: each verifier the cascade names
    there (`name=score (its words)`, `router.cascade`) by its name and score only."""
    reason = attempt.reason
    for name, score in attempt.scores.items():
        if score.value is not None and score.reason:
            reason = reason.replace(f"{name}={score.value:.3f} ({score.reason})", f"{name}={score.value:.3f}")
    return _short(reason)


def _error_type(error: str | None) -> str | None:
    """The exception's type of an attempt's error ("UpstreamError: ..."), never its message."""
    return None if error is None else error.partition(":")[0]


class CascadeSpans:
    """One cascade run's attempt spans: `begin` each attempt (ending the one before), `decided`
    once its score is judged, `end` on every way out. Its attributes are written when it ends,
    from the attempt as it stands then."""

    __slots__ = ("parent", "operation", "span", "attempt")

    def __init__(self, parent: Span, chat: bool) -> None:
        self.parent = parent
        self.operation = "chat" if chat else "text_completion"
        self.span: Span = NOOP
        self.attempt: AttemptView | None = None

    def begin(self, attempt: AttemptView, backend: str, max_tokens: int) -> Span:
        self.end()
        self.attempt = attempt
        self.span = spans.start(
            f"{self.operation} {attempt.tier}",
            self.parent,
            attributes={
                "gen_ai.operation.name": self.operation,
                "gen_ai.request.model": attempt.tier,
                "gen_ai.provider.name": backend,
                "gen_ai.request.max_tokens": max_tokens,
                "tierroute.threshold": attempt.threshold,
            },
        )
        return self.span

    def decided(self, attempt: AttemptView, task: str | None) -> None:
        attributes: dict[str, Any] = {
            "tierroute.decision": "accepted" if attempt.accepted else "escalated",
            "tierroute.threshold": attempt.threshold,
            "tierroute.reason": reason_of(attempt),
        }
        if attempt.score is not None:
            attributes["tierroute.score"] = attempt.score
        if task is not None:
            attributes["tierroute.task"] = task
        spans.start("tierroute.decision", self.span, attributes=attributes).end()

    def end(self) -> None:
        attempt, self.attempt = self.attempt, None
        if attempt is None:
            return
        self.span.set_attributes(attempt_attributes(attempt))
        if attempt.error is not None:
            self.span.set_attribute("error.type", _error_type(attempt.error))
        self.span.end()


class _Off(CascadeSpans):
    """The cascade's spans while tracing is off: one shared object, every call a no-op."""

    __slots__ = ()

    def begin(self, attempt: AttemptView, backend: str, max_tokens: int) -> Span:
        return NOOP

    def decided(self, attempt: AttemptView, task: str | None) -> None:
        return None

    def end(self) -> None:
        return None


_OFF = _Off(NOOP, True)


def cascade_spans(parent: Span | None, chat: bool) -> CascadeSpans:
    """The spans of one cascade run under `parent` (the request's span, or None: a root each)."""
    if not spans.active():
        return _OFF
    return CascadeSpans(parent or NOOP, chat)


def attempt_attributes(attempt: AttemptView) -> dict[str, Any]:
    """An ended attempt's attributes. Each costs the SDK a check on every span, so what is usually
    false or zero is left out then (skipped, abandoned, verifier tokens: absent reads as none)."""
    out: dict[str, Any] = {
        "tierroute.accepted": attempt.accepted,
        "tierroute.reason": reason_of(attempt),
        "tierroute.cost_usd": attempt.cost_usd,
        "tierroute.verifier_cost_usd": attempt.verifier_cost_usd,
    }
    if attempt.skipped:
        out["tierroute.skipped"] = True
    if attempt.abandoned:
        out["tierroute.abandoned"] = True
    tokens = attempt.verifier_cost.tokens
    if tokens:
        out["tierroute.verifier_tokens"] = tokens
    if attempt.score is not None:
        out["tierroute.score"] = attempt.score
    gen = attempt.generation
    if gen is not None:
        out |= {
            "gen_ai.usage.input_tokens": gen.prompt_tokens,
            "gen_ai.usage.output_tokens": gen.completion_tokens,
            "gen_ai.response.finish_reasons": [gen.finish_reason],
            "tierroute.generate_s": gen.latency_s,
        }
        if gen.model:
            out["gen_ai.response.model"] = gen.model
        if gen.ttft_s is not None:
            out["tierroute.time_to_first_token_s"] = gen.ttft_s
    return out


# -- the upstream call ---------------------------------------------------------------------------


def upstream_span(parent: Span | None, tier: str, host: str | None, port: int | None, breaker: str) -> Span:
    """The span of one logical call to an OpenAI-compatible upstream (all its attempts)."""
    if not spans.active():
        return NOOP
    attributes: dict[str, Any] = {
        "http.request.method": "POST",
        "tierroute.tier": tier,
        "tierroute.breaker.state": breaker,
    }
    if host is not None:
        attributes["server.address"] = host
    if port is not None:
        attributes["server.port"] = port
    return spans.start(f"POST {host}", parent, kind="client", attributes=attributes)


def upstream_done(span: Span, attempts: int, breaker: str) -> None:
    if span.is_recording():
        span.set_attributes(
            {
                "tierroute.upstream.attempts": attempts,
                "tierroute.upstream.retries": max(0, attempts - 1),
                "tierroute.breaker.state_after": breaker,
            }
        )
    span.end()


# -- the request's log line ------------------------------------------------------------------------


def result_facts(result: ResultView) -> dict[str, Any]:
    """A settled request's facts for its log line and its server span: the tiers tried, the final
    one, why it escalated, tokens and cost."""
    tried = [a for a in result.attempts if a.generation is not None or a.error or a.skipped]
    rejected = [a for a in tried if a is not result.final and not a.accepted]
    return {
        "task": result.task.task if result.task is not None else None,
        "tiers_tried": [a.tier for a in tried],
        "final_tier": result.final.tier,
        "escalated": result.escalated,
        "escalation_reason": reason_of(rejected[-1]) if rejected else None,
        "unverified": result.unverified,
        "prompt_tokens": sum(a.generation.prompt_tokens for a in tried if a.generation is not None),
        "completion_tokens": sum(a.generation.completion_tokens for a in tried if a.generation is not None),
        "cost_usd": result.cost_usd,
        "cache_hit": False,
    }


def replayed_facts(tier: str, task: str | None) -> dict[str, Any]:
    """A cache hit's facts, as its ledger row has them (`router.cache.answer`): the tier whose
    answer it replays, nothing tried, generated or charged."""
    return {
        "task": task,
        "tiers_tried": [],
        "final_tier": tier,
        "escalated": False,
        "escalation_reason": None,
        "unverified": False,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost_usd": 0.0,
        "cache_hit": True,
    }
