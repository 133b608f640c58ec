"""The cascade: try tiers cheapest first, verify each answer, escalate the rejected.

For each tier in order (or only the tier the client named): generate, score with the tier's
verifiers, accept when the combined score reaches the tier's threshold or the tier is the last.
The decision is made here, once; verifiers only score and backends only generate.

Which verifiers and threshold a tier uses depends on the request's task (`router.tasks`): it is
detected once, before the first tier, and each tier judges by its policy for that task (built by
the composition root from `tiers[].tasks`, falling back to the tier's own settings).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from router import policy
from router.backends.base import Backend
from router.config import CascadeSettings, TierSettings
from router.errors import UnavailableError, UnknownModelError, spent_of
from router.generation import Delta, Generation, GenerationRequest
from router.policy import TaskPolicy, Usage
from router.tasks import TaskClassifier, TaskLabel, detect_task
from router.telemetry import context as telemetry
from router.telemetry.attempts import cascade_spans
from router.telemetry.spans import NOOP, Span
from router.verification import Score, VerifierCost, VerifierSet


class PreRouter(Protocol):
    """A prompt-only estimator in front of a tier: the probability that the tier will answer
    right, before it generates (trained by `tierroute eval train`)."""

    threshold: float

    @property
    def version(self) -> str: ...

    def probability(self, request: GenerationRequest) -> float: ...


@dataclass
class Tier:
    settings: TierSettings
    backend: Backend
    verifiers: VerifierSet
    prerouter: PreRouter | None = None  # loaded from settings.prerouter by router.engine.load_prerouter
    tasks: Mapping[str, TaskPolicy[VerifierSet]] = field(default_factory=dict)  # the tier's policies per task

    @property
    def name(self) -> str:
        return self.settings.name

    def judge(self, task: str | None) -> TaskPolicy[VerifierSet]:
        """How this tier judges answers to `task`: its policy for the task (built by the engine from
        `policy.task_policy`), else its own settings, read by that same function."""
        found = self.tasks.get(task) if task is not None else None
        return found if found is not None else policy.task_policy(self.settings, None).built(self.verifiers)

    def cost_of(self, gen: Generation) -> float:
        """What generating `gen` cost on this tier."""
        return policy.generation_cost(
            self.settings.price, gen.prompt_tokens, gen.completion_tokens, gen.busy_s, gen.latency_s
        )


@dataclass
class Attempt:
    tier: str
    threshold: float
    generation: Generation | None = None
    score: float | None = None
    scores: dict[str, Score] = field(default_factory=dict)
    accepted: bool = False
    reason: str = ""
    cost_usd: float = 0.0  # generating the candidate
    verifier_cost: VerifierCost = field(default_factory=VerifierCost)
    verifier_cost_usd: float = 0.0
    error: str | None = None
    verify_s: float = 0.0
    skipped: bool = False  # the pre-router predicted failure: the tier did not generate
    abandoned: bool = False  # the client went away while this tier's answer streamed
    prerouter: dict[str, Any] | None = None  # its version, probability and threshold

    @property
    def tool_check(self) -> bool | None:
        """Whether the answer's tool calls passed the `tool_call` verifier (its scores say so in
        `details["tool_call"]`); None when no such check ran or it abstained."""
        found = [s.details["tool_call"] for s in self.scores.values() if not s.abstained and "tool_call" in s.details]
        return all(found) if found else None


@dataclass
class CascadeResult:
    model: str  # what the client asked for
    attempts: list[Attempt]
    final: Attempt
    unverified: bool = False  # a lower tier's answer returned because the next tier was down
    counterfactual_usd: float = 0.0  # had the request gone straight to the top tier
    task: TaskLabel | None = None  # the request's task and why, detected before the first tier
    # what the request's stages said (router.pipeline.stages), shown in the tierroute object
    stages: dict[str, Any] = field(default_factory=dict)

    @property
    def escalated(self) -> bool:
        return len([a for a in self.attempts if a.generation is not None or a.error or a.skipped]) > 1

    @property
    def cost_usd(self) -> float:
        return policy.request_cost(c for a in self.attempts for c in (a.cost_usd, a.verifier_cost_usd))

    @property
    def generation(self) -> Generation:
        assert self.final.generation is not None
        return self.final.generation


@dataclass(frozen=True)
class Answering:
    """Yielded once, before the first text: which tier answers. Lets the HTTP layer send headers
    only when the answer is settled (or, for the last tier, once it has produced output)."""

    tier: str
    escalated: bool


@dataclass(frozen=True)
class Final:
    """The last item of Cascade.stream: the full result."""

    result: CascadeResult


@dataclass
class Spent:
    """Filled by Cascade.stream when it ends without a Final after work was done: a tier failed
    after earlier ones had answered, or the client went away mid-answer. `result` then holds what
    was spent (the interrupted attempt priced for the tokens it produced), for the ledger."""

    result: CascadeResult | None = None


class Cascade:
    def __init__(
        self, tiers: Sequence[Tier], settings: CascadeSettings, classifier: TaskClassifier | None = None
    ) -> None:
        if not tiers:
            raise ValueError("a cascade needs at least one tier")
        self.tiers = list(tiers)
        self.by_name: Mapping[str, Tier] = {t.name: t for t in tiers}
        self.settings = settings
        self.classifier = classifier  # None: tasks are detected by rules alone

    def detect(self, request: GenerationRequest) -> TaskLabel:
        return detect_task(request, self.classifier)

    def model_names(self) -> list[str]:
        return ["auto", *self.by_name]

    def plan(self, model: str) -> list[Tier]:
        if model == "auto":
            return self.tiers
        if model in self.by_name:
            return [self.by_name[model]]
        raise UnknownModelError(model, self.model_names())

    async def run(
        self,
        request: GenerationRequest,
        model: str = "auto",
        *,
        spent: Spent | None = None,
        task: TaskLabel | None = None,
        plan: Sequence[Tier] | None = None,
    ) -> CascadeResult:
        result: CascadeResult | None = None
        async for item in self.stream(request, model, live=False, spent=spent, task=task, plan=plan):
            if isinstance(item, Final):
                result = item.result
        assert result is not None
        return result

    async def stream(
        self,
        request: GenerationRequest,
        model: str = "auto",
        *,
        live: bool = True,
        spent: Spent | None = None,
        task: TaskLabel | None = None,
        plan: Sequence[Tier] | None = None,
    ) -> AsyncIterator[Answering | Delta | Final]:
        """Yield the answer's text, then a Final. Only the last planned tier streams live: text of a
        tier that may still be rejected is held back until it is verified. When it ends without a
        Final after work was done (a failure, or the consumer went away), `spent` gets what it cost.
        `task` is the request's task when the caller knows it (a replayed eval item); else it is
        detected here. `plan` is the tiers to try when the caller has made the plan already (the
        request pipeline, whose stages may have narrowed it); else it is `self.plan(model)`."""
        plan = list(plan) if plan is not None else self.plan(model)
        label = task if task is not None else self.detect(request)
        attempts: list[Attempt] = []
        attempt: Attempt | None = None
        tier: Tier | None = None
        pieces: list[Delta] = []  # what the current tier has streamed so far
        started = time.monotonic()
        rejected: tuple[Backend, str] | None = None  # the last rejected answer, a draft for the next tier
        finished = False  # a Final was handed out: the consumer owns the accounting from there
        # a span per tier attempt under the request's (router.telemetry; one shared no-op when off)
        traced = cascade_spans(request.trace or telemetry.request_span(), request.is_chat)
        try:
            for i, tier in enumerate(plan):
                last = i == len(plan) - 1
                judge = tier.judge(label.task)
                attempt = Attempt(tier=tier.name, threshold=judge.threshold)
                attempts.append(attempt)
                span = traced.begin(attempt, tier.settings.backend, min(request.max_tokens, tier.settings.max_tokens))
                if tier.prerouter is not None and self._skip(tier.prerouter, request, attempt, last=last):
                    continue
                tier_request = self._bound(request, tier, span)
                announced = False  # has this tier's text started reaching the client?
                pieces, started = [], time.monotonic()
                reuse = rejected is not None and tier.backend.reuses(rejected[0])
                try:
                    if last and live:
                        gen = None
                        stream = (
                            tier.backend.stream_reusing(tier_request, rejected[1])
                            if reuse and rejected is not None
                            else tier.backend.stream(tier_request)
                        )
                        async for item in stream:
                            if not announced:
                                announced = True
                                yield Answering(tier.name, escalated=i > 0)
                            if isinstance(item, Delta):
                                pieces.append(item)
                                yield item
                            else:
                                gen = item
                        assert gen is not None
                    elif reuse and rejected is not None:
                        gen = await tier.backend.generate_reusing(tier_request, rejected[1])
                    else:
                        gen = await tier.backend.generate(tier_request)
                except UnavailableError as exc:
                    attempt.error = f"{type(exc).__name__}: {exc}"
                    attempt.reason = "tier unavailable"
                    if not last:
                        self._charge(attempt, tier, exc)  # work it did all the same (a deadline cut)
                        continue
                    # once text has streamed, another tier's answer cannot be spliced in after it
                    fallback = None if announced else self._best_effort(attempts)
                    if fallback is None:
                        raise
                    yield Answering(fallback.tier, escalated=True)
                    yield Delta(fallback.generation.text, top_logprobs=fallback.generation.top_logprobs)  # type: ignore[union-attr]
                    finished = True
                    yield Final(self._result(model, attempts, fallback, label, unverified=True))
                    return
                attempt.generation = gen
                attempt.cost_usd = tier.cost_of(gen)
                await self._verify(tier, judge.verifiers, tier_request, gen, attempt)
                decision = policy.decide(attempt.score, judge.threshold, last=last)
                if decision == "accept":
                    attempt.accepted = True
                    attempt.reason = attempt.reason or "score reached the threshold"
                elif decision == "last":
                    attempt.accepted = True
                    attempt.reason = "last tier: accepted without passing" if judge.verifiers else "last tier"
                else:
                    attempt.reason = self._why_rejected(attempt)
                    rejected = (tier.backend, gen.text)
                    traced.decided(attempt, label.task)
                    continue
                traced.decided(attempt, label.task)
                if not (last and live):
                    yield Answering(tier.name, escalated=i > 0)
                    yield Delta(gen.text, top_logprobs=gen.top_logprobs)
                finished = True
                yield Final(self._result(model, attempts, attempt, label))
                return
        except BaseException as exc:  # a failure, or the consumer went away (GeneratorExit, cancelled)
            if not finished and attempt is not None and tier is not None:
                self._spent(spent, model, attempts, attempt, tier, pieces, started, exc, label)
            raise
        finally:
            traced.end()

    @staticmethod
    def _skip(prerouter: PreRouter, request: GenerationRequest, attempt: Attempt, *, last: bool) -> bool:
        if last:  # the last tier always runs: its pre-router is not even asked
            return False
        p = prerouter.probability(request)
        attempt.prerouter = {"version": prerouter.version, "probability": round(p, 6), "threshold": prerouter.threshold}
        if not policy.skipped(p, prerouter.threshold, last=last):
            return False
        attempt.skipped = True
        attempt.reason = f"skipped by pre-router p={p:.3f} < {prerouter.threshold:g} ({prerouter.version})"
        return True

    def _spent(
        self,
        spent: Spent | None,
        model: str,
        attempts: list[Attempt],
        attempt: Attempt,
        tier: Tier,
        pieces: list[Delta],
        started: float,
        exc: BaseException,
        label: TaskLabel,
    ) -> None:
        """Fill `spent` when the cascade ends without an answer after work was done: the
        interrupted attempt is priced for what it streamed (tokens and compute as the backend
        counted them; where it cannot, a token per piece and the elapsed time), or for the answer
        a backend had to refuse for its size, whose upstream refused it, or that its deadline cut
        (the error's `spent`)."""
        if spent is None:
            return
        gone = isinstance(exc, (GeneratorExit, asyncio.CancelledError))
        if not pieces:
            self._charge(attempt, tier, exc)
        if attempt.generation is None and pieces:
            last = pieces[-1]
            completion = last.completion_tokens if last.completion_tokens is not None else len(pieces)
            attempt.generation = Generation(
                text="".join(p.text for p in pieces),
                finish_reason="cancelled",
                prompt_tokens=last.prompt_tokens or 0,
                completion_tokens=completion,
                token_logprobs=None,
                latency_s=time.monotonic() - started,
                busy_s=last.busy_s,
                deployment=last.deployment,
                deployment_shown=last.deployment_shown,
            )
            attempt.cost_usd = tier.cost_of(attempt.generation)
        if gone:
            attempt.abandoned = True
            attempt.accepted = False
            attempt.reason = "the client went away before the answer was delivered"
        elif attempt.error is None:
            attempt.error = f"{type(exc).__name__}: {exc}"[:500]
            attempt.reason = "failed mid-answer" if pieces else "failed"
        if any(a.generation is not None for a in attempts):
            spent.result = self._result(model, attempts, attempt, label)

    @staticmethod
    def _charge(attempt: Attempt, tier: Tier, exc: BaseException) -> None:
        """Price a failed attempt for what its error says it cost (`router.errors.spent_of`: an
        answer too large to take generated all the same, a refused request's prompt read, a request
        cut at its deadline while the upstream generated for it), as the backend counts it."""
        charged = spent_of(exc)
        if attempt.generation is None and charged is not None:
            attempt.generation = charged
            attempt.cost_usd = tier.cost_of(charged)

    @staticmethod
    def _bound(request: GenerationRequest, tier: Tier, span: Span = NOOP) -> GenerationRequest:
        deadline = time.monotonic() + tier.settings.timeout_s
        if request.deadline is not None:
            deadline = min(deadline, request.deadline)
        return request.with_(
            max_tokens=min(request.max_tokens, tier.settings.max_tokens),
            deadline=deadline,
            # the client's own wish, or more where this tier's verifiers read the alternatives
            top_logprobs=max(request.top_logprobs, tier.verifiers.top_logprobs),
            # an attempt's span even when unsampled: its upstream call then stays in the client's trace
            trace=span if span is not NOOP else request.trace,
        )

    async def _verify(
        self, tier: Tier, verifiers: VerifierSet, request: GenerationRequest, gen: Generation, attempt: Attempt
    ) -> None:
        if not verifiers:
            attempt.score = policy.combine([])
            attempt.reason = "no verifiers"
            return

        def priced(scores: Iterable[Score]) -> float:
            """What the verifiers' own work cost, each part at the tier that did it."""
            return policy.verification_cost(
                (
                    self._worker(part.tier, tier).settings.price,
                    Usage(part.prompt_tokens, part.completion_tokens, part.seconds),
                )
                for s in scores
                for part in s.cost.parts()
            )

        t0 = time.monotonic()
        try:
            # a verifier that hangs (a sandbox queue, a judge tier) must not hold the request:
            # past the tier's verification deadline the answer counts as unverified and goes up.
            # Each verifier's span (when traced) says what its own work cost.
            verdict = await asyncio.wait_for(
                verifiers.score(request, gen, price=lambda score: priced((score,))),
                timeout=tier.settings.verify_timeout_s,
            )
        except TimeoutError:
            attempt.verify_s = time.monotonic() - t0
            attempt.score = None
            attempt.reason = f"verification passed its deadline ({tier.settings.verify_timeout_s:g} s)"
            return
        attempt.verify_s = time.monotonic() - t0
        attempt.score = verdict.score
        attempt.scores = verdict.scores
        attempt.verifier_cost = verdict.cost
        attempt.verifier_cost_usd = priced(verdict.scores.values())

    def _worker(self, name: str | None, tier: Tier) -> Tier:
        """The tier whose price a verifier's work is charged at: the one that did it."""
        return self.by_name.get(name or tier.name, tier)

    @staticmethod
    def _why_rejected(attempt: Attempt) -> str:
        if attempt.score is None:
            return attempt.reason or "every verifier abstained: no evidence the answer is right"
        low = sorted(
            (kv for kv in attempt.scores.items() if kv[1].value is not None), key=lambda kv: kv[1].value or 0.0
        )
        detail = "; ".join(f"{name}={s.value:.3f} ({s.reason})" for name, s in low[:3])
        return f"score {attempt.score:.3f} < threshold {attempt.threshold:.2f}" + (f": {detail}" if detail else "")

    def _best_effort(self, attempts: list[Attempt]) -> Attempt | None:
        if self.settings.on_unavailable != "best_effort":
            return None
        answered = [a for a in attempts if a.generation is not None and a.error is None]
        if not answered:
            return None
        best = max(answered, key=lambda a: a.score if a.score is not None else -1.0)
        best.accepted = True
        best.reason = f"unverified: higher tier unavailable; {best.reason}"
        return best

    def _result(
        self, model: str, attempts: list[Attempt], final: Attempt, task: TaskLabel, *, unverified: bool = False
    ) -> CascadeResult:
        result = CascadeResult(model=model, attempts=attempts, final=final, unverified=unverified, task=task)
        result.counterfactual_usd = self._counterfactual(attempts, final)
        return result

    def _counterfactual(self, attempts: list[Attempt], final: Attempt) -> float:
        """What the request would have cost sent straight to the top tier: the top tier's own cost
        when it ran, else its price for the same prompt and the answer's length."""
        top = self.tiers[-1]
        for a in attempts:
            if a.tier == top.name and a.generation is not None:
                return a.cost_usd
        gen = final.generation
        if gen is None:
            return 0.0
        return top.cost_of(gen)
