"""The frontier report's headline sections, as Markdown tables written from `report.SuiteFrontier`
alone: the summary over random splits (what the project README quotes), the price sensitivity to
the local machine's price per busy hour with the break-even, the threshold-grid check, each
cascade's verifiers over the splits, and the anchors' comparison with RouteLLM's published
savings; and the price figure.

`page` writes the rest of the report (the fixed split's tables) and puts these in place.
"""

from __future__ import annotations

from collections.abc import Sequence

from evals.calibrate import MAX_POINTS
from evals.formatting import num, pct
from evals.frontier.report import FINER, VERIFIED, Headline, SuiteFrontier
from evals.splits import MULTIPLIERS, RANGE, SplitOutcomes, Spread

SUMMARY_HEADER = (
    "suite",
    "cascade",
    "target",
    "policy chosen on the calibration half (share of splits)",
    "answered by (median)",
    "accuracy / GPT-4's",
    "saved vs GPT-4 alone",
    "held out below target",
    "fixed split: saved [bootstrap]",
    "prices",
)


def spread(s: Spread) -> str:
    return f"{pct(s.median)} [{pct(s.low)}, {pct(s.high)}]"


def policies(o: SplitOutcomes, limit: int = 2) -> str:
    """The verifiers the splits deployed, most often first."""
    shown = [f"`{d}` {pct(share, 0)}" if d else f"none met it {pct(share, 0)}" for d, share in o.most_deployed()]
    rest = len(shown) - limit
    return ", ".join(shown[:limit]) + (f", {rest} more" if rest > 0 else "")


def answered(h: Headline) -> str:
    return " · ".join(
        f"{name} {pct(s.median, 0)}" for name, s in zip(h.tiers, h.deployed.answered_spread(), strict=True)
    )


def prices(rep: SuiteFrontier, h: Headline) -> str:
    text = h.prices.replace(" local", f" at {rep.local_price}")
    if h.cascade == VERIFIED:
        text += f"; local checks at {rep.local_price}"
    return text


def fixed(h: Headline) -> str:
    r = h.fixed
    if r is None:
        return "none met it"
    return f"`{r.verifier}` {pct(r.saved)} [{pct(r.saved_ci.low)}, {pct(r.saved_ci.high)}]"


def summary_rows(reports: Sequence[SuiteFrontier]) -> list[list[str]]:
    out = []
    for rep in reports:
        for h in rep.headlines:
            d = h.deployed
            out.append(
                [
                    f"{rep.suite}, {rep.n_joined} items",
                    h.cascade,
                    pct(h.share, 0),
                    policies(d),
                    answered(h),
                    spread(d.ratio_spread()),
                    spread(d.saved_spread()),
                    pct(d.missed_share),
                    fixed(h),
                    prices(rep, h),
                ]
            )
    return out


def summary_text(reports: Sequence[SuiteFrontier]) -> list[str]:
    n = reports[0].n_splits
    lo, hi = RANGE
    return [
        f"Every figure is held out, as the median [the {lo:g}th to {hi:g}th percentile] over {n} random calibration / "
        "held-out splits of the items (seeds 1 to "
        f"{n}; half each way, by item id). On each split the policy (which verifier) and its thresholds are chosen "
        "afresh on the calibration half by the rule the fixed split uses (the cheapest there among those that meet "
        "the target there; none: GPT-4 alone, nothing saved) and reported on the other half. *Answered by* is the "
        "median share of held-out requests each tier answered. *Held out below target*: the share of splits whose "
        "held-out accuracy is under the target share of GPT-4's on the same items. *Fixed split* is the "
        "project's split (seed 0) with its 95% bootstrap interval over the held-out items: one split's own "
        "interval, not the spread between splits.",
        "",
    ]


# ---- price sensitivity ------------------------------------------------------------------------------------


def multipliers(rep: SuiteFrontier) -> list[tuple[str, float]]:
    """The local price multiples a table shows: the standard ones and each run's measured one."""
    out = [(_multiple(m), m) for m in MULTIPLIERS]
    out += [(f"{m:.2f}× (run `{run}`'s own throughput)", m) for run, m in rep.measured_multipliers]
    return sorted(out, key=lambda x: x[1])


def _multiple(m: float) -> str:
    return f"{m:g}× ({pct(1 / m, 0)} busy)"


def price_rows(rep: SuiteFrontier) -> tuple[list[str], list[list[str]]]:
    ms = multipliers(rep)
    header = ["cascade", "target", *(label for label, _ in ms), "break-even (median saving 0)"]
    rows = []
    for h in rep.headlines:
        be = h.break_even
        rows.append(
            [
                h.cascade,
                pct(h.share, 0),
                *(pct(h.deployed.saved_spread(m).median) for _, m in ms),
                "saves nothing at today's price"
                if be is None
                else (f"above {be:g}×" if be >= 1000 else f"{be:.2f}× ({pct(1 / be, 0)} busy)"),
            ]
        )
    return header, rows


def price_text(rep: SuiteFrontier) -> list[str]:
    return [
        f"The local machine is priced at {rep.local_price} at full utilisation (every hour busy). Paying for idle "
        "hours is the same as a dearer busy hour: at a utilisation of u the busy hour costs 1/u times as much, so "
        "each column is a multiple of today's price per busy hour with the utilisation it means. Each cell is the "
        "median held-out saving over the splits, each split keeping the policy it chose at today's price (its "
        "local work, generation and checks, repriced; the frontier tiers' prices unchanged). The break-even is "
        "the multiple at which that median falls to zero. A run measured on a loaded machine has a lower "
        "throughput than the quiet run that prices the small tier; its own rate is shown as a column too.",
        "",
    ]


# ---- the threshold grid -----------------------------------------------------------------------------------


