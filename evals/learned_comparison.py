"""Learned estimators in the sweep, the calibration and the report: their stored predictions as
score columns, and the comparison of the routing policies they make possible.

`eval train` writes each (item, tier)'s predictions beside the artifacts: for a calibration item
the out-of-fold prediction (from a model that never saw it), for a held-out item the final
model's. `attach` adds them to a run's table:

- `learned`, a verifier column like any other, carrying the cost and latency of the verifiers it
  computes at serve time (their sum and their max: they run concurrently);
- `prerouter`, a score column read only by the pre-route policies (it is not an answer check, so
  it is not swept as a verifier).

The split the predictions were made for must be the one the caller calibrates with: an item
held out in training must be held out here, or it would be scored by a model that saw it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evals.calibrate import (
    Calibration,
    PreRouteCalibration,
    Target,
    calibrate,
    calibrate_preroute,
    in_calibration,
    split,
)
from evals.formatting import html_table, inline, md_table, num, pct, th, usd
from evals.sweep import CONFIG, ResultTable, TierOutcome, score_quality, summarize
from router.errors import ConfigError

LEARNED = "learned"
PREROUTER = "prerouter"
MANIFEST = "estimators.json"
PREDICTIONS = "predictions.jsonl"
MAX_DROP = 0.01  # the pre-router may cost at most this much accuracy against verify-only


@dataclass(frozen=True)
class Predictions:
    root: Path
    manifest: dict[str, Any]
    rows: dict[tuple[str, str, str], dict[str, Any]]  # (run, item, tier) -> row

    @property
    def seed(self) -> int:
        return int(self.manifest["seed"])

    @property
    def fraction(self) -> float:
        return float(self.manifest["fraction"])

    def members(self, run: str) -> list[str]:
        """The verifier labels the learned verifier of `run` computes at serve time."""
        return list(self.manifest.get("feature_verifiers", {}).get(run, []))


def load_predictions(root: Path | str) -> Predictions:
    root = Path(root)
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        rows = {}
        with open(root / PREDICTIONS, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    rows[(row["run"], row["item"], row["tier"])] = row
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{root}: not a directory written by `tierroute eval train` ({exc})") from None
    return Predictions(root, manifest, rows)


def attach(table: ResultTable, preds: Predictions, *, seed: int, fraction: float) -> ResultTable:
    """`table` with the `learned` and `prerouter` columns of `preds`. Refuses a split other than
    the one the estimators were trained with."""
    if (seed, fraction) != (preds.seed, preds.fraction):
        raise ConfigError(
            f"the estimators in {preds.root} were trained on the calibration split of seed {preds.seed}, fraction "
            f"{preds.fraction:g}; calibrating with seed {seed}, fraction {fraction:g} would score items they were "
            "trained on as held-out. Use the same --seed and --fraction, or retrain."
        )
    names = [t.name for t in table.tiers]
    learned: dict[str, list[float | None]] = {}
    pre: dict[str, list[float]] = {}
    for it in table.items:
        rows = [preds.rows.get((table.run, it.id, n)) for n in names]
        if any(r is None for r in rows):
            raise ConfigError(
                f"{preds.root} has no predictions for item {it.id} of run {table.run} on every tier "
                f"({', '.join(names)}); retrain on this run"
            )
        side = "calibration" if in_calibration(it.id, seed, fraction) else "held-out"
        if any(r["split"] != side for r in rows):  # type: ignore[index]
            raise ConfigError(f"{preds.root}: item {it.id} was on the other side of the split in training")
        # None: the learned verifier has no model for that tier (trained with --deciding-tiers)
        learned[it.id] = [None if r["learned"] is None else float(r["learned"]) for r in rows]  # type: ignore[index]
        pre[it.id] = [float(r["prerouter"]) for r in rows]  # type: ignore[index]
    members = preds.members(table.run)

    def features_cost(t: TierOutcome) -> tuple[float, float]:  # it computes its feature verifiers, concurrently
        paid = [m for m in members if m in t.verify_cost_usd]
        return sum(t.verify_cost_usd[m] for m in paid), max((t.verify_s.get(m, 0.0) for m in paid), default=0.0)

    out = table.with_scores(LEARNED, learned, cost=features_cost)
    return out.with_scores(PREROUTER, pre, verifier=False)  # the pre-router is not an answer check


# ---- the comparison ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeldOutQuality:
    column: str
    tier: str
    n: int
    auroc: float | None
    brier: float | None
    ece: float | None


@dataclass
class Comparison:
    """Held-out quality of every estimator column, and the routing policies at their calibrated
    points, on one run; with the issue's three targets checked."""

    table: ResultTable
    target: Target
    quality: list[HeldOutQuality]
    verify_only: dict[str, Calibration]  # verifier label -> calibrated cascade
    best_single: str | None  # the built-in verifier with the best AUROC on the calibration split
    preroute_only: PreRouteCalibration
    preroute_verify: dict[str, PreRouteCalibration]  # verifier label -> pre-route then verify
    # the learned cascade calibrated for the accuracy the best single verifier's cascade reaches on
    # the calibration split (min-accuracy=that): the two compared at one accuracy level, still
    # chosen without a held-out item
    matched: Calibration | None = None

    def quality_of(self, column: str) -> HeldOutQuality | None:
        """The column's held-out quality on the first tier (the one a cascade decides on)."""
        name = self.table.tiers[0].name
        return next((q for q in self.quality if q.column == column and q.tier == name), None)

    def checks(self, *, short: bool = False) -> list[tuple[str, bool | None, str]]:
        """(target, met, the numbers behind it); None where it cannot be decided. `short` gives
        the numbers alone, for a table."""
        out: list[tuple[str, bool | None, str]] = []
        first = self.table.tiers[0].name
        lq = self.quality_of(LEARNED)
        singles = [q for q in self.quality if q.tier == first and q.column not in (LEARNED, PREROUTER, CONFIG)]
        best_q = max((q for q in singles if q.auroc is not None), key=lambda q: q.auroc or 0.0, default=None)
        if lq is None or lq.auroc is None or best_q is None:
            out.append(("learned AUROC beats the best single verifier", None, "undefined: one class only"))
        else:
            out.append(
                (
                    "learned AUROC beats the best single verifier",
                    lq.auroc > (best_q.auroc or 0.0),
                    f"{lq.auroc:.3f} vs {best_q.auroc:.3f}"
                    if short
                    else f"{lq.auroc:.3f} against {best_q.column} {best_q.auroc:.3f} ({first}, held-out)",
                )
            )
        if self.best_single is not None and LEARNED in self.verify_only:
            s, ref = self.verify_only[LEARNED].held_out, self.verify_only[self.best_single].held_out
            ok = s.cost_per_1k < ref.cost_per_1k and s.accuracy >= ref.accuracy - 1e-12
            pv = self.preroute_verify.get(LEARNED)
            ok_pv = (
                pv is not None
                and pv.held_out.cost_per_1k < ref.cost_per_1k
                and pv.held_out.accuracy >= ref.accuracy - 1e-12
            )
            text = (
                f"verify[learned] {100 * s.accuracy:.1f}% at ${s.cost_per_1k:.4f}/1k; "
                f"verify[{self.best_single}] {100 * ref.accuracy:.1f}% at ${ref.cost_per_1k:.4f}/1k"
            )
            if pv is not None:
                text += (
                    f"; pre-route then verify[learned] {100 * pv.held_out.accuracy:.1f}%"
                    f" at ${pv.held_out.cost_per_1k:.4f}/1k"
                )
            m = self.matched.held_out if self.matched is not None else None
            ok_m = m is not None and m.cost_per_1k < ref.cost_per_1k and m.accuracy >= ref.accuracy - 1e-12
            if m is not None:
                text += (
                    f"; verify[learned] matched to its calibration accuracy {100 * m.accuracy:.1f}%"
                    f" at ${m.cost_per_1k:.4f}/1k"
                )
            if short:
                best = s if ok else pv.held_out if pv is not None and ok_pv else m if m is not None and ok_m else s
                text = (
                    f"{100 * best.accuracy:.1f}% ${best.cost_per_1k:.3f} vs "
                    f"{100 * ref.accuracy:.1f}% ${ref.cost_per_1k:.3f}"
                )
            out.append(("learned cascade cheaper at equal or better accuracy", ok or ok_pv or ok_m, text))
        for label, pv in self.preroute_verify.items():
            drop = pv.accuracy_drop
            against = "best single" if short and label == self.best_single and label != LEARNED else label
            out.append(
                (
                    f"pre-router costs at most {100 * MAX_DROP:.0f} point against verify[{against}]",
                    None if drop is None else drop <= MAX_DROP + 1e-12,
                    "–"
                    if drop is None
                    else (
                        f"{100 * drop:+.2f} pt, {100 * pv.skip_rate:.0f}% skipped"
                        + ("" if against == label else f", {label}")
                        if short
                        else f"{100 * drop:+.2f} points (held-out, {pv.n_held_out} items), skipping "
                        f"{100 * pv.skip_rate:.1f}% of first-tier calls"
                    ),
                )
            )
        return out


