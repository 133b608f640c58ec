"""Whole-sweep and held-out AUROC and APGR of config-expressible combinations of GSM8K verifiers
(the weighted `mean` a tier's `combine` applies), beside the verifiers alone, from the committed
run: the figures docs/eval-results.md gives for `mean(self_consistency, confidence_min)`.

    .venv/bin/python scripts/gsm8k_combinations.py [--run evals/results/gsm8k] [--seed 0] [--search]

`--search` also chooses weights (each of `SEARCHED` at 0, 0.5, 1 or 2) by APGR on the calibration
half alone, then reports the chosen combination over all items and on the held-out half, and its
cascade calibrated for min-pgr=0.8 on the calibration half (held-out accuracy, cost and the
break-even price ratio, as `eval report` computes them). The held-out half never takes part in
the choice; the whole-sweep figure does include the half it was chosen on.

No model, nothing written.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from pathlib import Path

from evals.breakeven import analyse, scaled_top_prices
from evals.calibrate import Target, calibrate, split
from evals.store import RunStore
from evals.sweep import ItemOutcome, ResultTable, load_table, summarize
from router import policy

SC = "self_consistency[k=3]"
CMIN = "confidence_min"
CROSS = 'cross_tier[tier="large"]'
POT = "execution_pot"
XMIN = "cross_tier_min"
EXEC = "execution"
SEARCHED = (SC, XMIN, EXEC, CMIN, CROSS)
WEIGHTS = (0.0, 0.5, 1.0, 2.0)
COMBINATIONS = {
    "mean(sc, cmin)": (SC, CMIN),
    "mean(sc, cmin, cross_tier)": (SC, CMIN, CROSS),
    "mean(sc, cmin, execution_pot)": (SC, CMIN, POT),
    "mean(cmin, cross_tier)": (CMIN, CROSS),
}


def with_combination(
    item: ItemOutcome, label: str, members: tuple[str, ...], weights: tuple[float, ...] | None = None
) -> ItemOutcome:
    """The item with the combination scored on its first tier as the cascade would combine it."""
    first = item.tiers[0]
    w = weights or (1.0,) * len(members)
    scores = {
        **first.scores,
        label: policy.combine([(first.scores[m], x) for m, x in zip(members, w, strict=True)], "mean"),
    }
    cost = {**first.verify_cost_usd, label: sum(first.verify_cost_usd[m] for m in members)}
    took = {**first.verify_s, label: max(first.verify_s[m] for m in members)}
    first = dataclasses.replace(first, scores=scores, verify_cost_usd=cost, verify_s=took)
    rest = tuple(dataclasses.replace(t, scores={**t.scores, label: 1.0}) for t in item.tiers[1:])
    return dataclasses.replace(item, tiers=(first, *rest))


def with_column(table: ResultTable, label: str, members: tuple[str, ...], weights: tuple[float, ...]) -> ResultTable:
    items = [with_combination(it, label, members, weights) for it in table.items]
    return dataclasses.replace(table, items=items, verifiers=[*table.verifiers, label])


def search(table: ResultTable, top_free: ResultTable, seed: int) -> None:
    """Weights chosen by APGR on the calibration half; the choice reported everywhere."""
    calib, _ = split(table, seed, 0.5)
    best: tuple[float, tuple[str, ...], tuple[float, ...]] | None = None
    for weights in itertools.product(WEIGHTS, repeat=len(SEARCHED)):
        members = tuple(m for m, w in zip(SEARCHED, weights, strict=True) if w > 0)
        if len(members) < 2:
            continue
        kept = tuple(w for w in weights if w > 0)
        apgr = summarize(with_column(calib, "searched", members, kept), "searched").apgr
        if best is None or apgr > best[0] + 1e-12:
            best = (apgr, members, kept)
    assert best is not None
    _, members, kept = best
    label = "mean(" + ", ".join(f"{m}*{w:g}" for m, w in zip(members, kept, strict=True)) + ")"
    chosen, chosen_free = with_column(table, label, members, kept), with_column(top_free, label, members, kept)
    calib_part, held = split(chosen, seed, 0.5)
    every, half, on_calib = summarize(chosen, label), summarize(held, label), summarize(calib_part, label)
    print(f"\nchosen on the calibration half ({len(WEIGHTS) ** len(SEARCHED)} weightings of {', '.join(SEARCHED)}):")
    print(f"  {label}")
    print(f"  calibration half: AUROC {on_calib.auroc[0] or 0:.3f}, APGR {on_calib.apgr:.3f}")
    print(f"  all items:        AUROC {every.auroc[0] or 0:.3f}, APGR {every.apgr:.3f}")
    print(f"  held-out half:    AUROC {half.auroc[0] or 0:.3f}, APGR {half.apgr:.3f}")
    cal = calibrate(chosen, label, Target("min-pgr", 0.8), seed=seed)
    small, large = cal.held_out_tiers[0], cal.held_out_tiers[-1]
    print(
        f"  calibrated for min-pgr=0.8 (threshold {cal.thresholds}), held-out: {cal.held_out.accuracy:.1%} at "
        f"${cal.held_out.cost_per_1k:.2f} / 1k, {cal.held_out.escalation_rate:.1%} escalated "
        f"(small alone {small.accuracy:.1%} at ${small.cost_per_1k:.2f}, large alone {large.accuracy:.1%} at "
        f"${large.cost_per_1k:.2f})"
    )
    report = analyse(chosen, chosen_free, [cal])
    row = report.rows[0]
    ratio = f"{row.ratio:.1f}" if row.ratio is not None else f"never ({row.never_because})"
    print(
        f"  break-even price ratio (recorded r0 = {report.base_ratio:.1f}): {ratio}; savings at 10x / 30x / 100x: "
        + " / ".join(f"{(row.savings_at(r) or 0):.1%}" for r in (10, 30, 100))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, default=Path("evals/results/gsm8k"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--search", action="store_true", help="choose weights on the calibration half")
    args = parser.parse_args()
    store = RunStore(args.run)
    table = load_table(store)
    if args.search:
        search(table, load_table(store, prices=scaled_top_prices(table, 0.0)), args.seed)
        return
    items = list(table.items)
    for label, members in COMBINATIONS.items():
        items = [with_combination(it, label, members) for it in items]
    table = dataclasses.replace(table, items=items, verifiers=[*table.verifiers, *COMBINATIONS])
    _, held = split(table, args.seed, 0.5)
    print(f"{'column':32s} {'AUROC all':>10s} {'APGR all':>9s} {'AUROC held':>11s} {'APGR held':>10s}")
    for column in (SC, CMIN, CROSS, POT, *COMBINATIONS):
        every, half = summarize(table, column), summarize(held, column)
        print(
            f"{column:32s} {every.auroc[0] or 0:10.3f} {every.apgr:9.3f} {half.auroc[0] or 0:11.3f} {half.apgr:10.3f}"
        )


if __name__ == "__main__":
    main()
