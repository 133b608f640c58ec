"""How sure the model was of its own answer, from the logprobs of the tokens it sampled.

Every statistic is length-normalised and mapped to a probability in [0, 1]:

- ``mean`` (default) and its alias ``geomean_prob``: exp(mean logprob), the geometric mean of the
  token probabilities, the per-token perplexity turned into a probability;
- ``mean_prob``: the arithmetic mean of the token probabilities (kinder to a few unlikely tokens);
- ``min``: the probability of the least likely token, the weakest link;
- ``quantile``: exp of the ``q``-quantile of the logprobs (q=0.1 reads "90% of the tokens were at
  least this likely"), a min that one stray token cannot sink.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.generation import Generation, GenerationRequest
from verifiers.base import Score, VerifierContext, require_numbers

_FLOOR = -1000.0
STATS = ("mean", "geomean_prob", "mean_prob", "min", "quantile")


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of ``values`` by linear interpolation between order statistics."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    frac = pos - lo
    if frac == 0.0 or ordered[lo] == ordered[hi]:
        return ordered[lo]
    return ordered[lo] * (1.0 - frac) + ordered[hi] * frac


@dataclass(frozen=True)
class ConfidenceVerifier:
    stat: str = "mean"
    q: float = 0.1
    missing: float = 0.0  # the score when the backend gave no logprobs
    name: str = "confidence"

    def __post_init__(self) -> None:
        if self.stat not in STATS:
            raise ValueError(f"stat must be one of {', '.join(STATS)}, not {self.stat!r}")
        require_numbers(self, "q", "missing")
        for key in ("q", "missing"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"{key} must be in [0, 1]")
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        if candidate.token_logprobs is None:
            return Score(float(self.missing), "no logprobs: the backend did not return them", {"n": 0})
        # NaN carries no information; a logprob above 0 is rounding noise around probability 1;
        # -inf (probability 0) is floored so the details stay finite, JSON-safe numbers
        lps = [max(_FLOOR, min(0.0, lp)) for lp in candidate.token_logprobs if not math.isnan(lp)]
        if not lps:
            return Score(float(self.missing), "no logprobs: the answer has no tokens", {"n": 0})
        mean = math.fsum(lps) / len(lps)
        stats: dict[str, Any] = {
            "n": len(lps),
            "mean": mean,
            "min": min(lps),
            "p10": quantile(lps, 0.1),
            "mean_prob": math.fsum(math.exp(lp) for lp in lps) / len(lps),
        }
        if self.stat in ("mean", "geomean_prob"):
            value, what = math.exp(mean), "geometric-mean token probability"
        elif self.stat == "mean_prob":
            value, what = stats["mean_prob"], "mean token probability"
        elif self.stat == "min":
            value, what = math.exp(stats["min"]), "least likely token's probability"
        else:
            stats[f"q{self.q:g}"] = quantile(lps, self.q)
            value, what = math.exp(stats[f"q{self.q:g}"]), f"{self.q:g}-quantile token probability"
        value = min(1.0, max(0.0, value))
        return Score(value, f"{what} {value:.3f} over {len(lps)} tokens", stats)


def make_confidence(params: dict[str, Any], ctx: VerifierContext) -> ConfidenceVerifier:
    return ConfidenceVerifier(**params)