def compare(
    table: ResultTable, target: Target, *, seed: int, fraction: float, max_drop: float = MAX_DROP
) -> Comparison:
    """Everything on `table` (with the estimator columns attached) at points calibrated on the
    calibration split, reported on the held-out split."""
    if LEARNED not in table.verifiers:
        raise ValueError("attach the estimator columns first")
    calib, held = split(table, seed, fraction)
    quality = [
        HeldOutQuality(column, t.name, q.n, q.auroc, q.brier, q.ece)
        for column in [*table.verifiers, PREROUTER]
        for t, q in zip(table.tiers, score_quality(held, column), strict=True)
        if q is not None
    ]
    verify_only = {v: calibrate(table, v, target, seed=seed, fraction=fraction) for v in table.verifiers}
    singles = [v for v in table.verifiers if v not in (LEARNED, CONFIG)]
    ranked = [((summarize(calib, v, curve=[]).auroc[0] or -1.0), v) for v in singles]
    best_single = max(ranked)[1] if ranked else None
    pv = {}
    for v in dict.fromkeys([LEARNED, *([best_single] if best_single else [])]):
        pv[v] = calibrate_preroute(
            table,
            PREROUTER,
            target,
            verifier=v,
            seed=seed,
            fraction=fraction,
            max_drop=max_drop,
            reference=verify_only[v],
        )
    matched = None
    if best_single is not None:
        level = verify_only[best_single].calibration.accuracy
        matched = calibrate(table, LEARNED, Target("min-accuracy", level), seed=seed, fraction=fraction)
    return Comparison(
        table=table,
        target=target,
        quality=quality,
        verify_only=verify_only,
        best_single=best_single,
        preroute_only=calibrate_preroute(table, PREROUTER, target, seed=seed, fraction=fraction),
        preroute_verify=pv,
        matched=matched,
    )


