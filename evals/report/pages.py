"""The report's pages, README.md and one self-contained report.html, and `write`, which puts
them, the figures and the CSV files of a report into one directory.

The prose that explains the numbers (the assumptions, the break-even definition, each suite's
headline) lives here beside the two page layouts that show it, so both say the same words.
"""

from __future__ import annotations

import base64
import csv
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evals.calibrate import MAX_POINTS
from evals.formatting import html_table, inline, md_table, num, pct, usd
from evals.learned_comparison import comparison_html, comparison_markdown
from evals.report.figures import figures, split_figures
from evals.report.suite import FINER, SuiteReport
from evals.report.tables import (
    breakeven_table,
    calibration_table,
    price_table,
    splits_rows,
    splits_table,
    summary_rows,
    sweep_rows,
    tier_table,
    verifier_table,
)


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
    sp = r.splits
    if sp is not None:
        d = sp.deployed
        lines.append(
            f"Over {sp.n_splits} random splits, the policy chosen afresh on each calibration half (the verifier "
            f"with the best AUROC there, calibrated for {r.target}): **savings against always {r.tiers[-1].name} "
            f"{_spread(d.saved_spread())}** (median [95% of splits]), held-out accuracy {_spread(_acc(d))}, the target "
            f"met on {pct(1 - d.missed_share)} of held-out halves; with the local machine at {splits_price(sp)}."
        )
    if r.configured is not None:
        ths = ", ".join(f"{t.name}={t.threshold:g}" for t in r.table.tiers[:-1])
        lines.append(
            f"The cascade as configured ({ths}), on all items: accuracy {pct(r.configured.accuracy)}, "
            f"{usd(r.configured.cost_per_1k)} per 1k, escalation {pct(r.configured.escalation_rate)}."
        )
    return lines


def _spread(s: Any) -> str:
    return f"{pct(s.median)} [{pct(s.low)}, {pct(s.high)}]"


def _acc(o: Any) -> Any:
    from evals.splits import Spread

    return Spread.of(o.accuracy)


def splits_price(sp: Any) -> str:
    be = sp.break_even
    where = (
        "it saves nothing at today's price"
        if be is None
        else (
            f"it breaks even above {be:g}× today's price"
            if be >= 1000
            else f"it breaks even at {be:.2f}× today's price"
        )
    )
    return f"today's price per busy hour ({', '.join(sp.local_tiers) or 'no tier'}); {where}"


SPLITS_TEXT = (
    "**Over random splits.** A figure calibrated on one half and reported on the other depends on which items "
    "fell where. So every calibrated cascade is also calibrated afresh, by the same code, on the calibration half "
    "of each of many random splits (seeds 1 on, by item id, the same fraction) and reported on that split's "
    "held-out half: the median and the range 95% of the splits fall in. The policy chosen afresh is the verifier "
    "the report names best on that half (its AUROC there), at the thresholds calibrated there. Beside it, the "
    "fixed split's figure with its own 95% bootstrap interval over its held-out items. Learned estimators are not "
    "studied over splits: their stored predictions were made for the fixed split. **Price sensitivity**: the "
    "tiers priced per busy hour stand for a local machine; paying for idle hours is a dearer busy hour (at "
    "utilisation u, 1/u times the price). Each split keeps the policy it chose at today's price and its local "
    "work is repriced; the break-even is the multiple at which the median savings fall to zero."
)


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
    "answers a verifier scored; its AUROC, ECE and Brier are over those answers. When it abstains on "
    "some, its sweep cannot go below that share of escalations; APGR is over the whole range x = 0 to 1 "
    "for every verifier all the same, the curve completed by the two settings every cascade has (accept "
    "every first answer, escalate every answer) and straight lines between them (a random choice per "
    "request between two settings), so a verifier that abstains is not flattered by covering only the "
    "range where it is good. `APGR, covered range only` is RouteLLM's APGR over the range the sweep covers, "
    "shown as (x ≥ share) where that is not the whole range. Combined with a verifier that scores every "
    "answer (a config's `mean` ignores an abstention), it covers the whole range.",
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
    if any(r.splits is not None for r in reports):
        lines += [SPLITS_TEXT + "\n"]
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
        if r.splits is not None:
            lines += _splits_markdown(r, images)
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


def _splits_markdown(r: SuiteReport, images: bool) -> list[str]:
    sp = r.splits
    assert sp is not None
    moved = 100 * abs(sp.finer.saved_spread().median - sp.deployed.saved_spread().median)
    out = [
        f"### Over {sp.n_splits} random splits: `{r.target}`, chosen afresh on each calibration half",
        "",
        *md_table(*splits_table(r)),
        "",
        f"With {FINER}x as many candidate thresholds per tier ({FINER * MAX_POINTS} against {MAX_POINTS}), the chosen "
        f"policy's median savings move by {num(moved, 2)} points ({pct(sp.finer.saved_spread().median)}).",
        "",
    ]
    if sp.left_out:
        out += [f"Not studied over splits: {', '.join(f'`{v}`' for v in sp.left_out)} (fit for the fixed split).", ""]
    out += ["### Price sensitivity: the local machine's price per busy hour", "", *md_table(*price_table(r)), ""]
    if images:
        out += [f"![{r.table.suite}-price.png]({r.table.suite}-price.png)", ""]
    return out


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
    if any(r.splits is not None for r in reports):
        parts.append(f"<p>{inline(SPLITS_TEXT)}</p>")
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
        if r.splits is not None:
            parts.append(f"<h3>Over {r.splits.n_splits} random splits</h3>" + html_table(*splits_table(r)))
            parts.append("<h3>Price sensitivity</h3>" + html_table(*price_table(r)))
        if r.learned is not None:
            parts.append(comparison_html(r.learned))
        for name, png in figs.items():
            if name.startswith(f"{t.suite}-"):
                parts.append(
                    f"<img alt='{html.escape(name)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
                )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


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
    """Write README.md (+ PNGs), report.html, sweep.csv, summary.csv and splits.csv into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    figs: dict[str, bytes] = {}
    for r in reports:
        figs.update(figures(r))
        figs.update(split_figures(r))
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
    if any(r.splits is not None for r in reports):
        _write_csv(out / "splits.csv", splits_rows(reports))
        written.append(out / "splits.csv")
    return written
