"""Reports from stored runs: Markdown (with PNG figures beside it), one self-contained HTML file,
and CSV. Everything is computed from the run directories alone, so a report regenerates on any
machine, without models, in seconds.

Per suite: each tier's accuracy, tokens, latency and priced cost; every verifier's AUROC, ECE,
APGR, CPT and AIQ over the whole threshold sweep, beside the oracle and random baselines; and the
cascade at thresholds calibrated on one split, reported on the held-out split only.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals import metrics
from evals.breakeven import RATIOS, BreakEvenReport, analyse, log_grid
from evals.calibrate import Calibration, Target, calibrate, split
from evals.estimators import PREROUTER, Comparison, comparison_html, comparison_markdown
from evals.formatting import html_table, inline, md_table, num, pct, sec, th, usd
from evals.sweep import (
    CONFIG,
    CascadePolicy,
    PolicyResult,
    ResultTable,
    VerifierSummary,
    baselines,
    evaluate,
    preroute_sweep,
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
                latency_p50=metrics.percentile([o.latency_s for o in outs], 50),
                latency_p95=metrics.percentile([o.latency_s for o in outs], 95),
                busy_s=sum(o.busy_s for o in outs) / n,
                cost_per_1k=metrics.cost_per_1k([o.cost_usd for o in outs]),
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


# ---- the sections, as (header, rows) tables shared by Markdown and HTML ------------------------------------


def tier_table(r: SuiteReport) -> tuple[list[str], list[list[str]]]:
    header = [
        "tier",
        "model",
        "accuracy",
        "tokens in / out",
        "latency p50 / p95",
        "busy s / request",
        "cost / 1k requests",
    ]
    rows = [
        [
            t.name,
            t.model.split("@")[0],
            pct(t.accuracy),
            f"{t.prompt_tokens:.0f} / {t.completion_tokens:.0f}",
            f"{sec(t.latency_p50)} / {sec(t.latency_p95)}",
            f"{t.busy_s:.2f}",
            usd(t.cost_per_1k),
        ]
        for t in r.tiers
    ]
    return header, rows


def verifier_table(r: SuiteReport) -> tuple[list[str], list[list[str]]]:
    names = [t.name for t in r.table.tiers]
    header = [
        "verifier",
        *(f"AUROC ({n})" for n in names),
        f"ECE ({names[0]})",
        f"Brier ({names[0]})",
        f"scored ({names[0]})",
        "APGR",
        "CPT(50%)",
        "CPT(80%)",
        "CPT(95%)",
        "AIQ",
    ]
    rows = []
    for v in r.verifiers:
        # a verifier that abstains escalates those answers at every threshold: its curve starts at
        # the share it abstains on, and APGR (over the span the curve covers) is not comparable
        # with a verifier that scores every answer; the span is shown with it
        scored = [it.tiers[0].scores.get(v.verifier) is not None for it in r.table.items]
        low = min((p.top_rate for p in v.curve), default=0.0)
        apgr = num(v.apgr) if low <= 0.005 or v.apgr is None else f"{num(v.apgr)} (x ≥ {low:.0%})"
        rows.append(
            [
                v.verifier,
                *(num(a) for a in v.auroc),
                num(v.ece[0]),
                num(v.brier[0]),
                pct(sum(scored) / len(scored)) if scored else "–",
                apgr,
                *(pct(v.cpt[x]) for x in (0.5, 0.8, 0.95)),
                num(v.aiq),
            ]
        )
    random_curve = r.baselines["random"]
    weak, strong = r.tiers[0].accuracy, r.tiers[-1].accuracy
    singles = [t.cost_per_1k for t in r.tiers]
    oracle = r.baselines["oracle"][0]
    rand_xy = [(p.top_rate, p.accuracy) for p in random_curve]
    rows.append(
        [
            "*random escalation*",
            *("0.500" if i == 0 else "–" for i in range(len(names))),
            "–",
            "–",
            "–",
            num(metrics.apgr(rand_xy, weak, strong)),
            *(pct(metrics.cpt(rand_xy, weak, strong, x)) for x in (0.5, 0.8, 0.95)),
            num(metrics.aiq([(p.cost_per_1k, p.accuracy) for p in random_curve], min(singles), max(singles))),
        ]
    )
    tiers_xy = [(p.cost_per_1k, p.accuracy) for p in r.baselines["tiers"]]
    rows.append(
        [
            "*oracle*",
            *("–" for _ in names),
            "–",
            "–",
            "–",
            "–",
            "–",
            "–",
            "–",
            num(metrics.aiq([*tiers_xy, (oracle.cost_per_1k, oracle.accuracy)], min(singles), max(singles))),
        ]
    )
    return header, rows


def calibration_table(r: SuiteReport) -> tuple[list[str], list[list[str]]]:
    header = [
        "verifier",
        "thresholds",
        "met on calibration",
        "accuracy (calibration)",
        "accuracy (held-out)",
        "cost / 1k (held-out)",
        "escalation (held-out)",
        "savings vs top (held-out)",
        "target met (held-out)",
    ]
    rows = []
    for c in r.calibrations:
        ths = ", ".join(f"{n}={th(v)}" for n, v in c.thresholds.items())
        rows.append(
            [
                c.verifier + (" **(best)**" if c.verifier == r.best else ""),
                ths,
                "yes" if c.met else "no",
                pct(c.calibration.accuracy),
                pct(c.held_out.accuracy),
                usd(c.held_out.cost_per_1k),
                pct(c.held_out.escalation_rate),
                pct(c.held_out.savings),
                "yes" if c.held_out_met else "no",
            ]
        )
    if r.calibrations:
        for t in r.calibrations[0].held_out_tiers:
            rows.append(
                [
                    f"*always {t.policy}*",
                    "–",
                    "–",
                    "–",
                    pct(t.accuracy),
                    usd(t.cost_per_1k),
                    pct(t.escalation_rate),
                    pct(t.savings),
                    "–",
                ]
            )
    return header, rows


def breakeven_table(r: SuiteReport) -> tuple[list[str], list[list[str]]]:
    b = r.breakeven
    assert b is not None and b.base_ratio is not None
    top = r.tiers[-1].name
    header = [
        "verifier",
        "thresholds",
        "accuracy (held-out)",
        "accuracy required",
        f"cost / 1k: fixed + (r/r0) × {top}'s part",
        "break-even r",
        "cost alone breaks even at r",
        f"savings at r0 = {b.base_ratio:.1f}",
        *(f"savings at r = {x:g}" for x in RATIOS),
    ]
    rows = []
    for e in b.rows:
        if e.ratio is not None:
            ratio = f"{e.ratio:.1f}"
        elif e.never_because == "accuracy":
            ratio = "never (accuracy)"
        else:
            ratio = "never (cost)"
        rows.append(
            [
                e.verifier + (" **(best)**" if e.verifier == r.best else ""),
                ", ".join(f"{n}={th(v)}" for n, v in e.thresholds.items()),
                pct(e.accuracy),
                pct(e.required) + ("" if e.accuracy_met else " (missed)"),
                f"{usd(e.cascade.fixed)} + {usd(e.cascade.scaled)}",
                ratio,
                "never" if e.cost_scale is None else f"{e.cost_scale * b.base_ratio:.1f}",
                pct(e.savings_at(b.base_ratio)),
                *(pct(e.savings_at(x)) for x in RATIOS),
            ]
        )
    if b.rows:
        t = b.rows[0]
        rows.append(
            [
                f"*always {top}*",
                "–",
                pct(t.top_accuracy),
                "–",
                f"{usd(t.top.fixed)} + {usd(t.top.scaled)}",
                "–",
                "–",
                "0.0%",
                *("0.0%" for _ in RATIOS),
            ]
        )
    return header, rows


def breakeven_intro(r: SuiteReport) -> str:
    b = r.breakeven
    assert b is not None
    if b.base_ratio is None:
        return f"No break-even ratio: {b.why_none}."
    first, top = r.tiers[0].name, r.tiers[-1].name
    return (
        f"The recorded price sheet makes a {top} request r0 = {b.base_ratio:.1f}× a {first} one "
        f"(mean priced cost per request, all items). Cascades at the thresholds calibrated for `{r.target}`, "
        f"on the {b.n_held_out} held-out items, against always {top} on the same items."
    )


BREAKEVEN_TEXT = (
    "**Break-even price ratio.** The price ratio r is the mean priced cost of one top-tier request "
    "over that of one first-tier request (generation, all items of the run); the recorded price "
    "sheet sits at r0. Ratio r multiplies the top tier's prices by r/r0 and keeps every other "
    "tier's. Each cascade keeps the thresholds calibrated for the target at the recorded prices "
    "and is priced on the held-out items: every cost is linear in the prices, so its cost per 1k is "
    "fixed + (r/r0) × the top tier's part (work a verifier has another tier do is priced at that "
    "tier), and so is always-top's. The break-even r is where the two are equal: above it the "
    "cascade is cheaper. It is given only when the cascade's held-out accuracy meets the target as "
    "stated (for min-pgr=G: at least first + G × (top − first) on the same items, i.e. at most "
    "(1 − G) of the gap below always-top; for targets that set no accuracy: always-top's accuracy); "
    "otherwise it is “never (accuracy)”: such a cascade is cheaper because it is worse. “never "
    "(cost)” is a cascade that pays the top tier at least as much as always-top does. Equality with "
    "always-top's accuracy is not asked: a cascade calibrated to recover G of the gap is by "
    "construction a little less accurate, and would be “never” at every price. Savings at a ratio "
    "are 1 − cascade / always-top there, shown whether or not the accuracy is met, and so is the ratio "
    "where cost alone breaks even. In the figure, dots mark the break-even ratios and dashed lines "
    "the cascades that miss the accuracy."
)


def headline(r: SuiteReport) -> list[str]:
    tiers = "; ".join(f"**{t.name}** {pct(t.accuracy)} at {usd(t.cost_per_1k)} per 1k requests" for t in r.tiers)
    lines = [f"Tiers on all {len(r.table.items)} items: {tiers}."]
    oracle = r.baselines["oracle"][0]
    lines.append(f"Oracle (cheapest right tier): {pct(oracle.accuracy)} at {usd(oracle.cost_per_1k)} per 1k.")
    if r.best is not None:
        lines.append(
            f"Best verifier (by AUROC on the calibration split): **{r.best}**, AUROC "
            f"{num(r.best_auroc_calibration)} on the calibration split and "
            f"**{num(r.best_auroc_held_out)} on held-out items**."
        )
        c = r.best_calibration
        if c is not None:
            lines.append(
                f"Cascade with {c.verifier} calibrated for {c.target} on {c.n_calibration} items, on the "
                f"{c.n_held_out} held-out items: **accuracy {pct(c.held_out.accuracy)}, {usd(c.held_out.cost_per_1k)} "
                f"per 1k requests**, escalation {pct(c.held_out.escalation_rate)}, savings against always "
                f"{r.tiers[-1].name} {pct(c.held_out.savings)} (always {r.tiers[-1].name} on the same items: "
                f"{pct(c.held_out_tiers[-1].accuracy)} at {usd(c.held_out_tiers[-1].cost_per_1k)})."
                + (
                    ""
                    if c.met
                    else " The target was not reachable on the calibration split; the nearest setting is shown."
                )
            )
    if r.configured is not None:
        ths = ", ".join(f"{t.name}={t.threshold:g}" for t in r.table.tiers[:-1])
        lines.append(
            f"The cascade as configured ({ths}), on all items: accuracy {pct(r.configured.accuracy)}, "
            f"{usd(r.configured.cost_per_1k)} per 1k, escalation {pct(r.configured.escalation_rate)}."
        )
    return lines


# ---- figures --------------------------------------------------------------------------------------------------


def figures(r: SuiteReport) -> dict[str, bytes]:
    """PNG figures: accuracy against cost, escalation against threshold, latency per tier, and the
    reliability of each verifier's score on the first tier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, bytes] = {}
    suite = r.table.suite

    def save(fig: Any, name: str) -> None:
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
        plt.close(fig)
        out[name] = buf.getvalue()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for v in r.verifiers:
        pts = sorted((p.cost_per_1k, p.accuracy) for p in v.curve)
        ax.plot(
            [x for x, _ in pts],
            [y for _, y in pts],
            marker=".",
            markersize=3,
            linewidth=1.2,
            label=f"cascade: {v.verifier}",
        )
    rand = r.baselines["random"]
    ax.plot([p.cost_per_1k for p in rand], [p.accuracy for p in rand], "k--", linewidth=1, label="random escalation")
    o = r.baselines["oracle"][0]
    ax.plot([o.cost_per_1k], [o.accuracy], "k*", markersize=11, label="oracle")
    for t in r.baselines["tiers"]:
        ax.plot([t.cost_per_1k], [t.accuracy], "s", markersize=8, label=f"always {t.policy}")
    c = r.best_calibration
    if c is not None:
        ax.plot(
            [c.held_out.cost_per_1k],
            [c.held_out.accuracy],
            "rX",
            markersize=10,
            label=f"calibrated ({c.verifier}), held-out",
        )
    if r.learned is not None:
        pts = sorted((p.cost_per_1k, p.accuracy) for p in preroute_sweep(r.table, PREROUTER))
        ax.plot(
            [x for x, _ in pts],
            [y for _, y in pts],
            ":",
            marker=".",
            markersize=3,
            linewidth=1.2,
            label="pre-route only",
        )
        for pc, marker in ((r.learned.preroute_only, "P"), *((p, "D") for p in r.learned.preroute_verify.values())):
            ax.plot(
                [pc.held_out.cost_per_1k], [pc.held_out.accuracy], marker, markersize=8, label=f"{pc.policy}, held-out"
            )
    ax.set_xlabel("cost per 1k requests (USD)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{suite}: accuracy against cost")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    save(fig, f"{suite}-accuracy-cost.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    for v in r.verifiers:
        pts = [(p.param, p.escalation_rate) for p in v.curve if p.param is not None and math.isfinite(p.param)]
        ax.step([x for x, _ in pts], [y for _, y in pts], where="post", label=v.verifier)
    ax.set_xlabel(f"threshold on {r.table.tiers[0].name}")
    ax.set_ylabel("escalation rate")
    ax.set_title(f"{suite}: escalation rate against threshold")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    save(fig, f"{suite}-escalation-threshold.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    data = [[it.tiers[i].latency_s for it in r.table.items] for i in range(len(r.table.tiers))]
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(data) + 1), [t.name for t in r.table.tiers])
    ax.set_ylabel("latency per request (s)")
    ax.set_title(f"{suite}: latency per tier (requests decoded in batches)")
    ax.grid(alpha=0.3, axis="y")
    save(fig, f"{suite}-latency.png")

    fig, ax = plt.subplots(figsize=(5, 4.5))
    ax.plot([0, 1], [0, 1], "k:", linewidth=1)
    for v in r.verifiers:
        pairs = [(it.tiers[0].correct, x) for it in r.table.items if (x := it.tiers[0].scores[v.verifier]) is not None]
        y = [c for c, _ in pairs]
        s = [x for _, x in pairs]
        mean, frac = metrics.reliability(y, s)
        if mean:
            ax.plot(mean, frac, marker="o", markersize=3, label=v.verifier)
    ax.set_xlabel(f"verifier score ({r.table.tiers[0].name})")
    ax.set_ylabel("fraction correct")
    ax.set_title(f"{suite}: reliability")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "undefined: all answers right, or all wrong", ha="center", transform=ax.transAxes)
    save(fig, f"{suite}-reliability.png")

    b = r.breakeven
    if b is not None and b.base_ratio is not None and b.rows:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        grid = log_grid(1.0, 1000.0)
        lowest = 0.0
        for e in b.rows:
            ys = [e.savings_at(x) for x in grid]
            lowest = min(lowest, *(y for y in ys if y is not None))
            label = e.verifier + ("" if e.accuracy_met else " (misses the accuracy)")
            (line,) = ax.plot(
                grid, [math.nan if y is None else y for y in ys], "-" if e.accuracy_met else "--", label=label
            )
            if e.ratio is not None and 1 <= e.ratio <= 1000:
                ax.plot([e.ratio], [0.0], "o", color=line.get_color(), markersize=5)
        ax.axhline(0.0, color="k", linewidth=0.8)
        ax.axvline(b.base_ratio, color="grey", linestyle=":", linewidth=1)
        ax.text(b.base_ratio, 0.97, f" recorded prices, r0={b.base_ratio:.1f}", fontsize=7, va="top", color="grey")
        ax.set_xscale("log")
        ax.set_xlim(1, 1000)
        ax.set_ylim(max(-1.0, lowest - 0.05), 1.0)
        ax.set_xlabel(f"price ratio r ({r.tiers[-1].name} / {r.tiers[0].name} per request)")
        ax.set_ylabel(f"savings vs always {r.tiers[-1].name} (held-out)")
        ax.set_title(f"{suite}: savings of the calibrated cascades against price ratio")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="lower right")
        save(fig, f"{suite}-breakeven.png")
    return out


