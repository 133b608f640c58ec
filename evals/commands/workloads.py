"""`tierroute eval workloads`: where the cascade pays, one row per suite (`evals.report.workloads`):
the median saving at 95% and 99% of the top tier's accuracy over random splits, the ceiling of a
perfect verifier, the prices, and a plot of saving against the quality target. Headed by the
command that regenerates it."""

from __future__ import annotations

import argparse
import csv
import shlex
from pathlib import Path
from typing import Any

from evals.commands.common import add_runs_dir, table_of
from router.errors import ConfigError


def cmd_workloads(args: argparse.Namespace) -> int:
    from evals.report import workloads
    from evals.report.suite import local_prices

    if args.splits < 200:
        raise ConfigError("--splits: at least 200 random splits make a median and a 95% range")
    from router.config import PriceSettings

    as_run, frontier = [], []
    usd_in, usd_out, stands_for = workloads.FRONTIER_PRICE
    for run in args.runs:
        table = table_of(args, run)
        if len(table.tiers) < 2:
            raise ConfigError(f"run {run}: one tier only; a cascade needs two")
        as_run.append(workloads.workload(table, table_of(args, run, local_prices(table, 0.0)), n_splits=args.splits))
        dearer = {t.name: t.price for t in table.tiers}
        dearer[table.tiers[-1].name] = PriceSettings(
            usd_per_1m_input_tokens=usd_in, usd_per_1m_output_tokens=usd_out, stands_for=stands_for
        )
        top_dear = table_of(args, run, dearer)
        frontier.append(
            workloads.workload(top_dear, table_of(args, run, local_prices(top_dear, 0.0)), n_splits=args.splits)
        )
    priced = [("The top tier priced as each run priced it", as_run), (f"The top tier at {stands_for}", frontier)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = ["tierroute", "eval", "workloads", *args.runs, "--runs-dir", args.runs_dir, "--out", args.out]
    if args.splits != 200:
        parts += ["--splits", str(args.splits)]
    command = " ".join(shlex.quote(p) for p in parts)
    page = out / "workloads.md"
    page.write_text(workloads.markdown(priced, command, args.splits), encoding="utf-8")
    png = out / "workloads-savings.png"
    png.write_bytes(workloads.curve_png(priced))
    rows = workloads.csv_rows(priced)
    table_csv = out / "workloads.csv"
    with table_csv.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for path in (page, png, table_csv):
        print(path)
    return 0


def register(esub: Any, add: Any) -> None:
    p = add("workloads", "where the cascade pays: savings per suite at 95%/99% of the top tier", cmd_workloads, esub)
    add_runs_dir(p)
    p.add_argument("runs", nargs="+", help="run names or directories (one per suite, two tiers or more)")
    p.add_argument("--out", default="eval-report", help="output directory (default ./eval-report)")
    p.add_argument("--splits", type=int, default=200, help="random calibration/held-out splits (default 200)")
