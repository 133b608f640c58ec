"""Figures that hold on any split and at any local price: every calibrated cascade again on many
random calibration/held-out splits, and as the local tiers' price per busy hour moves.

Why: a figure calibrated on one half of a suite and reported on the other depends on which items
fell where. On GSM8K the committed split (seed 0) put the small tier's saving in front of GPT-4 at
the 90th percentile of 200 random splits, and the figure hung on one assumed hourly price of the
local machine. So a headline is the median over `SPLITS` splits with the 2.5-97.5 percentile range
beside it, the policy and its thresholds chosen afresh on each calibration half, and again with
the local work priced at other multiples of today's price.

The same rule, not a copy of it: split s is `evals.calibrate.in_calibration` with seed s (seed 0
is the fixed split every other table of a report uses; the random ones are seeds 1 to `SPLITS`); on
each calibration half every verifier's candidate thresholds are `evals.calibrate.candidate_values`
of that half's scores, weighed through the decision rule's table form (`evals.sweep.weigh_settings`,
which is `router.policy.answering_tiers`) and chosen by `evals.calibrate.pick_setting`, the
function `eval calibrate` chooses with; the chosen thresholds decide the held-out half through the
same rule. Which verifier a split deploys is the caller's rule (`cheapest_met`, `best_auroc`),
applied to what each split's calibration half shows. On the fixed split the study chooses exactly
what `evals.calibrate.calibrate` chooses (tests/evals/test_splits.py holds them together).

Fast because nothing is weighed twice: each verifier's cascade becomes per-item arrays once
(`evals.sweep.cascade_arrays`: what each answering tier's route costs and whether it is right);
every setting any calibration half can offer (each distinct score, per tier) is weighed once on
all items and summed per half by one matrix product; a half then only picks its own candidates
among them (the sums are exact, so a half's figures are what weighing it alone gives). Prices:
every priced cost is linear in the local machine's hourly price (busy seconds times it, or tokens
times the rate it implies), so with the same items priced with the local tiers free, the cost at m
times today's price is free + m * (today - free), exactly; a split keeps the policy it chose at
today's price and only its cost moves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from evals import measures
from evals.calibrate import Target, candidate_values, goal, in_calibration, pick_setting, setting_grid
from evals.calibrate import _meets_arrays as meets_arrays
from evals.sweep import CascadeArrays, ResultTable, SettingOutcomes, cascade_arrays, weigh_settings
from router import policy

SPLITS = 200
RANGE = (2.5, 97.5)  # the percentiles a range spans: 95% of the splits
MULTIPLIERS = (1.0, 2.6, 5.0, 10.0)  # the local tiers' price per busy hour, as multiples of today's


@dataclass(frozen=True)
class Spread:
    """A figure over many splits: its median and the range 95% of the splits fall in."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: np.ndarray) -> Spread:
        med, lo, hi = np.percentile(np.asarray(values, dtype=float), [50.0, *RANGE])
        return cls(float(med), float(lo), float(hi))


_MASKS: dict[tuple[tuple[str, ...], int, float, int], np.ndarray] = {}


def split_masks(ids: Sequence[str], count: int = SPLITS, fraction: float = 0.5, first: int = 1) -> np.ndarray:
    """splits x items, True where the item is on the calibration side of the split seeded
    `first + s` (`evals.calibrate.in_calibration`: a hash of the seed and the item id)."""
    key = (tuple(ids), count, fraction, first)
    if key not in _MASKS:
        _MASKS[key] = np.array(
            [[in_calibration(i, seed, fraction) for i in ids] for seed in range(first, first + count)], dtype=bool
        ).reshape(count, len(ids))
    return _MASKS[key]


