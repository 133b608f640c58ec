"""`tierroute eval regrade`: stored runs graded again by their suites' current graders, from the
stored answers, without loading a model (see `evals.regrade`).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from evals.commands.common import add_runs_dir, run_dir


def cmd_regrade(args: argparse.Namespace) -> int:
    from evals.regrade import regrade
    from evals.store import RunStore
    from evals.suites import get_suite

    cache_dir = Path(args.cache_dir) if args.cache_dir else None
    for run in args.runs:
        with RunStore(run_dir(args, run)) as store:
            suite = get_suite(args.suite or store.manifest()["suite"]["name"])
            done = asyncio.run(regrade(store, suite, cache_dir))
        moved = f"; {len(done.changed)} verdict(s) changed" if done.changed else ""
        print(f"{done.run}: {done.before} -> {done.after}, {done.graded} answer(s) graded{moved}")
        for line in done.changed:
            print(f"  {line}")
    return 0


def register(esub: Any, add: Any) -> None:
    p = add(
        "regrade",
        "grade stored runs again with their suites' current graders, from the stored answers (no model)",
        cmd_regrade,
        esub,
    )
    add_runs_dir(p)
    p.add_argument("runs", nargs="+", help="run names or directories")
    p.add_argument("--suite", default=None, help="the suite to grade with (default: the one each run names)")
    p.add_argument("--cache-dir", default=None, help="where the suite's data is cached (default: the XDG cache)")
