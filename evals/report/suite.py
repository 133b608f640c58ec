"""One suite's report as numbers: each tier's row, every verifier's summary, the baselines, the
calibrated cascades and the break-even analysis, computed once from a run's table.

Everything a report shows is decided here; `tables`, `figures` and `pages` only format it, so the
Markdown, the HTML, the CSV and the figures cannot disagree about a number.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evals import measures
from evals.breakeven import BreakEvenReport, analyse
from evals.calibrate import Calibration, Target, calibrate, split
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
) -> SuiteReport:
    """The report of one run. `top_free` is the same run loaded with the top tier's price at zero
    (`evals.breakeven.scaled_top_prices(table, 0)`): given, the report has the break-even price
    ratios, which need each cost split into the top tier's part and the rest."""
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
    )
