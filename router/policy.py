"""The cascade's decision rule, in one place: how a tier's verifier scores combine, when a tier
accepts its answer, when a pre-router skips a tier, and how the work of generating and verifying
is priced.

Which verifiers and threshold judge a request is chosen by its task (`router.tasks`): a tier's
policy for that task (`tiers[].tasks.<task>`), each field it leaves unset falling back to the
tier's own (`task_policy`). The service builds every tier's policies once from this function;
the eval runner records the policy of its suite's task with each run, so the replay and the
simulator judge a suite's items as the service judges requests of that task.

The live cascade (`router.cascade`) and every offline simulation (`evals.sweep` and what builds on
it: calibration, the estimators' policies, the reports) call these functions and nothing else, so a
threshold calibrated offline means in the service exactly what it meant in the simulator. A replay
test (tests/evals/test_parity.py) holds the two together on the committed eval runs.

Prices (what used to be `router.policy`): token-priced tiers (hosted APIs) cost input and output
tokens; time-priced tiers (self-hosted hardware) cost their hourly price times the measured busy
time of the work, and where a backend cannot measure busy time (a remote server), wall latency
stands in for it (`cost_usd`, `generation_cost`, `verification_cost`; `describe` says it in words).

A verifier may abstain (its score is None: "does not apply to this answer"). The combination
ignores abstentions; when every verifier abstains there is no evidence either way, the combined
score is None, and the tier does not accept (the answer goes up, or, on the last tier, is returned
unverified as any last-tier answer is). A tier with no verifiers at all accepts (score 1.0).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from router.config import PriceSettings, TierSettings, VerifierSpec

Combine = Literal["mean", "min"]
V = TypeVar("V")
W = TypeVar("W")


@dataclass(frozen=True)
class TaskPolicy(Generic[V]):
    """The verifiers, combination and threshold that judge one task's answers at one tier: as
    configured (`verifiers` the specs, `task_policy`), or as the service runs it (`built`: the
    verifiers made, a `router.verification.VerifierSet`). One type for both, so the policy a
    simulation reads and the one the cascade applies cannot differ in anything but the made
    verifiers."""

    verifiers: V
    combine: Combine
    threshold: float
    task: str | None  # the task whose own policy this is; None: the tier's own settings

    def built(self, verifiers: W) -> TaskPolicy[W]:
        """The same policy with its verifiers made."""
        return TaskPolicy(verifiers, self.combine, self.threshold, self.task)


def task_policy(tier: TierSettings, task: str | None) -> TaskPolicy[tuple[VerifierSpec, ...]]:
    """The tier's policy for `task`: its `tasks.<task>` entry, each unset field the tier's own;
    the tier's own settings for a task without an entry (or no task)."""
    own = tier.tasks.get(task) if task is not None else None  # type: ignore[call-overload]
    if own is None:
        return TaskPolicy(tuple(tier.verifiers), tier.combine, tier.threshold, None)
    return TaskPolicy(
        tuple(tier.verifiers if own.verifiers is None else own.verifiers),
        tier.combine if own.combine is None else own.combine,
        tier.threshold if own.threshold is None else own.threshold,
        task,
    )


def combine(members: Sequence[tuple[float | None, float]], how: str = "mean") -> float | None:
    """One score from `(score, weight)` pairs: the weighted mean or the minimum of the scores that
    did not abstain, clamped to [0, 1]; 1.0 when there are no members, None when all abstain."""
    if how not in ("mean", "min"):
        raise ValueError(f"combine must be 'mean' or 'min', not {how!r}")
    if not members:
        return 1.0
    present = [(s, w) for s, w in members if s is not None]
    if not present:
        return None
    if how == "min":
        combined = min(s for s, _ in present)
    else:
        total = math.fsum(w for _, w in present)
        combined = math.fsum(w * s for s, w in present) / total
    return min(1.0, max(0.0, combined))


def accepts(score: float | None, threshold: float) -> bool:
    """A tier accepts its answer when the combined score reaches its threshold."""
    return score is not None and score >= threshold


Decision = Literal["accept", "last", "escalate"]


def decide(score: float | None, threshold: float, *, last: bool) -> Decision:
    """One tier's step in the cascade, given its answer's combined score: `accept` when the score
    reaches the threshold; else `last` when the tier is the last (its answer stands, unverified:
    the last tier is never skipped and never escalates); else `escalate` to the next tier. The live
    cascade and the offline policies (`evals.sweep`) walk the tiers by this step alone."""
    if accepts(score, threshold):
        return "accept"
    return "last" if last else "escalate"


