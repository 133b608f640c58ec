"""The report's PNG figures, one set per suite.

matplotlib is imported inside `figures` alone, so building a report's numbers or text never loads
it. The PNGs are written without a timestamp or a version in their metadata: the same run draws
the same bytes, which is what lets the committed report be checked byte for byte.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

from evals import measures
from evals.breakeven import log_grid
from evals.learned_comparison import PREROUTER
from evals.report.suite import SuiteReport
from evals.splits import SplitOutcomes
from evals.sweep import CONFIG, preroute_sweep


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
        mean, frac = measures.reliability(y, s)
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


def price_png(lines: Sequence[tuple[str, SplitOutcomes, str, bool, str]], title: str) -> bytes:
    """The median held-out saving over the splits against the multiple of today's local price per
    busy hour (log scale, 1x to 20x), one line per (label, outcomes, line style, with its band: the
    range 95% of the splits fall in, and a group: lines of one group share a colour); the
    break-even is where a line crosses zero."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    grid = [math.exp(math.log(20.0) * i / 59) for i in range(60)]
    fig, ax = plt.subplots(figsize=(8, 5))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    groups: dict[str, str] = {}
    for label, o, style, band, group in lines:
        colour = groups.setdefault(group, palette[len(groups) % len(palette)])
        spreads = [o.saved_spread(m) for m in grid]
        ax.plot(grid, [s.median for s in spreads], style, color=colour, linewidth=1.4, label=label)
        if band:
            ax.fill_between(grid, [s.low for s in spreads], [s.high for s in spreads], color=colour, alpha=0.12, lw=0)
    ax.axhline(0.0, color="k", linewidth=0.8)
    for m in (2.6, 5.0):
        ax.axvline(m, color="grey", linewidth=0.6, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("local price per busy hour, × today's (= 1 / utilisation)")
    ax.set_ylabel("saved vs the top tier alone, held out (median over splits)")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.legend(fontsize=6.5, loc="lower left")
    ax.set_title(title, fontsize=9)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def split_figures(r: SuiteReport) -> dict[str, bytes]:
    """The price sensitivity of the policy deployed over the splits (and of `config`)."""
    sp = r.splits
    if sp is None:
        return {}
    lines: list[tuple[str, SplitOutcomes, str, bool, str]] = [("policy chosen afresh", sp.deployed, "-", True, "0")]
    lines += [(o.label, o, "--", False, "1") for o in sp.per_verifier if o.label == CONFIG]
    title = f"{r.table.suite}: savings as the local machine's price moves ({sp.n_splits} splits; band: 95% of them)"
    return {f"{r.table.suite}-price.png": price_png(lines, title)}
