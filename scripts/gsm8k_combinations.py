"""Whole-sweep and held-out AUROC and APGR of config-expressible combinations of GSM8K verifiers
(the `mean` a tier's `combine` applies), beside the verifiers alone, from the committed run: the
figures the README gives for `mean(self_consistency, confidence_min)`.

    .venv/bin/python scripts/gsm8k_combinations.py [--run evals/results/gsm8k] [--seed 0]

No model, nothing written.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from evals.calibrate import split
from evals.store import RunStore
from evals.sweep import ItemOutcome, load_table, summarize
from router import policy

SC = "self_consistency[k=3]"
CMIN = "confidence_min"
CROSS = 'cross_tier[tier="large"]'
POT = "execution_pot"
COMBINATIONS = {
    "mean(sc, cmin)": (SC, CMIN),
    "mean(sc, cmin, cross_tier)": (SC, CMIN, CROSS),
    "mean(sc, cmin, execution_pot)": (SC, CMIN, POT),
    "mean(cmin, cross_tier)": (CMIN, CROSS),
}


def with_combination(item: ItemOutcome, label: str, members: tuple[str, ...]) -> ItemOutcome:
    """The item with the combination scored on its first tier as the cascade would combine it."""
    first = item.tiers[0]
    scores = {**first.scores, label: policy.combine([(first.scores[m], 1.0) for m in members], "mean")}
    cost = {**first.verify_cost_usd, label: sum(first.verify_cost_usd[m] for m in members)}
    took = {**first.verify_s, label: max(first.verify_s[m] for m in members)}
    first = dataclasses.replace(first, scores=scores, verify_cost_usd=cost, verify_s=took)
    rest = tuple(dataclasses.replace(t, scores={**t.scores, label: 1.0}) for t in item.tiers[1:])
    return dataclasses.replace(item, tiers=(first, *rest))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, default=Path("evals/results/gsm8k"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    table = load_table(RunStore(args.run))
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
