"""Self-consistency: sample the question k more times and see how often the answer comes back.

An answer a model reaches by many paths is more often right than one it reaches once (Wang et al.,
2022). The k samples run concurrently on the tier's own backend, or on another tier named by
``tier``; their tokens and time are this verifier's cost.

Answers are compared after extraction: ``extract = "math"`` reads the final answer with
`verifiers.math_answer.extract_answer` and compares numbers as numbers; ``extract = "text"``
compares the whole answers with case and whitespace folded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from router import policy
from router.generation import Generation, GenerationRequest
from verifiers.base import Score, VerifierContext, VerifierCost, require_integers, require_numbers
from verifiers.math_answer import answers_agree, extract_answer

EXTRACTORS = ("math", "text")


def generation_cost(generations: Sequence[Generation], tier: str | None) -> VerifierCost:
    """The tokens and compute time of extra generations, attributed to ``tier``."""
    return VerifierCost(
        prompt_tokens=sum(g.prompt_tokens for g in generations),
        completion_tokens=sum(g.completion_tokens for g in generations),
        seconds=sum(policy.generation_seconds(g.busy_s, g.latency_s) for g in generations),
        tier=tier,
    )


@dataclass(frozen=True)
class SelfConsistencyVerifier:
    # bounds this verifier's own generations in serving; an eval run stretches it (evals.runner)
    deadline_params: ClassVar[tuple[str, ...]] = ("timeout_s",)
    uses_model: ClassVar[bool] = True  # scoring asks a tier's model for work (router.verification.uses_a_model)
    k: int = 3
    temperature: float = 0.7
    tier: str | None = None  # None: the tier being verified samples its own answers
    extract: str = "math"
    seed: int = 0  # sample i uses seed + i + 1: reproducible, and distinct from each other
    timeout_s: float = 120.0
    name: str = "self_consistency"
    ctx: VerifierContext = field(default_factory=lambda: VerifierContext(tier=""), repr=False, compare=False)

    def __post_init__(self) -> None:
        require_integers(self, "k")
        if not 1 <= self.k <= 64:
            raise ValueError("k must be between 1 and 64")
        require_numbers(self, "temperature", "timeout_s")
        if self.temperature < 0 or self.timeout_s <= 0:
            raise ValueError("temperature must be >= 0 and timeout_s > 0")
        require_integers(self, "seed")
        if self.extract not in EXTRACTORS:
            raise ValueError(f"extract must be one of {', '.join(EXTRACTORS)}, not {self.extract!r}")
        if self.tier is not None and (not isinstance(self.tier, str) or not self.tier):
            raise TypeError("tier must be a tier name")
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")

    def answer_of(self, text: str) -> str | None:
        if self.extract == "math":
            return extract_answer(text)
        folded = " ".join(text.lower().split())
        return folded or None

    def agree(self, a: str | None, b: str | None) -> bool:
        if self.extract == "math":
            return answers_agree(a, b)
        return a is not None and a == b

    def worst_cost(self, request: GenerationRequest) -> VerifierCost:
        """k samples of the request, each at most what the sampling tier may count for one choice
        and its whole `timeout_s` of compute (router.verification.worst_cost)."""
        backend = self.ctx.backends.get(self.tier) if self.tier else self.ctx.backend
        if backend is None:
            return VerifierCost()
        sample = request.with_(n=1)
        return VerifierCost(
            prompt_tokens=self.k * backend.prompt_token_limit(sample),
            completion_tokens=self.k * backend.completion_token_limit(sample),
            seconds=self.k * self.timeout_s,
            tier=self.tier or self.ctx.tier,
        )

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        tier = self.tier or self.ctx.tier
        backend = self.ctx.backends.get(self.tier) if self.tier else self.ctx.backend
        if backend is None:
            return Score(0.0, f"self_consistency: no backend for tier {tier!r}", {"tier": tier})
        answer = self.answer_of(candidate.text)
        if answer is None:
            return Score(0.0, "the candidate states no answer to compare", {"tier": tier})

        deadline = time.monotonic() + self.timeout_s
        requests = [
            request.with_(n=1, temperature=self.temperature, seed=self.seed + i + 1, deadline=deadline)
            for i in range(self.k)
        ]
        t0 = time.monotonic()
        outcomes = await asyncio.gather(*(backend.generate(r) for r in requests), return_exceptions=True)
        wall = time.monotonic() - t0
        samples = [o for o in outcomes if isinstance(o, Generation)]
        errors = [f"{type(o).__name__}: {o}"[:200] for o in outcomes if isinstance(o, BaseException)]
        for o in outcomes:
            if isinstance(o, BaseException) and not isinstance(o, Exception):
                raise o  # cancellation and the like are not a sample's failure
        cost = generation_cost(samples, tier)
        answers = [self.answer_of(s.text) for s in samples]
        details: dict[str, Any] = {
            "tier": tier,
            "answer": answer,
            "sample_answers": [a[:80] if a else a for a in answers],
            "wall_s": round(wall, 3),
        }
        if errors:
            # A sample that timed out or failed says nothing about the answer, and a fraction over
            # fewer than k samples is not the score the threshold was calibrated on (1 of 2 is not
            # 1 of 3): no verdict. The service abstains; an eval run stores nothing and retries.
            details["errors"] = errors
            return Score.unavailable(
                f"{len(errors)} of {self.k} samples failed: {errors[0]}", details=details, cost=cost
            )
        agreeing = sum(self.agree(answer, a) for a in answers)
        details["agree"] = agreeing
        value = agreeing / len(samples)
        reason = f"{agreeing}/{len(samples)} samples at T={self.temperature:g} agree with {answer[:60]!r}"
        return Score(value, reason, details, cost)


def make_self_consistency(params: dict[str, Any], ctx: VerifierContext) -> SelfConsistencyVerifier:
    if "ctx" in params:
        raise TypeError("unexpected param 'ctx'")
    return SelfConsistencyVerifier(**params, ctx=ctx)
