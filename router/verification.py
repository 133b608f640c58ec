"""What the cascade needs of verification, and nothing of any verifier: the score a verifier
returns, the verifier protocol, the context a verifier is built with, and a tier's set of
verifiers run concurrently and combined by the decision rule in `router.policy`.

A verifier scores a candidate answer in [0, 1] and says why, or abstains (`Score.abstain`) when it
does not apply (a maths check on a poem). It sees what a real caller would have, the request and
the candidate, and never a grader's reference answer. Implementations live in the `verifiers`
package and in third-party plugins; they are registered by name (`router.plugins`) and built by
the composition root (`router.engine`), so this module, and the cascade, import none of them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from router import policy
from router.admission.slots import Slots
from router.generation import Generation, GenerationRequest
from router.telemetry import spans

if TYPE_CHECKING:
    from router.backends.base import Backend


@dataclass(frozen=True)
class VerifierCost:
    """What verifying cost beyond the candidate itself: extra tokens and compute time, and the tier
    whose backend did that work (None: the tier being verified). A verifier whose work ran on
    several tiers (a learned verifier reading a `judge` on another tier) adds costs up: work on
    the same tier is summed, work on another tier is kept apart in `others`, so that every part is
    priced at the tier that did it (`parts`, `router.policy.verification_cost`)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    tier: str | None = None
    others: tuple[VerifierCost, ...] = ()  # work on other tiers, one entry per tier

    def __add__(self, other: VerifierCost) -> VerifierCost:
        by_tier: dict[str | None, VerifierCost] = {}
        for part in (*self.parts(), *other.parts()):
            have = by_tier.get(part.tier)
            by_tier[part.tier] = (
                part
                if have is None
                else VerifierCost(
                    have.prompt_tokens + part.prompt_tokens,
                    have.completion_tokens + part.completion_tokens,
                    have.seconds + part.seconds,
                    part.tier,
                )
            )
        if not by_tier:
            return VerifierCost()
        first, *rest = by_tier.values()
        return replace(first, others=tuple(rest))

    def parts(self) -> tuple[VerifierCost, ...]:
        """One cost per tier that did work, each without `others`; nothing for no work."""
        own = () if self.is_zero() and self.tier is None else (replace(self, others=()),)
        return own + tuple(p for o in self.others for p in o.parts())

    def is_zero(self) -> bool:
        return self.prompt_tokens == 0 and self.completion_tokens == 0 and self.seconds == 0.0

    @property
    def tokens(self) -> int:
        return sum(p.prompt_tokens + p.completion_tokens for p in self.parts())


@dataclass(frozen=True)
class Score:
    value: float | None  # in [0, 1], higher means more likely acceptable; None: abstains
    reason: str
    details: dict[str, Any] = field(default_factory=dict)
    cost: VerifierCost = field(default_factory=VerifierCost)

    def __post_init__(self) -> None:
        if self.value is not None and (math.isnan(self.value) or not 0.0 <= self.value <= 1.0):
            raise ValueError(f"score {self.value} outside [0, 1]")

    @classmethod
    def abstain(cls, reason: str, **kwargs: Any) -> Score:
        """Not applicable to this answer: the combination ignores it."""
        return cls(None, reason, **kwargs)

    @classmethod
    def unavailable(cls, reason: str, **kwargs: Any) -> Score:
        """Could not be computed now (what the verifier needs timed out or failed): the service
        treats it as an abstention; an eval run does not store it, so a rerun computes it."""
        details = {**kwargs.pop("details", {}), "unavailable": True}
        return cls(None, reason, details, **kwargs)

    @property
    def abstained(self) -> bool:
        return self.value is None

    @property
    def is_unavailable(self) -> bool:
        return self.value is None and self.details.get("unavailable") is True


@runtime_checkable
class Verifier(Protocol):
    @property
    def name(self) -> str: ...

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score: ...


