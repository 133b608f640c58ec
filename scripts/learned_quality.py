"""Whole-sweep AUROC and APGR of a trained `learned` verifier beside the single verifiers, over all
items and over the held-out half, on a committed run: the figures docs/eval-results.md gives for the GSM8K
learned verifier that reads `self_consistency` and `cross_tier`.

    .venv/bin/python scripts/learned_quality.py [--run evals/results/gsm8k] \
        [--estimators docs/eval/estimators-gsm8k-costly] [--seed 0] [VERIFIER ...]

Reads the run and the predictions `tierroute eval train` wrote (calibration items carry
out-of-fold predictions, held-out items the final model's), attaches them as `eval report` does,
and prints, for the small tier, each column's AUROC and APGR (`evals.sweep.summarize`) over all
items and over the held-out split of `--seed`. No model, nothing written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from evals.calibrate import split
from evals.learned_comparison import LEARNED, attach, load_predictions
from evals.store import RunStore
from evals.sweep import load_table, summarize

DEFAULT_COLUMNS = (LEARNED, "self_consistency[k=3]", 'cross_tier[tier="large"]', "confidence_min")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, default=Path("evals/results/gsm8k"))
    parser.add_argument("--estimators", type=Path, default=Path("docs/eval/estimators-gsm8k-costly"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("columns", nargs="*", default=list(DEFAULT_COLUMNS))
    args = parser.parse_args()
    table = load_table(RunStore(args.run))
    table = attach(table, load_predictions(args.estimators), seed=args.seed, fraction=args.fraction)
    _, held = split(table, args.seed, args.fraction)
    print(f"{'column':32s} {'AUROC all':>10s} {'APGR all':>9s} {'AUROC held':>11s} {'APGR held':>10s}")
    for column in args.columns:
        if column not in table.verifiers:
            print(f"{column:32s} not in this run")
            continue
        every, half = summarize(table, column), summarize(held, column)
        print(
            f"{column:32s} {_fmt(every.auroc[0]):>10s} {_fmt(every.apgr):>9s} "
            f"{_fmt(half.auroc[0]):>11s} {_fmt(half.apgr):>10s}"
        )


if __name__ == "__main__":
    main()