@dataclass(frozen=True)
class PricedCascade:
    """One verifier's cascade as arrays, each cost split into the local tiers' part and the rest:
    at m times the local price an item costs `arrays.cost + (m - 1) * local`."""

    verifier: str
    arrays: CascadeArrays
    local: np.ndarray  # items x answering tier: the local tiers' part of `arrays.cost`
    top_cost: np.ndarray  # items: the top tier alone (generation only, as `SingleTier` prices it)
    top_local: np.ndarray  # items: its local part (zero for a hosted top tier)
    # splits x items x deciding tiers: a score fit afresh on each split's calibration half (a
    # learned estimator), in place of `arrays.scores`; None: the same scores on every split
    split_scores: np.ndarray | None = None

    def cost_at(self, m: float) -> np.ndarray:
        return self.arrays.cost if m == 1.0 else self.arrays.cost + (m - 1.0) * self.local

    def top_cost_at(self, m: float) -> np.ndarray:
        return self.top_cost if m == 1.0 else self.top_cost + (m - 1.0) * self.top_local


def priced_cascades(table: ResultTable, local_free: ResultTable | None = None) -> list[PricedCascade]:
    """Every verifier of `table` as a `PricedCascade`. `local_free` is the same items priced with
    the local tiers' work free (None: nothing in the table is local work)."""
    if local_free is not None and [it.id for it in local_free.items] != [it.id for it in table.items]:
        raise ValueError(f"run {table.run}: the repriced table holds other items")
    top = table.top
    top_cost = np.array([it.tiers[top].cost_usd for it in table.items], dtype=float)
    top_free = top_cost if local_free is None else np.array([it.tiers[top].cost_usd for it in local_free.items])
    out = []
    for v in table.verifiers:
        arrays = cascade_arrays(table, v)
        free = arrays.cost if local_free is None else cascade_arrays(local_free, v).cost
        out.append(PricedCascade(v, arrays, arrays.cost - free, top_cost, top_cost - top_free))
    return out


TargetRule = Callable[[float, float], Target]  # (first tier's accuracy, top tier's) on a half -> the target


@dataclass(frozen=True)
class SplitOutcomes:
    """A calibrated cascade on every split: what its calibration half chose and what that did on the
    held-out half. Costs are per 1k requests at today's prices, each with its local part, so the
    same choice can be priced at any multiple of the local price (`saved_at`). `deployed[s]` names
    the verifier split s deployed ("" where none met the target on the calibration half and the
    rule fell back to the top tier alone)."""

    label: str
    met: np.ndarray  # splits: the target was met on the calibration half
    calibration_auroc: np.ndarray  # splits: AUROC of the first tier's scores on the calibration half (NaN: none)
    calibration_cost: np.ndarray  # splits: cost per 1k on the calibration half
    accuracy: np.ndarray  # splits: held-out accuracy
    top_accuracy: np.ndarray  # splits: the top tier alone, held out
    cost: np.ndarray  # splits: held-out cost per 1k
    cost_local: np.ndarray  # splits: its local part
    top_cost: np.ndarray  # splits: the top tier alone, held out
    top_cost_local: np.ndarray  # splits: its local part
    held_out_met: np.ndarray  # splits: the held-out accuracy meets the target as the held-out half states it
    answered: np.ndarray  # splits x tiers: the share of held-out items each tier answered
    deployed: tuple[str, ...]
    thresholds: tuple[tuple[float, ...], ...]  # per split, the deployed thresholds (empty when none)

    def saved_at(self, multiplier: float = 1.0) -> np.ndarray:
        """Per split, 1 - cost / the top tier's, held out, the local work priced at `multiplier`
        times today's price (the policy each split chose at today's)."""
        m = multiplier - 1.0
        return np.asarray(1.0 - (self.cost + m * self.cost_local) / (self.top_cost + m * self.top_cost_local))

    @property
    def saved(self) -> np.ndarray:
        return self.saved_at(1.0)

    @property
    def ratio(self) -> np.ndarray:
        out: np.ndarray = np.divide(
            self.accuracy, self.top_accuracy, out=np.zeros_like(self.accuracy), where=self.top_accuracy > 0
        )
        return out

    def saved_spread(self, multiplier: float = 1.0) -> Spread:
        return Spread.of(self.saved_at(multiplier))

    def ratio_spread(self) -> Spread:
        return Spread.of(self.ratio)

    @property
    def missed_share(self) -> float:
        """The share of splits whose held-out accuracy misses the target."""
        return float(np.mean(~self.held_out_met))

    @property
    def fallback_share(self) -> float:
        """The share of splits where no verifier met the target on the calibration half."""
        return float(np.mean([d == "" for d in self.deployed]))

    def answered_spread(self) -> list[Spread]:
        return [Spread.of(self.answered[:, t]) for t in range(self.answered.shape[1])]

    def most_deployed(self) -> list[tuple[str, float]]:
        """The verifiers the splits deployed, most often first, with the share of splits."""
        counts: dict[str, int] = {}
        for d in self.deployed:
            counts[d] = counts.get(d, 0) + 1
        return [(n, c / len(self.deployed)) for n, c in sorted(counts.items(), key=lambda x: (-x[1], x[0]))]

    def break_even(self, high: float = 1000.0) -> float | None:
        """The multiple of today's local price at which the median held-out saving falls to zero,
        each split keeping the policy it chose at today's price; None when the median saves nothing
        at today's price; `high` when it still saves there. Each split's saving falls as the local
        price rises (its cost grows by its local part, never less than the top tier alone's, which
        is zero for a hosted top tier), so the median does too and bisection finds it."""
        if float(np.median(self.saved)) <= 0:
            return None
        if float(np.median(self.saved_at(high))) > 0:
            return high
        lo, hi = 1.0, high
        for _ in range(60):
            mid = float(np.sqrt(lo * hi))
            if float(np.median(self.saved_at(mid))) > 0:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2