def grid_rows(rep: SuiteFrontier) -> tuple[list[str], list[list[str]]]:
    header = [
        "cascade",
        "target",
        f"saved, {MAX_POINTS} thresholds per tier",
        f"saved, {FINER * MAX_POINTS} per tier",
        "moved by (points)",
        f"accuracy / GPT-4's, {MAX_POINTS}",
        f"accuracy / GPT-4's, {FINER * MAX_POINTS}",
    ]
    rows = []
    for h in rep.headlines:
        a, b = h.deployed.saved_spread().median, h.finer.saved_spread().median
        rows.append(
            [
                h.cascade,
                pct(h.share, 0),
                pct(a),
                pct(b),
                num(100 * (b - a), 2),
                pct(h.deployed.ratio_spread().median),
                pct(h.finer.ratio_spread().median),
            ]
        )
    return header, rows


def grid_moves(rep: SuiteFrontier) -> float:
    """The largest move of a headline's median saving or accuracy ratio, in points."""
    moves = [0.0]
    for h in rep.headlines:
        moves.append(abs(h.finer.saved_spread().median - h.deployed.saved_spread().median))
        moves.append(abs(h.finer.ratio_spread().median - h.deployed.ratio_spread().median))
    return 100 * max(moves)


# ---- each verifier over the splits ------------------------------------------------------------------------


def verifier_rows(h: Headline, shown: set[str] | None = None) -> tuple[list[str], list[list[str]]]:
    header = [
        "verifier",
        "met on calibration (splits)",
        "accuracy / GPT-4's",
        "saved",
        "held out below target",
        "deployed (splits)",
    ]
    deployed = dict(h.deployed.most_deployed())
    rows = []
    for o in h.per_verifier:
        if shown is not None and o.label not in shown and o.label not in deployed:
            continue
        rows.append(
            [
                f"`{o.label}`",
                pct(float(o.met.mean())),
                spread(o.ratio_spread()),
                spread(o.saved_spread()),
                pct(o.missed_share),
                pct(deployed.get(o.label, 0.0)),
            ]
        )
    return header, rows


# ---- the anchors ------------------------------------------------------------------------------------------


def anchor_rows(reports: Sequence[SuiteFrontier]) -> tuple[list[str], list[list[str]]]:
    header = [
        "suite",
        "RouteLLM, published (routes before generation)",
        "here: Mixtral → GPT-4 verified, 95% (median)",
        "here: 99% (median)",
        "GPT-4 calls avoided at 95% (median)",
        "ceiling: a perfect verifier",
        "Mixtral / GPT-4 accuracy",
    ]
    rows = []
    for rep in reports:
        a = rep.anchor
        if a is None:
            continue
        h95, h99 = a.measured.get(0.95), a.measured.get(0.99)
        rows.append(
            [
                rep.suite,
                pct(a.published, 0),
                "cannot be verified" if h95 is None else spread(h95.deployed.saved_spread()),
                "cannot be verified" if h99 is None else spread(h99.deployed.saved_spread()),
                "–" if h95 is None else pct(h95.deployed.answered_spread()[0].median),
                pct(a.ceiling),
                f"{pct(a.mixtral_accuracy)} / {pct(a.gpt4_accuracy)}",
            ]
        )
    return header, rows


def anchor_verdict(reports: Sequence[SuiteFrontier]) -> list[str]:
    lines = []
    for rep in reports:
        a = rep.anchor
        if a is None:
            continue
        h = a.measured.get(0.95)
        if h is None:
            lines.append(f"- **{rep.suite}**: {a.why_not}. RouteLLM's {pct(a.published, 0)} cannot be checked here.")
            continue
        med = h.deployed.saved_spread().median
        goal = "met" if med >= a.published else "**missed**"
        lines.append(
            f"- **{rep.suite}**: the target, at least {pct(a.published, 0)} saved at 95% of GPT-4's held-out accuracy "
            f"on the median split, is {goal}: {pct(med)} (ceiling {pct(a.ceiling)}; held-out accuracy below 95% of "
            f"GPT-4's on {pct(h.deployed.missed_share)} of splits)."
        )
        if med < a.published:
            lines.append(f"  What limits it: {limit(rep, h)}")
    return lines


def limit(rep: SuiteFrontier, h: Headline) -> str:
    """Why the verified cascade saves less than asked: how many of Mixtral's answers a signal can
    vouch for, how precisely, and what is missing."""
    vouch = sorted(
        (s for s in rep.signals if s.top_accuracy is not None and s.top_share > 0),
        key=lambda s: -(s.top_accuracy or 0.0),
    )
    parts = [
        "the answers a signal vouches for outright (scores 1): "
        + "; ".join(f"`{s.label}` {pct(s.top_share)} of them, right on {pct(s.top_accuracy)}" for s in vouch)
        + (f" (Mixtral is right on {pct(rep.anchor.mixtral_accuracy)} overall)" if rep.anchor else "")
    ]
    parts += [n.rstrip(".") for n in rep.signal_notes]
    return "; ".join(parts) + "."


# ---- the figure -------------------------------------------------------------------------------------------


def price_figure(reports: Sequence[SuiteFrontier]) -> bytes:
    """Median held-out saving (and, at 95%, the range of 95% of splits) against the multiple of
    today's local price per busy hour, one line per headline (`evals.report.figures.price_png`)."""
    from evals.report.figures import price_png

    lines = [
        (
            f"{rep.suite}: {h.cascade}, {pct(h.share, 0)}",
            h.deployed,
            "-" if h.share == 0.95 else "--",
            h.share == 0.95,
            f"{rep.suite} {h.cascade}",
        )
        for rep in reports
        for h in rep.headlines
    ]
    return price_png(lines, "What the cascades save against GPT-4 as the local machine's price moves")