# ---- writers -------------------------------------------------------------------------------------------------------


def _assumptions(reports: Sequence[SuiteReport]) -> tuple[list[str], list[list[str]]]:
    seen: dict[str, list[str]] = {}
    for r in reports:
        for t in r.table.tiers:
            seen.setdefault(t.name, [t.name, t.model.split("@")[0], t.price_text])
    return ["tier", "model", "priced as"], list(seen.values())


PREAMBLE = [
    "Costs are priced from the price sheet recorded with each run: token-priced tiers pay for "
    "the measured prompt and completion tokens; time-priced tiers pay their hourly price for the "
    "measured busy time of each request (its share of the batched decode steps). The priced cost "
    "is what the tier stands for, not what this machine spent: the busy seconds per request are "
    "shown beside it.",
    "`config` is each tier's configured verifiers combined as the config combines them (what the "
    "live cascade thresholds); every other verifier is scored alone on every tier.",
    "A cascade pays for every tier it tried and for the verifiers it ran on the tiers that decided. "
    "Latency is measured with several requests decoded together, so it is higher than a lone request's.",
    "Random escalation is a cascade whose verifier escalates each answer with probability p (expected "
    "values); the oracle answers with the cheapest tier that is right (an upper bound, not a router). "
    "APGR and CPT follow RouteLLM (x = fraction of requests that reach the top tier; PGR = "
    "(acc − acc first tier) / (acc top tier − acc first tier)); AIQ follows RouterBench (area under the "
    "non-decreasing convex hull of (cost, accuracy), over the cost range between the cheapest and the "
    "dearest tier). ECE uses 10 equal-width bins.",
    "A verifier abstains where it does not apply (`execution` on an answer without a program); the "
    "cascade escalates those answers at every threshold. `scored` is the share of the first tier's "
    "answers a verifier scored; its AUROC, ECE and Brier are over those answers, and when it "
    "abstains on some, its curve cannot go below that share of escalations, so its APGR is over the "
    "span it covers, shown as (x ≥ share): not comparable with a verifier that scores every answer. "
    "Combined with one that does (a config's `mean` ignores an abstention), it covers the whole range.",
]


