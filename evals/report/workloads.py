"""Where the cascade pays, suite by suite: the median saving at a quality target stated as a share
of the top tier's own accuracy (95% and 99%), over random calibration/held-out splits, with the
ceiling a perfect verifier would reach beside it and the price assumption in the same table.

Why a page of its own: the suite reports (`evals.report.suite`) answer "how good is each verifier
on this suite"; an operator asks "on which of my workloads does a small tier in front pay, and by
how much, at the quality I need". The figures are the split study's (`evals.splits.study`, the
policy chosen afresh on each calibration half by the report's rule: the verifier with the best
AUROC there), so they are the same numbers a suite report would print for `min-relative=R`.

The ceiling at a target is what a perfect verifier would save on all items while still reaching
it: knowing which answers are right, it accepts every answer of the first tier (right or wrong,
where no later tier would do better) and escalates only as many of the items a later tier gets right
as the target needs, the cheapest first. It says how much of a shortfall is the verifiers' and how
much the small model's: a ceiling near zero means no verifier can help on that suite at that price.
(The split figures are held-out and may miss the target; the ceiling never does, so a split median
above the ceiling means the verifier met the target on calibration and missed it held out.)
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from evals import splits
from evals.calibrate import Target
from evals.sweep import ResultTable
from router import policy

# the top tier priced again at a frontier model's list price (GPT-4o's, per 1M input / output
# tokens): the runs price the local 1.5B as a cheap hosted model, and the saving depends on it
FRONTIER_PRICE = (2.50, 10.00, "GPT-4o's list price, $2.50 / $10 per 1M input / output tokens")
TARGETS = (0.95, 0.99)  # the headline quality targets, as shares of the top tier's accuracy
CURVE = tuple(round(0.80 + 0.01 * i, 2) for i in range(21))  # the plot's targets, 80% to 100%


@dataclass(frozen=True)
class TargetSaving:
    target: float  # the share of the top tier's accuracy asked for
    saved: splits.Spread  # held-out saving against the top tier alone, over the splits
    ratio: splits.Spread  # held-out accuracy / the top tier's on the same half
    missed_share: float  # the share of splits whose held-out half misses the target
    fallback_share: float  # the share of splits where no verifier met it on the calibration half
    ceiling: float  # a perfect verifier's saving on all items at this target (`ceiling`)


@dataclass(frozen=True)
class Workload:
    suite: str
    items: int
    tiers: tuple[str, ...]
    accuracy: tuple[float, ...]  # each tier alone, all items
    cost_per_1k: tuple[float, ...]  # each tier alone, all items
    prices: tuple[str, ...]  # each tier's price, as the run priced it
    headline: tuple[TargetSaving, ...]  # at TARGETS
    curve: tuple[TargetSaving, ...]  # at CURVE


def ceiling(table: ResultTable, share: float) -> float:
    """A perfect verifier's saving against the top tier alone on all items, at `share` of the top
    tier's accuracy: every item costs its first tier's answer; the items the first tier gets wrong
    and a later one right are escalated (each to the first right tier, paying every tier on the way)
    the cheapest first, as many as reaching the target takes (all of them when it cannot be reached)."""
    n = len(table.items)
    top = policy.request_cost(it.tiers[table.top].cost_usd for it in table.items)
    if n == 0 or top <= 0:
        return 0.0
    need = share * sum(it.tiers[table.top].correct for it in table.items)
    have = sum(it.tiers[0].correct for it in table.items)
    base = [it.tiers[0].cost_usd for it in table.items]
    extra = []
    for it in table.items:
        if it.tiers[0].correct:
            continue
        right = next((k for k in range(1, table.top + 1) if it.tiers[k].correct), None)
        if right is not None:
            extra.append(policy.request_cost(it.tiers[k].cost_usd for k in range(1, right + 1)))
    extra.sort()
    k = min(len(extra), max(0, math.ceil(need - have - 1e-9)))
    return 1.0 - policy.request_cost(base + extra[:k]) / top


def _rule(share: float) -> splits.TargetRule:
    def rule(first: float, top: float) -> Target:
        return Target("min-relative", share)

    return rule


def workload(table: ResultTable, local_free: ResultTable, *, n_splits: int = splits.SPLITS) -> Workload:
    """One suite's savings at every target of TARGETS and CURVE. `local_free` is the same run with
    the local tiers' work free (`evals.report.suite.local_prices(table, 0)`)."""
    from evals.learned_comparison import LEARNED, PREROUTER

    keep = [v for v in table.verifiers if v not in (LEARNED, PREROUTER)]  # fit for one split only
    masks = splits.split_masks([it.id for it in table.items], n_splits)
    cascades = splits.priced_cascades(replace(table, verifiers=keep), replace(local_free, verifiers=keep))
    shares = (*TARGETS, *CURVE)
    studied = splits.study(cascades, masks, [_rule(s) for s in shares], splits.best_auroc, label="best AUROC")
    found = [
        TargetSaving(s, d.saved_spread(), d.ratio_spread(), d.missed_share, d.fallback_share, ceiling(table, s))
        for s, (_, d) in zip(shares, studied, strict=True)
    ]
    n = len(table.items)
    accuracy = tuple(sum(it.tiers[k].correct for it in table.items) / n for k in range(table.top + 1))
    cost = tuple(
        1000.0 * policy.request_cost(it.tiers[k].cost_usd for it in table.items) / n for k in range(table.top + 1)
    )
    return Workload(
        suite=table.run,
        items=n,
        tiers=tuple(t.name for t in table.tiers),
        accuracy=accuracy,
        cost_per_1k=cost,
        prices=tuple(policy.describe(t.price) for t in table.tiers),
        headline=tuple(found[: len(TARGETS)]),
        curve=tuple(found[len(TARGETS) :]),
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _spread(s: splits.Spread) -> str:
    return f"{_pct(s.median)} [{_pct(s.low)}, {_pct(s.high)}]"


def markdown(
    priced: Sequence[tuple[str, Sequence[Workload]]], command: str, n_splits: int, notes: Sequence[str] = ()
) -> str:
    """The page: one table per pricing of the top tier (its label, the suites priced so). `notes`
    says, per suite whose top tier is another run's (a published frontier tier), where it came from."""
    lines = [
        "# Where the cascade pays: savings per workload",
        "",
        "Regenerate (no models needed; the per-item results are committed):",
        "",
        "```",
        command,
        "```",
        "",
        f"Each cell is the median over {n_splits} random calibration/held-out splits, with the range 95% of "
        "the splits fall in: on each calibration half the verifier with the best AUROC there is calibrated "
        "for the cheapest thresholds reaching the target (a share of the top tier's accuracy on that half, "
        "`--target min-relative=R` in `tierroute eval report`), and the saving is measured on the held-out "
        "half against sending every request to the top tier. *Missed* is the share of splits whose "
        "held-out half falls short of the target. The ceiling is a perfect verifier on all items at the "
        "same target (it escalates only wrong answers a later tier gets right, as few as the target needs, "
        "the cheapest first): what the small model allows at these prices. A median above its ceiling "
        "comes from splits that missed the target held out.",
        "",
    ]
    if notes:
        lines += ["Top tiers taken from another run:", "", *(f"- {n}" for n in notes), ""]
    for label, loads in priced:
        lines += _table(label, loads)
    lines += ["![saving against quality target](workloads-savings.png)", ""]
    return "\n".join(lines)


def _table(label: str, loads: Sequence[Workload]) -> list[str]:
    lines = [
        f"## {label}",
        "",
        "| suite | items | tiers: accuracy, cost / 1k | saved at 95% of top | missed | ceiling "
        "| saved at 99% of top | missed | ceiling |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in loads:
        tiers = "; ".join(
            f"{t} {_pct(a)}, ${c:.4f}" for t, a, c in zip(w.tiers, w.accuracy, w.cost_per_1k, strict=True)
        )
        h95, h99 = w.headline
        lines.append(
            f"| {w.suite} | {w.items} | {tiers} | {_spread(h95.saved)} | {_pct(h95.missed_share)} "
            f"| {_pct(h95.ceiling)} | {_spread(h99.saved)} | {_pct(h99.missed_share)} | {_pct(h99.ceiling)} |"
        )
    lines += ["", "Prices:", ""]
    for w in loads:
        for t, p in zip(w.tiers, w.prices, strict=True):
            lines.append(f"- {w.suite} / {t}: {p}")
    lines.append("")
    return lines


def curve_png(priced: Sequence[tuple[str, Sequence[Workload]]]) -> bytes:
    """Median held-out saving (its 95% range as a band) against the quality target, per suite, one
    panel per pricing of the top tier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(priced), figsize=(6.0 * len(priced), 4.5), dpi=100, squeeze=False, sharey=True)
    for ax, (label, loads) in zip(axes[0], priced, strict=True):
        for w in loads:
            x = [100 * c.target for c in w.curve]
            (line,) = ax.plot(x, [100 * c.saved.median for c in w.curve], marker="o", markersize=3, label=w.suite)
            ax.plot(
                x,
                [100 * c.ceiling for c in w.curve],
                linestyle="--",
                color=line.get_color(),
                label=f"{w.suite}: perfect verifier",
            )
            ax.fill_between(x, [100 * c.saved.low for c in w.curve], [100 * c.saved.high for c in w.curve], alpha=0.15)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel("quality target: % of the top tier's accuracy")
        ax.set_title(label.replace("$", r"\$"), fontsize=9)  # a bare $ starts mathtext
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out saving vs top tier alone, % (median, 95% of splits)")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def csv_rows(priced: Sequence[tuple[str, Sequence[Workload]]]) -> list[dict[str, object]]:
    return [
        {
            "top_priced": label,
            "suite": w.suite,
            "target": c.target,
            "saved_median": round(c.saved.median, 6),
            "saved_low": round(c.saved.low, 6),
            "saved_high": round(c.saved.high, 6),
            "ratio_median": round(c.ratio.median, 6),
            "missed_share": round(c.missed_share, 6),
            "fallback_share": round(c.fallback_share, 6),
            "ceiling_saved": round(c.ceiling, 6),
        }
        for label, loads in priced
        for w in loads
        for c in (*w.headline, *w.curve)
    ]