def _c1k(costs: np.ndarray) -> float:
    return measures.cost_per_1k(np.asarray(costs, dtype=float).tolist())


UNIVERSE = 1 << 23  # settings x items weighed at once on every half, at most; beyond, each half its own


def _universe(cascade: PricedCascade, masks: np.ndarray) -> tuple[list[np.ndarray], list[SettingOutcomes] | None]:
    """Every value any calibration half can offer as a threshold, per tier (each distinct score of
    every item, with 0 and 1), and every combination of them weighed on each split's calibration
    half in one pass (`weigh_settings`); None where scores change per split or the combinations
    are too many (then each half weighs its own candidates)."""
    a = cascade.arrays
    if cascade.split_scores is not None:
        return [], None
    universe = [candidate_values(a.scores[:, t], len(a.scores) + 2) for t in range(a.scores.shape[1])]
    if math.prod(len(u) for u in universe) * len(a.scores) > UNIVERSE:
        return universe, None
    return universe, weigh_settings(a, setting_grid(universe), masks)


def calibrate_splits(
    cascade: PricedCascade,
    masks: np.ndarray,
    targets: Sequence[TargetRule],
    *,
    max_points: int | None = None,
    auroc: bool = False,
) -> list[SplitOutcomes]:
    """`cascade` calibrated on each split's calibration half (`masks`: splits x items) for each
    target (each rule sets it from that half's first- and top-tier accuracy), evaluated on its
    held-out half: one `SplitOutcomes` per target. Each half's candidate settings are weighed once
    for all targets. `auroc`: also the first tier's AUROC on each calibration half (`best_auroc`
    deploys by it)."""
    from evals.calibrate import MAX_POINTS

    points = MAX_POINTS if max_points is None else max_points
    if cascade.split_scores is not None and len(cascade.split_scores) != len(masks):
        raise ValueError(f"{cascade.verifier}: scores for {len(cascade.split_scores)} splits, {len(masks)} asked")
    tiers = cascade.arrays.right.shape[1]
    last = tiers - 1
    fields = [f for f in SplitOutcomes.__dataclass_fields__ if f not in ("label", "deployed")]
    out: list[dict[str, list[object]]] = [{f: [] for f in fields} for _ in targets]
    universe, weighed_all = _universe(cascade, masks)
    for s, mask in enumerate(masks):
        a = cascade.arrays
        if cascade.split_scores is not None:
            a = replace(a, scores=cascade.split_scores[s])
        cal, held = np.flatnonzero(mask), np.flatnonzero(~mask)
        area = math.nan
        if auroc:
            first = a.scores[cal, 0] if last else np.full(len(cal), math.nan)
            scored = ~np.isnan(first)
            got = measures.auroc(a.right[cal, 0][scored], first[scored]) if scored.any() else None
            area = math.nan if got is None else got
        first_cal, top_cal = float(a.right[cal, 0].mean()), float(a.right[cal, last].mean())
        first_held, top_held = float(a.right[held, 0].mean()), float(a.right[held, last].mean())
        grids = [candidate_values(a.scores[cal, t], points) for t in range(last)]
        settings = setting_grid(grids)
        if weighed_all is None:  # this half's candidates alone, on this half
            weighed = weigh_settings(a, settings, mask[np.newaxis, :])[0]
        else:  # this half's candidates among every setting any half offers, weighed once on all halves
            where = np.meshgrid(*(np.searchsorted(u, g) for u, g in zip(universe, grids, strict=True)), indexing="ij")
            pick = np.ravel_multi_index([w.reshape(-1) for w in where], [len(u) for u in universe])
            every = weighed_all[s]
            weighed = SettingOutcomes(every.accuracy[pick], every.cost_per_1k[pick], every.escalation[pick])
        top_c1k = _c1k(cascade.top_cost[held])
        top_local = _c1k(cascade.top_local[held])
        for rule, row in zip(targets, out, strict=True):
            target = rule(first_cal, top_cal)
            index, met = pick_setting(
                weighed.accuracy,
                weighed.cost_per_1k,
                weighed.escalation,
                settings,
                target,
                goal(target, first_cal, top_cal),
            )
            ths = settings[index]
            answered = policy.answering_tiers(a.scores[held], ths)
            picked = np.choose(answered, a.right[held].T)
            acc = float(picked.mean())
            c1k = _c1k(np.choose(answered, a.cost[held].T))
            esc = float(np.count_nonzero(answered)) / len(held)
            held_goal = goal(rule(first_held, top_held), first_held, top_held)
            row["met"].append(met)
            row["calibration_auroc"].append(area)
            row["calibration_cost"].append(float(weighed.cost_per_1k[index]))
            row["accuracy"].append(acc)
            row["top_accuracy"].append(top_held)
            row["cost"].append(c1k)
            row["cost_local"].append(_c1k(np.choose(answered, cascade.local[held].T)))
            row["top_cost"].append(top_c1k)
            row["top_cost_local"].append(top_local)
            ok = meets_arrays(np.array([acc]), np.array([c1k]), np.array([esc]), rule(first_held, top_held), held_goal)
            row["held_out_met"].append(bool(ok[0]))
            row["answered"].append(np.bincount(answered, minlength=tiers) / len(held))
            row["thresholds"].append(tuple(float(x) for x in ths))
    count = len(masks)
    return [
        SplitOutcomes(
            label=cascade.verifier,
            met=np.array(row["met"], dtype=bool),
            calibration_auroc=np.array(row["calibration_auroc"], dtype=float),
            calibration_cost=np.array(row["calibration_cost"], dtype=float),
            accuracy=np.array(row["accuracy"], dtype=float),
            top_accuracy=np.array(row["top_accuracy"], dtype=float),
            cost=np.array(row["cost"], dtype=float),
            cost_local=np.array(row["cost_local"], dtype=float),
            top_cost=np.array(row["top_cost"], dtype=float),
            top_cost_local=np.array(row["top_cost_local"], dtype=float),
            held_out_met=np.array(row["held_out_met"], dtype=bool),
            answered=np.array(row["answered"], dtype=float).reshape(count, tiers),
            deployed=(cascade.verifier,) * count,
            thresholds=tuple(row["thresholds"]),  # type: ignore[arg-type]
        )
        for row in out
    ]


