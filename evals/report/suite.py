"""One suite's report as numbers: each tier's row, every verifier's summary, the baselines, the
calibrated cascades and the break-even analysis, computed once from a run's table.

Everything a report shows is decided here; `tables`, `figures` and `pages` only format it, so the
Markdown, the HTML, the CSV and the figures cannot disagree about a number.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from evals import measures, splits
from evals.breakeven import BreakEvenReport, analyse
from evals.calibrate import MAX_POINTS, Calibration, Target, calibrate, in_calibration, split
from evals.learned_comparison import Comparison
from evals.sweep import (
    CONFIG,
    CascadePolicy,
    PolicyResult,
    ResultTable,
    VerifierSummary,
    baselines,
    evaluate,
    summarize,
)
from router import policy
from router.config import PriceSettings

DEFAULT_TARGET = Target("min-pgr", 0.8)


@dataclass
class TierRow:
    name: str
    model: str
    price_text: str
    accuracy: float
    prompt_tokens: float
    completion_tokens: float
    latency_p50: float | None
    latency_p95: float | None
    busy_s: float
    cost_per_1k: float


FINER = 4  # the grid check: this many times as many candidate thresholds per tier


@dataclass(frozen=True)
class FixedInterval:
    """One verifier's calibrated cascade on the fixed split's held-out half, with its bootstrap
    interval (`evals.splits.bootstrap`)."""

    verifier: str
    saved: float
    saved_ci: splits.Interval


@dataclass(frozen=True)
class SplitsReport:
    """The calibrated cascades over random splits (`evals.splits`): each verifier calibrated on
    every calibration half for the report's target, and the policy the report's rule deploys (the
    verifier with the best AUROC on that half), with the same on a finer threshold grid."""

    n_splits: int
    per_verifier: list[splits.SplitOutcomes]
    deployed: splits.SplitOutcomes
    finer: splits.SplitOutcomes
    fixed: dict[str, FixedInterval]  # verifier -> the fixed split's figure and interval
    left_out: list[str]  # verifiers not studied, and why
    local_tiers: list[str]  # the tiers priced per busy hour, whose price the sensitivity moves

    @property
    def break_even(self) -> float | None:
        return self.deployed.break_even()


@dataclass
class SuiteReport:
    table: ResultTable
    tiers: list[TierRow]
    verifiers: list[VerifierSummary]
    baselines: dict[str, list[PolicyResult]]
    configured: PolicyResult | None  # the cascade at the thresholds in the run's config
    calibrations: list[Calibration]
    best: str | None  # the verifier with the best AUROC on the calibration split
    best_auroc_calibration: float | None
    best_auroc_held_out: float | None
    target: Target
    notes: list[str] = field(default_factory=list)
    learned: Comparison | None = None  # when the learned estimators are attached
    breakeven: BreakEvenReport | None = None  # when built with the top tier's price zeroed too
    splits: SplitsReport | None = None  # when built with the local tiers' price zeroed too

    @property
    def best_calibration(self) -> Calibration | None:
        return next((c for c in self.calibrations if c.verifier == self.best), None)


def build(
    table: ResultTable,
    target: Target = DEFAULT_TARGET,
    *,
    seed: int = 0,
    fraction: float = 0.5,
    top_free: ResultTable | None = None,
    local_free: ResultTable | None = None,
    n_splits: int = splits.SPLITS,
) -> SuiteReport:
    """The report of one run. `top_free` is the same run loaded with the top tier's price at zero
    (`evals.breakeven.scaled_top_prices(table, 0)`): given, the report has the break-even price
    ratios, which need each cost split into the top tier's part and the rest. `local_free` is the
    same run with the tiers priced per busy hour free (`local_prices(table, 0)`): given, the report
    has the calibrated cascades over `n_splits` random splits and their price sensitivity."""
    if not table.items:
        raise ValueError(f"run {table.run}: no complete items")
    rows = []
    for i, t in enumerate(table.tiers):
        outs = [it.tiers[i] for it in table.items]
        n = len(outs)
        rows.append(
            TierRow(
                name=t.name,
                model=t.model,
                price_text=t.price_text,
                accuracy=sum(o.correct for o in outs) / n,
                prompt_tokens=sum(o.prompt_tokens for o in outs) / n,
                completion_tokens=sum(o.completion_tokens for o in outs) / n,
                latency_p50=measures.percentile([o.latency_s for o in outs], 50),
                latency_p95=measures.percentile([o.latency_s for o in outs], 95),
                busy_s=sum(o.busy_s for o in outs) / n,
                cost_per_1k=measures.cost_per_1k([o.cost_usd for o in outs]),
            )
        )
    summaries = [summarize(table, v) for v in table.verifiers]
    notes = []
    if table.incomplete:
        notes.append(f"{len(table.incomplete)} item(s) lack some tier's output or grade and are left out.")
    configured = None
    if CONFIG in table.verifiers and len(table.tiers) > 1:
        ths = tuple(t.threshold for t in table.tiers[:-1])
        configured = evaluate(CascadePolicy(CONFIG, ths), table, ths[0])
    calibrations: list[Calibration] = []
    best = best_cal = best_held = None
    if len(table.tiers) > 1 and table.verifiers:
        try:
            calib, held = split(table, seed, fraction)
        except Exception as exc:  # too few items to split: say so, report the rest
            notes.append(f"No calibration: {exc}")
        else:
            calibrations = [calibrate(table, v, target, seed=seed, fraction=fraction) for v in table.verifiers]
            ranked = []
            for v in table.verifiers:
                a = summarize(calib, v, curve=[]).auroc[0] if calib.items else None
                ranked.append((a if a is not None else -1.0, v))
            score, best = max(ranked, key=lambda x: (x[0], x[1] == CONFIG))
            best_cal = score if score >= 0 else None
            best_held = summarize(held, best, curve=[]).auroc[0]
    breakeven = None
    if len(table.tiers) < 2 or top_free is not None:
        breakeven = analyse(table, top_free or table, calibrations)
    studied = None
    if local_free is not None and calibrations:
        masks = splits.split_masks([it.id for it in table.items], n_splits, fraction, first=seed + 1)
        if masks.any(axis=1).all() and (~masks).any(axis=1).all():
            studied = study_splits(
                table, local_free, target, calibrations, seed=seed, fraction=fraction, n_splits=n_splits
            )
        else:
            notes.append(
                f"No random splits: {len(table.items)} items leave one side of some of {n_splits} splits empty."
            )
    return SuiteReport(
        table=table,
        tiers=rows,
        verifiers=summaries,
        baselines=baselines(table),
        configured=configured,
        calibrations=calibrations,
        best=best,
        best_auroc_calibration=best_cal,
        best_auroc_held_out=best_held,
        target=target,
        notes=notes,
        breakeven=breakeven,
        splits=studied,
    )


def local_prices(table: ResultTable, s: float) -> dict[str, PriceSettings]:
    """Every tier's price as `table` priced it, the tiers priced per busy hour (the local machine)
    multiplied by `s`: what a table is reloaded with to price its local work at `s` times today's."""
    from evals.breakeven import scale_price

    return {t.name: scale_price(t.price, s) if t.price.usd_per_hour is not None else t.price for t in table.tiers}


