"""`tierroute eval train`: fit the learned verifier and the pre-router on stored runs, report them
on held-out items, and print the config to paste (see `evals.train`).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from evals.commands.common import add_runs_dir, run_dir


def cmd_train(args: argparse.Namespace) -> int:
    from evals.calibrate import Target
    from evals.train import train
    from evals.train_report import toml_snippet
    from evals.training_data import load_run

    tiers = args.tiers.split(",") if args.tiers else None
    cache_dir = Path(args.cache_dir) if args.cache_dir else None
    runs = [
        load_run(run_dir(args, r), suite=args.suite if len(args.run) == 1 else None, cache_dir=cache_dir, tiers=tiers)
        for r in args.run
    ]
    command = _train_command(args)
    result = train(
        runs,
        Path(args.out),
        seed=args.seed,
        fraction=args.fraction,
        suite_specific=args.suite_specific,
        include_costly=args.with_costly_verifiers,
        deciding_tiers=args.deciding_tiers,
        n_buckets=args.buckets,
        target=Target.parse(args.target),
        command=command,
        splits=args.splits,
    )
    for a in result.artifacts:
        print(f"{result.out / a['file']}  {a['version']}  sha256 {a['sha256']}")
    for cmp in [*result.comparisons, *([result.pooled] if result.pooled else [])]:
        print(f"\n{cmp.table.suite}:")
        for what, ok, numbers in cmp.checks():
            print(f"  {'met   ' if ok else ('?     ' if ok is None else 'MISSED')} {what}: {numbers}")
    print(f"\nreport: {result.out / 'README.md'}")
    final = result.pooled or (result.comparisons[0] if len(result.comparisons) == 1 else None)
    if final is not None:
        print(
            "\n# paste into config.toml (each [[tiers]] entry merges into the tier of that name):\n"
            + toml_snippet(result, final)
        )
    return 0


def _train_command(args: argparse.Namespace) -> str:
    """The command that regenerates this training, spelled the same however it was typed."""
    from evals.calibrate import split_options

    parts = ["tierroute", "eval", "train"]
    for r in args.run:
        parts += ["--run", r]
    parts += ["--runs-dir", args.runs_dir, "--out", args.out, "--target", args.target]
    parts += split_options(args)
    if args.suite_specific:
        parts.append("--suite-specific")
    if args.with_costly_verifiers:
        parts.append("--with-costly-verifiers")
    if args.deciding_tiers:
        parts.append("--deciding-tiers")
    if args.buckets != 1024:
        parts += ["--buckets", str(args.buckets)]
    if args.splits:
        parts += ["--splits", str(args.splits)]
    return " ".join(shlex.quote(p) for p in parts)


def register(esub: Any, add: Any) -> None:
    p = add(
        "train",
        "fit the learned verifier and the pre-router on stored runs; report them on held-out items",
        cmd_train,
        esub,
    )
    add_runs_dir(p)
    p.add_argument(
        "--run",
        action="append",
        required=True,
        metavar="RUN",
        help="run name or directory; repeat to pool several suites into one estimator per tier",
    )
    p.add_argument("--out", required=True, help="directory for the artifacts, predictions and training report")
    p.add_argument("--suite-specific", action="store_true", help="one estimator per run (suite) instead of one pooled")
    p.add_argument("--tiers", default=None, help="comma-separated subset of the runs' tiers, cheapest first")
    p.add_argument("--seed", type=int, default=0, help="the calibration split's seed (default 0; as in eval calibrate)")
    p.add_argument("--fraction", type=float, default=0.5, help="share of items in the calibration split (default 0.5)")
    p.add_argument(
        "--target", default="min-pgr=0.8", help="calibration target for the thresholds (default min-pgr=0.8)"
    )
    p.add_argument("--suite", default=None, help="the suite (name or .jsonl path) of a single run, when not recorded")
    p.add_argument("--cache-dir", default=None, help="where the suites' data files are cached (default: XDG cache)")
    p.add_argument("--buckets", type=int, default=1024, help="hashed prompt n-gram columns (default 1024)")
    p.add_argument(
        "--splits",
        type=int,
        default=0,
        metavar="N",
        help="also retrain on N other calibration splits and report how often each target is met",
    )
    p.add_argument(
        "--with-costly-verifiers",
        action="store_true",
        help="let verifiers that generate (self_consistency, judge) be features: they then run on every request",
    )
    p.add_argument(
        "--deciding-tiers",
        action="store_true",
        help="train the learned verifier only for the tiers that can escalate (all but the last), so verifiers "
        "scored only there, such as cross_tier, can be features",
    )
