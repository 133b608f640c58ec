"""Cross-tier scoring: another tier reads the candidate answer in one prefill and says how likely
it found each token.

This is the verification pass of speculative decoding turned into a quality signal: the scoring
tier (usually the next, larger one) sees the request and the candidate as if it had begun writing
the candidate itself, and reports, per candidate token, its logprob and whether it was its own top
choice (`Backend.score_continuation`). No token is generated, so the work is priced as that tier's
input tokens only: the prompt and the candidate, prefilled.

Statistics (``stat``, each in [0, 1]; all of them are in the score's details, as features for the
learned estimator):

- ``mean`` (default): exp(mean logprob), the geometric mean of the token probabilities;
- ``min``: the probability of the least likely token;
- ``q10`` / ``q25``: exp of the 10% / 25% quantile of the logprobs, a min one stray token cannot sink;
- ``top1_share``: the share of tokens that were the scorer's own argmax (speculative decoding's
  acceptance rate under greedy verification).

When the scoring tier is local and the answer is rejected and escalates there, the same prefill
serves the escalation: the tier's answer starts with the candidate's tokens it found to be its own
top choice, without reading them again (`router.backends.llama.backend`; greedy requests).

The verifier abstains, with the reason, when it cannot speak: an empty candidate, a tier that is not
configured or cannot score, a scoring failure or deadline. An abstention is not a reject: the tier's
other verifiers decide. A candidate longer than ``max_chars`` is scored on its first ``max_chars``
characters (tokens are read in order, so a head is a fair reading) and says so in its details.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from router.backends.base import ScoringUnsupportedError
from router.generation import Generation, GenerationRequest
from verifiers.base import Score, VerifierContext, VerifierCost
from verifiers.confidence import quantile

STATS = ("mean", "min", "q10", "q25", "top1_share")


def continuation_stats(logprobs: Sequence[float], top1: Sequence[bool]) -> dict[str, float]:
    """Every statistic of a scored continuation, each in [0, 1]."""
    if not logprobs:
        raise ValueError("no tokens to summarise")
    return {
        "mean": math.exp(sum(logprobs) / len(logprobs)),
        "min": math.exp(min(logprobs)),
        "q10": math.exp(quantile(logprobs, 0.10)),
        "q25": math.exp(quantile(logprobs, 0.25)),
        "top1_share": sum(1 for t in top1 if t) / len(top1),
    }


@dataclass(frozen=True)
class CrossTierVerifier:
    # bounds this verifier's own generations in serving; an eval run stretches it (evals.runner)
    deadline_params: ClassVar[tuple[str, ...]] = ("timeout_s",)
    uses_model: ClassVar[bool] = True  # scoring asks a tier's model for work (router.verification.uses_a_model)
    tier: str
    stat: str = "mean"
    max_chars: int = 8000
    timeout_s: float = 60.0
    name: str = "cross_tier"
    ctx: VerifierContext = field(default_factory=lambda: VerifierContext(tier=""), repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tier, str) or not self.tier:
            raise TypeError("tier must be the name of the scoring tier")
        if self.stat not in STATS:
            raise ValueError(f"stat must be one of {', '.join(STATS)}")
        if isinstance(self.max_chars, bool) or not isinstance(self.max_chars, int) or self.max_chars < 1:
            raise ValueError("max_chars must be a positive integer")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int | float) or not self.timeout_s > 0:
            raise ValueError("timeout_s must be a positive number")
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")

    def worst_cost(self, request: GenerationRequest) -> VerifierCost:
        """One prefill of the request and `max_chars` characters of answer (four UTF-8 bytes each)
        at the scoring tier's prompt limit, for its whole `timeout_s`; nothing generated."""
        backend = self.ctx.backends.get(self.tier)
        if backend is None or self.ctx.tier == self.tier:
            return VerifierCost()
        return VerifierCost(
            prompt_tokens=backend.prompt_token_limit(request) + 4 * self.max_chars,
            seconds=self.timeout_s,
            tier=self.tier,
        )

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        details: dict[str, Any] = {"tier": self.tier}
        text = candidate.text
        if not text.strip():
            return Score.abstain("empty answer: nothing to score", details=details)
        if self.ctx.tier == self.tier:
            # a model reading its own answer learns nothing a `confidence` verifier would not say,
            # and the prefill would be paid for nothing (an eval scores every verifier on every tier)
            return Score.abstain(f"the answer is tier {self.tier!r}'s own", details=details)
        backend = self.ctx.backends.get(self.tier)
        if backend is None:
            known = ", ".join(sorted(self.ctx.backends)) or "none"
            return Score.abstain(f"scoring tier {self.tier!r} is not configured (tiers: {known})", details=details)
        if len(text) > self.max_chars:
            text = text[: self.max_chars]
            details["clipped_to_chars"] = self.max_chars
        deadline = time.monotonic() + self.timeout_s
        if request.deadline is not None:
            deadline = min(deadline, request.deadline)
        started = time.monotonic()
        try:
            scored = await backend.score_continuation(request.with_(deadline=deadline), text)
        except ScoringUnsupportedError as exc:  # a tier that never can: abstains for good
            return Score.abstain(
                f"tier {self.tier!r} could not score: {type(exc).__name__}: {exc}"[:300], details=details
            )
        except Exception as exc:  # noqa: BLE001 - a scorer that cannot speak now abstains, with its reason
            return Score.unavailable(
                f"tier {self.tier!r} could not score: {type(exc).__name__}: {exc}"[:300], details=details
            )
        if not scored.token_logprobs:
            return Score.abstain(f"tier {self.tier!r} scored no tokens", details=details)
        stats = continuation_stats(scored.token_logprobs, scored.top1)
        details.update(stats)
        details.update(tokens=scored.continuation_tokens, prompt_tokens=scored.prompt_tokens)
        cost = VerifierCost(
            prompt_tokens=scored.prompt_tokens,
            seconds=scored.seconds if scored.seconds > 0 else time.monotonic() - started,
            tier=self.tier,
        )
        value = min(1.0, max(0.0, stats[self.stat]))
        reason = (
            f"tier {self.tier!r} reads the answer at {self.stat} {value:.3f} over {scored.continuation_tokens} tokens"
        )
        return Score(value, reason, details, cost)


def make_cross_tier(params: dict[str, Any], ctx: VerifierContext) -> CrossTierVerifier:
    if "ctx" in params:
        raise TypeError("unexpected param 'ctx'")
    return CrossTierVerifier(**params, ctx=ctx)