def wanted_top_logprobs(verifier: Verifier) -> int:
    """How many top-k alternatives per token a verifier needs in the candidates it scores. A
    verifier that reads them (`choice`) says so with an int attribute `top_logprobs`; the cascade
    asks the tier's backend for the most any of the tier's verifiers wants. The others need none."""
    wanted = getattr(verifier, "top_logprobs", 0)
    return wanted if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted > 0 else 0


def uses_a_model(verifier: Verifier) -> bool:
    """Whether scoring asks a tier's model for work: more text (`self_consistency`, `judge`,
    `execution`'s second opinion) or a reading of the answer (`cross_tier`). Such a verifier says so
    with a bool attribute `uses_model`; a tier with no model (an imported run's) cannot score with it,
    and a learned estimator does not take it as a feature unless asked to."""
    return getattr(verifier, "uses_model", False) is True


def worst_cost(verifier: Verifier, request: GenerationRequest) -> VerifierCost | None:
    """The most scoring an answer to `request` can cost, for admission to reserve
    (`router.admission.accounting.worst_case_usd`). A verifier whose scoring asks a model for work says so
    with a method `worst_cost(request) -> VerifierCost` (the tokens and seconds of every
    generation or prefill it may ask for, at the tier that does it; `request` is the one the tier
    is sent, already capped to its max_tokens); one that asks no model costs nothing; None: it
    uses a model and does not say what it may cost."""
    hook = getattr(verifier, "worst_cost", None)
    if callable(hook):
        found = hook(request)
        return found if isinstance(found, VerifierCost) else None
    return None if uses_a_model(verifier) else VerifierCost()


class VerifierMaker(Protocol):
    """Builds verifiers by name (a tier's `router.plugins.SharedRegistry` in the service)."""

    def create(self, name: str, params: dict[str, Any], ctx: VerifierContext) -> Verifier: ...


def spec_uses_a_model(maker: VerifierMaker, name: str, params: dict[str, Any]) -> bool:
    """`uses_a_model` of the verifier a name and params make (built with no backends: building is
    cheap, and what it would ask of a model is a property of the kind and its params). Raises
    VerifierError where they do not build."""
    return uses_a_model(maker.create(name, dict(params), VerifierContext(tier="")))


@dataclass
class VerifierContext:
    """What a verifier may use besides the request: the tier's own backend and the others."""

    tier: str
    backend: Backend | None = None
    backends: Mapping[str, Backend] = field(default_factory=dict)
    # where a verifier that is built from other verifiers (`learned`) gets them: a tier's
    # SharedRegistry, so a feature verifier the tier also runs is scored once per answer
    registry: VerifierMaker | None = None
    # the host's sandbox slots, one per engine (or eval run), shared by every verifier that runs
    # code on every tier (`router.admission.slots`); None: only the verifier's own limit applies
    sandboxes: Slots | None = None


VerifierFactory = Callable[[dict[str, Any], VerifierContext], Verifier]


class VerifierError(ValueError):
    """A verifier name or its params are wrong (raised at start-up, naming the verifier)."""


# Scores already computed for the candidate a VerifierSet is scoring now, by shared verifier.
_ROUND: ContextVar[dict[int, asyncio.Future[Score]] | None] = ContextVar("tierroute_verify_round", default=None)


class SharedVerifier:
    """One verifier instance that several members of a tier use, such as the tier's own
    `confidence` and the `confidence` feature of its `learned` verifier: within one VerifierSet
    scoring (one candidate) it runs once; the first caller gets the score with its cost, the others
    the same score at no cost, so the verifying is charged once. Outside one, or with a single
    user (nothing to share), it simply scores: no task, no lookup."""

    def __init__(self, inner: Verifier) -> None:
        self.inner = inner
        self.name = inner.name
        self.top_logprobs = wanted_top_logprobs(inner)
        self.uses_model = uses_a_model(inner)
        self.users = 0  # members built on this instance; with one, there is nothing to share

    def worst_cost(self, request: GenerationRequest) -> VerifierCost | None:
        return worst_cost(self.inner, request)

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        memo = _ROUND.get() if self.users > 1 else None
        if memo is None:
            return await self.inner.score(request, candidate)
        fut = memo.get(id(self))
        if fut is None:
            fut = memo[id(self)] = asyncio.ensure_future(self.inner.score(request, candidate))
            return await asyncio.shield(fut)  # one caller cancelled does not cancel the others' score
        return replace(await asyncio.shield(fut), cost=VerifierCost())