def policy_rows(c: Comparison) -> tuple[list[str], list[list[str]]]:
    """The policies at their calibrated points, on held-out items: a Markdown/HTML table."""
    header = [
        "policy",
        "settings (chosen on the calibration split)",
        "accuracy",
        "cost / 1k",
        "escalation",
        "skipped first tier",
        "savings vs top",
    ]
    rows = []
    for v, cal in c.verify_only.items():
        if v not in (LEARNED, c.best_single):
            continue
        tag = " (best single verifier)" if v == c.best_single else ""
        r = cal.held_out
        rows.append(
            [
                f"verify only[{v}]{tag}",
                ", ".join(f"{n} ≥ {th(x)}" for n, x in cal.thresholds.items()),
                pct(r.accuracy),
                usd(r.cost_per_1k),
                pct(r.escalation_rate),
                "–",
                pct(r.savings),
            ]
        )
    if c.matched is not None and c.best_single is not None:
        r, ref = c.matched.held_out, c.verify_only[c.best_single].calibration
        rows.append(
            [
                f"verify only[{LEARNED}], matched to the best single verifier",
                ", ".join(f"{n} ≥ {th(x)}" for n, x in c.matched.thresholds.items())
                + f" (min-accuracy={100 * ref.accuracy:.1f}%, its calibration accuracy)",
                pct(r.accuracy),
                usd(r.cost_per_1k),
                pct(r.escalation_rate),
                "–",
                pct(r.savings),
            ]
        )
    for p in [c.preroute_only, *c.preroute_verify.values()]:
        r = p.held_out
        settings = ", ".join(f"skip {n} below {th(x)}" for n, x in p.skip_below.items())
        if p.thresholds:
            settings += "; " + ", ".join(f"{n} ≥ {th(x)}" for n, x in p.thresholds.items())
        rows.append(
            [
                p.policy,
                settings,
                pct(r.accuracy),
                usd(r.cost_per_1k),
                pct(r.escalation_rate),
                pct(p.skip_rate),
                pct(r.savings),
            ]
        )
    for t in c.verify_only[LEARNED].held_out_tiers:
        rows.append([f"*always {t.policy}*", "–", pct(t.accuracy), usd(t.cost_per_1k), "–", "–", pct(t.savings)])
    return header, rows


