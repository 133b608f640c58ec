"""The report's sections as (header, rows) tables: one description of each table, which the
Markdown and the HTML page both draw (`pages`), and the rows of the two CSV files.

Kept apart from the prose so a column is added in one place and appears in every output that
shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evals import measures, splits
from evals.breakeven import RATIOS
from evals.formatting import num, pct, sec, th, usd
from evals.report.suite import SuiteReport
from evals.sweep import CONFIG


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
        "APGR, covered range only",
        "CPT(50%)",
        "CPT(80%)",
        "CPT(95%)",
        "AIQ",
    ]
    rows = []
    for v in r.verifiers:
        # a verifier that abstains escalates those answers at every threshold: its sweep starts at
        # the share it abstains on. APGR is over the whole 0..1 range for every verifier, so they
        # compare; the figure over the covered range alone is beside it, with that range
        scored = [it.tiers[0].scores.get(v.verifier) is not None for it in r.table.items]
        low = v.covered_from or 0.0
        covered = "–" if low <= 0.005 or v.apgr_covered is None else f"{num(v.apgr_covered)} (x ≥ {low:.0%})"
        rows.append(
            [
                v.verifier,
                *(num(a) for a in v.auroc),
                num(v.ece[0]),
                num(v.brier[0]),
                pct(sum(scored) / len(scored)) if scored else "–",
                num(v.apgr),
                covered,
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
            num(measures.apgr_full(rand_xy, weak, strong)),
            "–",
            *(pct(measures.cpt(rand_xy, weak, strong, x)) for x in (0.5, 0.8, 0.95)),
            num(measures.aiq([(p.cost_per_1k, p.accuracy) for p in random_curve], min(singles), max(singles))),
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
            "–",
            num(measures.aiq([*tiers_xy, (oracle.cost_per_1k, oracle.accuracy)], min(singles), max(singles))),
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
                        "covered_from": v.covered_from,
                        "apgr_covered": v.apgr_covered,
                    }
                )
    return rows


def _spread(s: splits.Spread) -> str:
    return f"{pct(s.median)} [{pct(s.low)}, {pct(s.high)}]"


def splits_table(r: SuiteReport) -> tuple[list[str], list[list[str]]]:
    """Each verifier's calibrated cascade over the random splits, and the policy the report's rule
    deploys on each, beside the fixed split's own figure and bootstrap interval."""
    sp = r.splits
    assert sp is not None
    header = [
        "verifier",
        "met on calibration (splits)",
        "accuracy (held-out)",
        "savings vs top (held-out)",
        "target met (held-out, splits)",
        "fixed split: savings [bootstrap]",
        "deployed (splits)",
    ]
    deployed = dict(sp.deployed.most_deployed())
    rows = []
    for o in [sp.deployed, *sp.per_verifier]:
        mine = o is sp.deployed
        fixed = None if mine else sp.fixed.get(o.label)
        if mine and r.best is not None:
            fixed = sp.fixed.get(r.best)
        rows.append(
            [
                "*policy chosen afresh (best AUROC on the calibration half)*" if mine else o.label,
                pct(float(o.met.mean())),
                _spread(splits.Spread.of(o.accuracy)),
                _spread(o.saved_spread()),
                pct(1 - o.missed_share),
                "–" if fixed is None else f"{pct(fixed.saved)} [{pct(fixed.saved_ci.low)}, {pct(fixed.saved_ci.high)}]",
                "–" if mine else pct(deployed.get(o.label, 0.0)),
            ]
        )
    return header, rows


def price_table(r: SuiteReport) -> tuple[list[str], list[list[str]]]:
    """The median held-out savings as the local machine's price per busy hour moves, for the policy
    deployed on each split and for `config`, with the break-even multiple."""
    sp = r.splits
    assert sp is not None
    header = [
        "policy",
        *(f"{m:g}× today's ({pct(1 / m, 0)} busy)" for m in splits.MULTIPLIERS),
        "break-even (median savings 0)",
    ]
    shown = [sp.deployed, *(o for o in sp.per_verifier if o.label == CONFIG)]
    rows = []
    for o in shown:
        be = o.break_even()
        rows.append(
            [
                "policy chosen afresh" if o is sp.deployed else o.label,
                *(pct(o.saved_spread(m).median) for m in splits.MULTIPLIERS),
                "saves nothing at today's price"
                if be is None
                else (f"above {be:g}×" if be >= 1000 else f"{be:.2f}× ({pct(1 / be, 0)} busy)"),
            ]
        )
    return header, rows


def splits_rows(reports: Sequence[SuiteReport]) -> list[dict[str, Any]]:
    """splits.csv: each policy's spread over the splits at each local price multiple."""
    out: list[dict[str, Any]] = []
    for r in reports:
        sp = r.splits
        if sp is None:
            continue
        for o in [sp.deployed, sp.finer, *sp.per_verifier]:
            name = "deployed" if o is sp.deployed else ("deployed, finer grid" if o is sp.finer else o.label)
            acc = splits.Spread.of(o.accuracy)
            for m in splits.MULTIPLIERS:
                saved = o.saved_spread(m)
                out.append(
                    {
                        "suite": r.table.suite,
                        "policy": name,
                        "target": str(r.target),
                        "splits": sp.n_splits,
                        "local_price_multiple": m,
                        "savings_median": saved.median,
                        "savings_low": saved.low,
                        "savings_high": saved.high,
                        "accuracy_median": acc.median,
                        "accuracy_low": acc.low,
                        "accuracy_high": acc.high,
                        "held_out_target_met": 1 - o.missed_share,
                        "met_on_calibration": float(o.met.mean()),
                    }
                )
    return out