def markdown(reports: Sequence[SuiteReport], *, command: str = "", images: bool = True) -> str:
    lines = ["# tierroute eval report", ""]
    if command:
        lines += ["Regenerate (no models needed; the per-item results are committed):", "", "```", command, "```", ""]
    h, rows = _assumptions(reports)
    lines += ["## Prices and assumptions", "", *md_table(h, rows), ""]
    lines += [*(p + "\n" for p in PREAMBLE)]
    if any(r.breakeven is not None for r in reports):
        lines += [BREAKEVEN_TEXT + "\n"]
    for r in reports:
        t = r.table
        m = t.manifest
        lines += [
            f"## {t.suite}",
            "",
            f"Run `{t.run}`: {len(t.items)} items. Data: {t.source}. "
            f"Items drawn with seed {m['suite'].get('seed')}; greedy decoding; calibration split seed "
            f"{r.calibrations[0].seed if r.calibrations else '–'}, target `{r.target}`.",
            "",
        ]
        lines += [f"- {x}" for x in headline(r)] + [f"- {n}" for n in r.notes] + [""]
        lines += ["### Tiers", "", *md_table(*tier_table(r)), ""]
        lines += ["### Verifiers (all items, whole threshold sweep)", "", *md_table(*verifier_table(r)), ""]
        if r.calibrations:
            c0 = r.calibrations[0]
            lines += [
                f"### Calibrated cascade: `{r.target}`, chosen on {c0.n_calibration} items, reported on "
                f"{c0.n_held_out} held-out items",
                "",
                *md_table(*calibration_table(r)),
                "",
            ]
        if r.breakeven is not None:
            lines += ["### When does a cascade pay? Break-even price ratio", "", breakeven_intro(r), ""]
            if r.breakeven.base_ratio is not None and r.breakeven.rows:
                lines += [*md_table(*breakeven_table(r)), ""]
                if images:
                    lines += [f"![{t.suite}-breakeven.png]({t.suite}-breakeven.png)", ""]
        if r.learned is not None:
            lines += [*comparison_markdown(r.learned, level=3), ""]
        if images:
            lines += ["### Figures", ""]
            for name in (
                f"{t.suite}-accuracy-cost.png",
                f"{t.suite}-escalation-threshold.png",
                f"{t.suite}-latency.png",
                f"{t.suite}-reliability.png",
            ):
                lines += [f"![{name}]({name})", ""]
    return "\n".join(lines).rstrip() + "\n"


