"""`tierroute eval report`: the Markdown, HTML and CSV report of stored runs (see `evals.report`),
headed by the command that regenerates it, spelled the same however it was typed.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from evals.commands.common import ESTIMATORS_HELP, add_runs_dir, table_of
from router.errors import ConfigError


def cmd_report(args: argparse.Namespace) -> int:
    from evals.breakeven import scaled_top_prices
    from evals.calibrate import Target
    from evals.report.pages import write
    from evals.report.suite import build, local_prices

    target = Target.parse(args.target)
    if args.splits < 200:
        raise ConfigError("--splits: at least 200 random splits make a median and a 95% range")
    reports = []
    for run in args.runs:
        table = table_of(args, run)
        # the same run with the top tier free: the part of each cost that does not scale with its price
        top_free = table_of(args, run, scaled_top_prices(table, 0.0)) if len(table.tiers) > 1 else None
        # the same run with the local machine free: the part of each cost its price per busy hour scales
        local_free = table_of(args, run, local_prices(table, 0.0)) if len(table.tiers) > 1 else None
        reports.append(
            build(
                table,
                target,
                seed=args.seed,
                fraction=args.fraction,
                top_free=top_free,
                local_free=local_free,
                n_splits=args.splits,
            )
        )
    if args.estimators:
        from evals.learned_comparison import compare

        for r in reports:
            r.learned = compare(r.table, target, seed=args.seed, fraction=args.fraction)
            r.notes.append(
                f"`learned` and the pre-router come from `{args.estimators}`: calibration items carry out-of-fold "
                "predictions (each from a model fit without it), held-out items the final model's. Numbers over "
                "all items mix the two; the learned-estimator section below is held-out only."
            )
    command = args.command_line or _report_command(args)
    written = write(reports, Path(args.out), command=command)
    for path in written:
        print(path)
    return 0


def _report_command(args: argparse.Namespace) -> str:
    """The command that regenerates this report, spelled the same however it was typed."""
    from evals.calibrate import split_options
    from evals.splits import SPLITS

    parts = [
        "tierroute",
        "eval",
        "report",
        *args.runs,
        "--runs-dir",
        args.runs_dir,
        "--out",
        args.out,
        "--target",
        args.target,
    ]
    parts += split_options(args)
    if args.splits != SPLITS:
        parts += ["--splits", str(args.splits)]
    if args.estimators:
        parts += ["--estimators", args.estimators]
    return " ".join(shlex.quote(p) for p in parts)


def register(esub: Any, add: Any) -> None:
    p = add("report", "Markdown + self-contained HTML + CSV report from stored runs", cmd_report, esub)
    add_runs_dir(p)
    p.add_argument("runs", nargs="+", help="run names or directories (one per suite)")
    p.add_argument("--out", default="eval-report", help="output directory (default ./eval-report)")
    p.add_argument("--target", default="min-pgr=0.8", help="calibration target for the held-out section")
    p.add_argument("--seed", type=int, default=0, help="fixes the calibration split (default 0)")
    p.add_argument("--fraction", type=float, default=0.5, help="share of items used to calibrate (default 0.5)")
    p.add_argument("--tiers", default=None, help="comma-separated subset of the runs' tiers, cheapest first")
    p.add_argument("--reprice", action="store_true", help="price with the config's price sheet, not the runs'")
    p.add_argument("--estimators", default=None, metavar="DIR", help=ESTIMATORS_HELP)
    p.add_argument("--splits", type=int, default=200, help="random calibration/held-out splits (default 200)")
    p.add_argument("--command-line", default=None, help=argparse.SUPPRESS)