def skipped(probability: float | None, threshold: float, *, last: bool) -> bool:
    """Whether a pre-router skips its tier before it generates: its probability is below the
    threshold, and the tier is not the last (the last tier always runs). No probability: not skipped."""
    return not last and probability is not None and skips(probability, threshold)


def answering_tiers(scores: Any, thresholds: Any) -> Any:
    """`accepts` over many items at once: `scores` is an items x tiers array of the combined scores
    of every tier but the last (NaN where the score is None, which accepts nothing, as above); the
    answer is each item's answering tier, the first that accepts, else the last (`len(thresholds)`),
    whose answer stands unverified. For offline sweeps over whole tables (`evals.sweep`).

    `thresholds` is one setting (one threshold per tier but the last) or a settings x tiers array
    of many; with many, the answer is settings x items, row s the answering tiers at setting s
    (how a calibration weighs every candidate setting on the same items at once)."""
    import numpy as np

    table = np.asarray(scores, dtype=float)
    ths = np.asarray(thresholds, dtype=float)
    if ths.ndim not in (1, 2):
        raise ValueError(f"thresholds of shape {ths.shape}: one setting, or settings x tiers")
    last = ths.shape[-1]
    if table.ndim != 2 or table.shape[1] != last:
        raise ValueError(f"{last} thresholds for scores of shape {table.shape}: one per tier but the last")
    if last == 0:
        return np.zeros(ths.shape[:-1] + (len(table),), dtype=int)
    # NaN >= x is False: an abstention accepts nothing
    accepted = table >= ths if ths.ndim == 1 else table[np.newaxis, :, :] >= ths[:, np.newaxis, :]
    if last == 1:  # the common two-tier cascade, without the search for a first acceptance
        return np.where(accepted[..., 0], 0, 1)
    return np.where(accepted.any(axis=-1), accepted.argmax(axis=-1), last)


def skips(probability: float, threshold: float) -> bool:
    """A pre-router skips its tier when the predicted probability of a right answer is below its
    threshold."""
    return probability < threshold


def generation_seconds(busy_s: float | None, latency_s: float) -> float:
    """The compute time a time-priced tier is charged for: the measured busy time where the backend
    measures it, else the wall latency."""
    return busy_s if busy_s is not None else latency_s


def generation_cost(
    price: PriceSettings, prompt_tokens: int, completion_tokens: int, busy_s: float | None, latency_s: float
) -> float:
    """What generating one answer cost on a tier with this price."""
    return cost_usd(price, Usage(prompt_tokens, completion_tokens, generation_seconds(busy_s, latency_s)))


def verification_cost(parts: Iterable[tuple[PriceSettings, Usage]]) -> float:
    """What a tier's verifying cost: each verifier's extra work priced at the tier that did it
    (a `self_consistency` on the tier itself, a `judge` on another tier), summed."""
    return math.fsum(cost_usd(price, usage) for price, usage in parts)


def request_cost(work: Iterable[float]) -> float:
    """What one request cost: every tier's generation and every verifier's work it paid for, summed
    exactly (`math.fsum`, so the live cascade's total and a simulation's of the same work agree to
    the last digit whatever order each adds them in)."""
    return math.fsum(work)


# ---- prices ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    seconds: float


def cost_usd(price: PriceSettings, usage: Usage) -> float:
    if price.usd_per_hour is not None:
        return price.usd_per_hour * max(0.0, usage.seconds) / 3600.0
    assert price.usd_per_1m_input_tokens is not None and price.usd_per_1m_output_tokens is not None
    return (
        usage.prompt_tokens * price.usd_per_1m_input_tokens + usage.completion_tokens * price.usd_per_1m_output_tokens
    ) / 1_000_000


def describe(price: PriceSettings) -> str:
    if price.usd_per_hour is not None:
        basis = f"${price.usd_per_hour:g}/hour of measured busy time"
    else:
        basis = f"${price.usd_per_1m_input_tokens:g} / ${price.usd_per_1m_output_tokens:g} per 1M input / output tokens"
    return f"{basis} ({price.stands_for})" if price.stands_for else basis