@dataclass(frozen=True)
class WeightedVerifier:
    verifier: Verifier
    weight: float


@dataclass(frozen=True)
class Verdict:
    """The combined judgement of a tier's verifiers: the combined score (None when every verifier
    abstained) and each verifier's own score, which carries its cost."""

    score: float | None
    scores: dict[str, Score]

    @property
    def cost(self) -> VerifierCost:
        """The extra work of all members together, kept apart per tier that did it."""
        total = VerifierCost()
        for s in self.scores.values():
            total = total + s.cost
        return total


class VerifierSet:
    """A tier's verifiers, run concurrently and combined by `router.policy.combine`."""

    def __init__(self, members: list[WeightedVerifier], combine: str = "mean") -> None:
        if combine not in ("mean", "min"):
            raise VerifierError(f"combine must be 'mean' or 'min', not {combine!r}")
        names = [m.verifier.name for m in members]
        if len(set(names)) != len(names):
            raise VerifierError(f"a tier lists the same verifier twice: {names}")
        self.members = members
        self.combine = combine

    def __bool__(self) -> bool:
        return bool(self.members)

    @property
    def top_logprobs(self) -> int:
        """The top-k alternatives per token that the members need (0: none)."""
        return max((wanted_top_logprobs(m.verifier) for m in self.members), default=0)

    async def score(
        self, request: GenerationRequest, candidate: Generation, *, price: Callable[[Score], float] | None = None
    ) -> Verdict:
        """The members' scores and their combination. `price(score)`: what a score's own work cost
        in dollars, put on its member's span when the request is traced."""
        if not self.members:
            return Verdict(policy.combine([], self.combine), {})
        token = _ROUND.set({})  # the members' tasks (and theirs) share this candidate's scores
        traced = request.trace is not None and request.trace.is_recording()
        try:
            results = await asyncio.gather(
                *(
                    _traced(m.verifier, request, candidate, price) if traced else m.verifier.score(request, candidate)
                    for m in self.members
                )
            )
        finally:
            _ROUND.reset(token)
        scores = {m.verifier.name: s for m, s in zip(self.members, results, strict=True)}
        combined = policy.combine(
            [(s.value, m.weight) for m, s in zip(self.members, results, strict=True)], self.combine
        )
        return Verdict(combined, scores)


async def _traced(
    verifier: Verifier, request: GenerationRequest, candidate: Generation, price: Callable[[Score], float] | None
) -> Score:
    """A member's score under a span of its own (`verify {name}`), a child of the tier attempt's:
    its score, whether it abstained, and what its work cost (`router.telemetry.attempts`)."""
    name = verifier.name
    span = spans.start(f"verify {name}", request.trace, attributes={"gen_ai.evaluation.name": name})
    try:
        score = await verifier.score(request, candidate)
    except BaseException as exc:
        spans.fail(span, exc)
        raise
    else:
        cost = score.cost
        attributes: dict[str, Any] = {"tierroute.verifier.abstained": score.abstained}
        if score.value is not None:
            attributes["gen_ai.evaluation.score.value"] = score.value
        if score.is_unavailable:
            attributes["tierroute.verifier.unavailable"] = True
        if not cost.is_zero() or cost.others:  # what its work cost, on whichever tiers did it
            attributes["tierroute.verifier.tokens"] = cost.tokens
            attributes["tierroute.verifier.seconds"] = math.fsum(p.seconds for p in cost.parts())
            if cost.tier is not None:
                attributes["tierroute.verifier.tier"] = cost.tier
            if price is not None:
                attributes["tierroute.verifier.cost_usd"] = price(score)
        span.set_attributes(attributes)
        return score
    finally:
        span.end()