def study_splits(
    table: ResultTable,
    local_free: ResultTable,
    target: Target,
    calibrations: list[Calibration],
    *,
    seed: int = 0,
    fraction: float = 0.5,
    n_splits: int = splits.SPLITS,
) -> SplitsReport:
    """Every verifier calibrated for `target` on `n_splits` random splits (seeds seed + 1 on), the
    policy the report deploys on each (best AUROC on the calibration half), the same on a finer
    grid, and the fixed split's (`calibrations`, at seed and fraction) bootstrap intervals. A
    learned estimator's stored predictions were made for the fixed split alone (its held-out items
    scored by a model fit on that split's other half), so on any other split some held-out items
    were its training rows: it is left out."""
    from evals.learned_comparison import LEARNED, PREROUTER

    left = [v for v in (LEARNED, PREROUTER) if v in table.verifiers]
    keep = [v for v in table.verifiers if v not in left]
    masks = splits.split_masks([it.id for it in table.items], n_splits, fraction, first=seed + 1)
    cascades = splits.priced_cascades(replace(table, verifiers=keep), replace(local_free, verifiers=keep))

    def rule(first: float, top: float) -> Target:
        return target

    [(each, deployed)] = splits.study(cascades, masks, [rule], splits.best_auroc, label="best AUROC")
    [(_, finer)] = splits.study(
        cascades, masks, [rule], splits.best_auroc, label="best AUROC", max_points=FINER * MAX_POINTS
    )
    fixed = {}
    calibration = np.array([in_calibration(it.id, seed, fraction) for it in table.items])
    by_verifier = {c.verifier: c for c in calibrations}
    for c in cascades:
        cal = by_verifier[c.verifier]
        held = np.flatnonzero(~calibration)
        ths = tuple(cal.thresholds.values())
        answered = policy.answering_tiers(c.arrays.scores[held], ths[: table.top])
        cost = np.choose(answered, c.arrays.cost[held].T)
        right = np.choose(answered, c.arrays.right[held].T).astype(float)
        _, _, saved, saved_ci = splits.bootstrap(
            cost, right, c.top_cost[held], c.arrays.right[held, table.top].astype(float), seed
        )
        fixed[c.verifier] = FixedInterval(c.verifier, saved, saved_ci)
    local = [t.name for t in table.tiers if t.price.usd_per_hour is not None]
    return SplitsReport(n_splits, each, deployed, finer, fixed, left, local)
