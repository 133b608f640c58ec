"""What every `tierroute eval` command shares: where runs live, the config, and a stored run
loaded as a result table (repriced, narrowed to some tiers, with the learned estimators' columns
attached), so `sweep`, `calibrate` and `report` read a run the same way.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DEFAULT_RUNS_DIR = "runs"
ESTIMATORS_HELP = (
    "add the learned verifier and the pre-router trained by `eval train --out DIR` "
    "(their stored out-of-fold and held-out predictions)"
)


def add_runs_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", default=DEFAULT_RUNS_DIR, help=f"where runs live (default: ./{DEFAULT_RUNS_DIR})")


def settings_of(args: argparse.Namespace) -> Any:
    from router.config import load_settings

    return load_settings(args.config)


def run_dir(args: argparse.Namespace, run: str) -> Path:
    path = Path(run)
    if (path / "manifest.json").is_file():
        return path
    return Path(args.runs_dir) / run


def table_of(args: argparse.Namespace, run: str, prices: Any = None) -> Any:
    """`prices` (tier name -> PriceSettings) overrides the run's price sheet and `--reprice`."""
    from evals.store import RunStore
    from evals.sweep import load_table

    if prices is None and getattr(args, "reprice", False):
        settings = settings_of(args)
        prices = {t.name: t.price for t in settings.tiers}
    store = RunStore(run_dir(args, run))
    tiers = args.tiers.split(",") if getattr(args, "tiers", None) else None
    table = load_table(store, prices=prices, tiers=tiers)
    if getattr(args, "estimators", None):
        from evals.learned_comparison import attach, load_predictions

        preds = load_predictions(args.estimators)
        seed, fraction = getattr(args, "seed", preds.seed), getattr(args, "fraction", preds.fraction)
        table = attach(table, preds, seed=seed, fraction=fraction)
    return table