def html_report(reports: Sequence[SuiteReport], figs: dict[str, bytes], *, command: str = "") -> str:
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:1em 0;font-size:.9em}td,th{border:1px solid #ccc;padding:.3em .6em;"
        "text-align:left}th{background:#f3f3f3}img{max-width:100%;margin:.5em 0}code,pre{background:#f6f6f6}"
    )
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>tierroute eval report</title><style>{style}</style>"
        "</head><body><h1>tierroute eval report</h1>"
    ]
    if command:
        parts.append(f"<p>Regenerate (no models needed):</p><pre>{html.escape(command)}</pre>")
    parts.append("<h2>Prices and assumptions</h2>" + html_table(*_assumptions(reports)))
    parts += [f"<p>{inline(p)}</p>" for p in PREAMBLE]
    if any(r.breakeven is not None for r in reports):
        parts.append(f"<p>{inline(BREAKEVEN_TEXT)}</p>")
    for r in reports:
        t = r.table
        parts.append(
            f"<h2>{html.escape(t.suite)}</h2><p>Run <code>{html.escape(t.run)}</code>: {len(t.items)} items. "
            f"Data: {html.escape(t.source)}. Target <code>{html.escape(str(r.target))}</code>.</p>"
        )
        parts.append("<ul>" + "".join(f"<li>{inline(x)}</li>" for x in headline(r) + r.notes) + "</ul>")
        parts.append("<h3>Tiers</h3>" + html_table(*tier_table(r)))
        parts.append("<h3>Verifiers (all items, whole threshold sweep)</h3>" + html_table(*verifier_table(r)))
        if r.calibrations:
            parts.append("<h3>Calibrated cascade (held-out items)</h3>" + html_table(*calibration_table(r)))
        if r.breakeven is not None:
            parts.append(f"<h3>When does a cascade pay? Break-even price ratio</h3><p>{inline(breakeven_intro(r))}</p>")
            if r.breakeven.base_ratio is not None and r.breakeven.rows:
                parts.append(html_table(*breakeven_table(r)))
        if r.learned is not None:
            parts.append(comparison_html(r.learned))
        for name, png in figs.items():
            if name.startswith(f"{t.suite}-"):
                parts.append(
                    f"<img alt='{html.escape(name)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
                )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def sweep_rows(reports: Sequence[SuiteReport]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for r in reports:
        base = {"suite": r.table.suite, "run": r.table.run}
        for v in r.verifiers:
            rows += [{**base, "kind": "cascade", "verifier": v.verifier, "split": "all", **p.as_row()} for p in v.curve]
        for kind, points in r.baselines.items():
            rows += [{**base, "kind": kind, "verifier": "", "split": "all", **p.as_row()} for p in points]
        for c in r.calibrations:
            rows.append(
                {
                    **base,
                    "kind": f"calibrated {c.target}",
                    "verifier": c.verifier,
                    "split": "held-out",
                    **c.held_out.as_row(),
                }
            )
        if r.learned is not None:
            for p in [r.learned.preroute_only, *r.learned.preroute_verify.values()]:
                rows.append(
                    {
                        **base,
                        "kind": f"calibrated {p.target}",
                        "verifier": p.policy,
                        "split": "held-out",
                        **p.held_out.as_row(),
                    }
                )
    return rows


def _breakeven_columns(r: SuiteReport, verifier: str) -> dict[str, Any]:
    """The break-even columns of summary.csv (held-out, calibrated; repeated on each tier's row):
    the ratio, "never" when there is none, empty where the report has no break-even."""
    b = r.breakeven
    e = next((e for e in b.rows if e.verifier == verifier), None) if b is not None else None
    if e is None:
        return {"breakeven_ratio": None, **{f"savings_r{x:g}": None for x in RATIOS}}
    return {
        "breakeven_ratio": "never" if e.ratio is None else e.ratio,
        **{f"savings_r{x:g}": e.savings_at(x) for x in RATIOS},
    }


def summary_rows(reports: Sequence[SuiteReport]) -> list[dict[str, Any]]:
    rows = []
    for r in reports:
        for v in r.verifiers:
            extra = _breakeven_columns(r, v.verifier)
            for i, t in enumerate(r.table.tiers):
                rows.append(
                    {
                        "suite": r.table.suite,
                        "verifier": v.verifier,
                        "tier": t.name,
                        "auroc": v.auroc[i],
                        "ece": v.ece[i],
                        "brier": v.brier[i],
                        "apgr": v.apgr,
                        "cpt50": v.cpt[0.5],
                        "cpt80": v.cpt[0.8],
                        "cpt95": v.cpt[0.95],
                        "aiq": v.aiq,
                        **extra,
                    }
                )
    return rows


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        path.write_text("")
        return
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if v is None else (f"{v:.6g}" if isinstance(v, float) else v)) for k, v in row.items()})


def write(reports: Sequence[SuiteReport], out: Path, *, command: str = "") -> list[Path]:
    """Write README.md (+ PNGs), report.html, sweep.csv and summary.csv into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    figs: dict[str, bytes] = {}
    for r in reports:
        figs.update(figures(r))
    written = []
    for name, png in figs.items():
        (out / name).write_bytes(png)
        written.append(out / name)
    for name, text in (
        ("README.md", markdown(reports, command=command)),
        ("report.html", html_report(reports, figs, command=command)),
    ):
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    _write_csv(out / "sweep.csv", sweep_rows(reports))
    _write_csv(out / "summary.csv", summary_rows(reports))
    written += [out / "sweep.csv", out / "summary.csv"]
    return written
