"""The verifier protocol, the score it returns, and the registry plugins register into.

A verifier scores a candidate answer in [0, 1] and says why. It sees what a real caller would
have, the request and the candidate, and never a grader's reference answer.

Plugins are found through the entry-point group ``tierroute.verifiers``. Each entry point names a
callable ``register_verifiers(register)``; ``register(name, factory)`` adds a factory
``factory(params: dict, ctx: VerifierContext) -> Verifier``. The built-ins register the same way.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from router.generation import Generation, GenerationRequest

if TYPE_CHECKING:
    from router.backends.base import Backend

ENTRY_POINT_GROUP = "tierroute.verifiers"


@dataclass(frozen=True)
class VerifierCost:
    """What verifying cost beyond the candidate itself: extra tokens and compute time."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    usd: float = 0.0  # filled by the cascade from the price of the tier that did the work
    tier: str | None = None  # the tier whose backend did the extra generations, if any

    def __add__(self, other: VerifierCost) -> VerifierCost:
        return VerifierCost(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.seconds + other.seconds,
            self.usd + other.usd,
            self.tier or other.tier,
        )


@dataclass(frozen=True)
class Score:
    value: float  # in [0, 1]; higher means more likely acceptable
    reason: str
    details: dict[str, Any] = field(default_factory=dict)
    cost: VerifierCost = field(default_factory=VerifierCost)

    def __post_init__(self) -> None:
        if math.isnan(self.value) or not 0.0 <= self.value <= 1.0:
            raise ValueError(f"score {self.value} outside [0, 1]")


@runtime_checkable
class Verifier(Protocol):
    name: str

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score: ...


@dataclass
class VerifierContext:
    """What a verifier may use besides the request: the tier's own backend and the others."""

    tier: str
    backend: Backend | None = None
    backends: Mapping[str, Backend] = field(default_factory=dict)
    # where a verifier that is built from other verifiers (`learned`) gets them: a tier's
    # SharedRegistry, so a feature verifier the tier also runs is scored once per answer
    registry: Registry | None = None


VerifierFactory = Callable[[dict[str, Any], VerifierContext], Verifier]


class VerifierError(ValueError):
    """A verifier name or its params are wrong (raised at start-up, naming the verifier)."""


class Registry:
    def __init__(self) -> None:
        self._factories: dict[str, VerifierFactory] = {}

    def register(self, name: str, factory: VerifierFactory) -> None:
        if name in self._factories:
            raise VerifierError(f"verifier '{name}' registered twice")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, params: dict[str, Any], ctx: VerifierContext) -> Verifier:
        try:
            factory = self._factories[name]
        except KeyError:
            raise VerifierError(f"unknown verifier '{name}'; known: {', '.join(self.names())}") from None
        try:
            return factory(dict(params), ctx)
        except (TypeError, ValueError) as exc:
            raise VerifierError(f"verifier '{name}': bad params {params!r}: {exc}") from None

    @classmethod
    def from_entry_points(cls) -> Registry:
        reg = cls()
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            ep.load()(reg.register)
        return reg


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
        self.users = 0  # members built on this instance; with one, there is nothing to share

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        memo = _ROUND.get() if self.users > 1 else None
        if memo is None:
            return await self.inner.score(request, candidate)
        fut = memo.get(id(self))
        if fut is None:
            fut = memo[id(self)] = asyncio.ensure_future(self.inner.score(request, candidate))
            return await asyncio.shield(fut)  # one caller cancelled does not cancel the others' score
        return replace(await asyncio.shield(fut), cost=VerifierCost())


class SharedRegistry(Registry):
    """A registry for one tier: the same name and params give the same SharedVerifier."""

    def __init__(self, registry: Registry) -> None:
        super().__init__()
        self._factories = registry._factories
        self._made: dict[str, SharedVerifier] = {}

    def create(self, name: str, params: dict[str, Any], ctx: VerifierContext) -> Verifier:
        key = json.dumps([name, params], sort_keys=True, default=str)
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = SharedVerifier(super().create(name, params, ctx))
        made.users += 1
        return made


@dataclass(frozen=True)
class WeightedVerifier:
    verifier: Verifier
    weight: float


@dataclass(frozen=True)
class Verdict:
    """The combined judgement of a tier's verifiers."""

    score: float
    scores: dict[str, Score]
    cost: VerifierCost


class VerifierSet:
    """A tier's verifiers, run concurrently and combined by weighted mean or min."""

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

    async def score(self, request: GenerationRequest, candidate: Generation) -> Verdict:
        if not self.members:
            return Verdict(1.0, {}, VerifierCost())
        token = _ROUND.set({})  # the members' tasks (and theirs) share this candidate's scores
        try:
            results = await asyncio.gather(*(m.verifier.score(request, candidate) for m in self.members))
        finally:
            _ROUND.reset(token)
        scores = {m.verifier.name: s for m, s in zip(self.members, results, strict=True)}
        if self.combine == "min":
            combined = min(s.value for s in results)
        else:
            total = math.fsum(m.weight for m in self.members)
            combined = math.fsum(m.weight * s.value for m, s in zip(self.members, results, strict=True)) / total
        cost = VerifierCost()
        for s in results:
            cost = cost + s.cost
        return Verdict(min(1.0, max(0.0, combined)), scores, cost)