def quality_rows(c: Comparison) -> tuple[list[str], list[list[str]]]:
    header = ["estimator / verifier", *(f"{k} ({t.name})" for t in c.table.tiers for k in ("AUROC", "Brier", "ECE"))]
    rows = []
    for column in dict.fromkeys(q.column for q in c.quality):
        row = [column + (" *(prompt only)*" if column == PREROUTER else "")]
        for t in c.table.tiers:
            q = next((q for q in c.quality if q.column == column and q.tier == t.name), None)
            row += ["–"] * 3 if q is None else [num(q.auroc), num(q.brier), num(q.ece)]
        rows.append(row)
    return header, rows


def comparison_markdown(cmp: Comparison, *, level: int = 3) -> list[str]:
    h = "#" * level
    t = cmp.table
    n_cal = cmp.verify_only[LEARNED].n_calibration
    n_held = cmp.verify_only[LEARNED].n_held_out
    lines = [f"{h} {t.suite}: learned estimators ({n_cal} calibration items, {n_held} held-out)", ""]
    lines += [f"{h}# Held-out quality", "", *md_table(*quality_rows(cmp)), ""]
    lines += [
        f"{h}# Policies at calibrated points (`{cmp.target}`), held-out items",
        "",
        *md_table(*policy_rows(cmp)),
        "",
    ]
    lines += [f"{h}# Targets", ""]
    for what, ok, numbers in cmp.checks():
        mark = "met" if ok else ("undecided" if ok is None else "**missed**")
        lines.append(f"- {what}: {mark} ({numbers})")
    return lines


def comparison_json(cmp: Comparison) -> dict[str, Any]:
    return {
        "suite": cmp.table.suite,
        "run": cmp.table.run,
        "target": str(cmp.target),
        "quality": [q.__dict__ for q in cmp.quality],
        "verify_only": {
            v: {"thresholds": c.thresholds, "held_out": c.held_out.as_row()} for v, c in cmp.verify_only.items()
        },
        "best_single": cmp.best_single,
        "matched": None
        if cmp.matched is None
        else {
            "target": str(cmp.matched.target),
            "thresholds": cmp.matched.thresholds,
            "held_out": cmp.matched.held_out.as_row(),
        },
        "preroute_only": {
            "skip_below": cmp.preroute_only.skip_below,
            "held_out": cmp.preroute_only.held_out.as_row(),
            "skip_rate": cmp.preroute_only.skip_rate,
        },
        "preroute_verify": {
            v: {
                "skip_below": c.skip_below,
                "thresholds": c.thresholds,
                "held_out": c.held_out.as_row(),
                "accuracy_drop": c.accuracy_drop,
                "skip_rate": c.skip_rate,
            }
            for v, c in cmp.preroute_verify.items()
        },
        "checks": [{"target": w, "met": ok, "numbers": n} for w, ok, n in cmp.checks()],
    }


def comparison_html(cmp: Comparison) -> str:
    t = cmp.table
    parts = [
        f"<h3>{inline(t.suite)}: learned estimators</h3>",
        "<h4>Held-out quality</h4>",
        html_table(*quality_rows(cmp)),
        f"<h4>Policies at calibrated points ({inline(str(cmp.target))}), held-out items</h4>",
        html_table(*policy_rows(cmp)),
        "<h4>Targets</h4><ul>",
    ]
    for what, ok, numbers in cmp.checks():
        mark = "met" if ok else ("undecided" if ok is None else "<b>missed</b>")
        parts.append(f"<li>{inline(what)}: {mark} ({inline(numbers)})</li>")
    return "".join(parts) + "</ul>"


def pooled(tables: Sequence[ResultTable]) -> ResultTable:
    """Several runs' tables as one (same tiers, in order): for thresholds that serve them all."""
    first = tables[0]
    names = [t.name for t in first.tiers]
    for t in tables[1:]:
        if [x.name for x in t.tiers] != names:
            raise ConfigError(f"runs {first.run} and {t.run} have different tiers; train them separately")
    common = [v for v in first.verifiers if all(v in t.verifiers for t in tables)]
    return replace(
        first,
        run="+".join(t.run for t in tables),
        suite="+".join(t.suite for t in tables),
        items=[it for t in tables for it in t.items],
        verifiers=common,
    )