# ---- which verifier a split deploys ----------------------------------------------------------------------

Rule = Callable[[Sequence[SplitOutcomes], int], int | None]  # (each verifier's outcomes, split) -> which, or None


def cheapest_met(per_verifier: Sequence[SplitOutcomes], s: int) -> int | None:
    """The frontier report's rule: among the verifiers that met the target on split s's calibration
    half, the cheapest there (then the first name); None when none met it."""
    pool = [(o.calibration_cost[s], o.label, i) for i, o in enumerate(per_verifier) if o.met[s]]
    return min(pool)[2] if pool else None


def best_auroc(per_verifier: Sequence[SplitOutcomes], s: int) -> int | None:
    """The eval report's rule: the verifier whose first-tier scores rank the answers best on split
    s's calibration half (ties to `config`, then the first listed), deployed whether or not it met
    the target there (`evals.report.suite.build` picks its best so)."""
    from evals.sweep import CONFIG

    ranked = [
        (-1.0 if math.isnan(o.calibration_auroc[s]) else float(o.calibration_auroc[s]), o.label == CONFIG, -i)
        for i, o in enumerate(per_verifier)
    ]
    return -max(ranked)[2] if ranked else None


def deploy(per_verifier: Sequence[SplitOutcomes], rule: Rule, label: str) -> SplitOutcomes:
    """Split by split, the outcome of the verifier `rule` picks from what the calibration half
    shows; where it picks none, the top tier alone (nothing saved, its accuracy)."""
    first = per_verifier[0]
    count, tiers = first.answered.shape
    picks = [rule(per_verifier, s) for s in range(count)]

    def column(name: str, fallback: np.ndarray) -> np.ndarray:
        return np.array([fallback[s] if p is None else getattr(per_verifier[p], name)[s] for s, p in enumerate(picks)])

    top_only = np.zeros(tiers)
    top_only[-1] = 1.0
    return SplitOutcomes(
        label=label,
        met=np.array([p is not None and bool(per_verifier[p].met[s]) for s, p in enumerate(picks)], dtype=bool),
        calibration_auroc=column("calibration_auroc", np.full(count, np.nan)),
        calibration_cost=column("calibration_cost", np.full(count, np.nan)),
        accuracy=column("accuracy", first.top_accuracy),
        top_accuracy=first.top_accuracy,
        cost=column("cost", first.top_cost),
        cost_local=column("cost_local", first.top_cost_local),
        top_cost=first.top_cost,
        top_cost_local=first.top_cost_local,
        held_out_met=column("held_out_met", np.ones(count, dtype=bool)).astype(bool),
        answered=np.array([top_only if p is None else per_verifier[p].answered[s] for s, p in enumerate(picks)]),
        deployed=tuple("" if p is None else per_verifier[p].label for p in picks),
        thresholds=tuple(() if p is None else per_verifier[p].thresholds[s] for s, p in enumerate(picks)),
    )


def study(
    cascades: Sequence[PricedCascade],
    masks: np.ndarray,
    targets: Sequence[TargetRule],
    rule: Rule,
    *,
    label: str = "policy",
    max_points: int | None = None,
) -> list[tuple[list[SplitOutcomes], SplitOutcomes]]:
    """Every verifier calibrated on every split for every target, and per target what `rule`
    deploys split by split: per target, (each verifier's outcomes, the deployed policy's)."""
    need = rule is best_auroc
    each = [calibrate_splits(c, masks, targets, max_points=max_points, auroc=need) for c in cascades]
    return [([e[k] for e in each], deploy([e[k] for e in each], rule, label)) for k in range(len(targets))]


# ---- the fixed split's own interval ----------------------------------------------------------------------

BOOTSTRAP = 1000


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def bootstrap(
    cost: np.ndarray, right: np.ndarray, top_cost: np.ndarray, top_right: np.ndarray, seed: int = 0
) -> tuple[float, Interval, float, Interval]:
    """Accuracy relative to the top tier and the share of its cost saved, on these items (one
    split's held-out half), with 95% percentile intervals over `BOOTSTRAP` resamples of them (the
    same resamples for both): the interval of one split, which a spread over splits stands beside."""
    n = len(cost)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(BOOTSTRAP, n))
    top_acc = top_right[idx].mean(axis=1)
    ratios = np.divide(right[idx].mean(axis=1), top_acc, out=np.zeros(BOOTSTRAP), where=top_acc > 0)
    saved = 1.0 - cost[idx].sum(axis=1) / top_cost[idx].sum(axis=1)

    def ci(x: np.ndarray) -> Interval:
        lo, hi = np.percentile(x, [2.5, 97.5])
        return Interval(float(lo), float(hi))

    ratio = float(right.mean() / top_right.mean()) if top_right.mean() > 0 else 0.0
    return ratio, ci(ratios), float(1.0 - cost.sum() / top_cost.sum()), ci(saved)
