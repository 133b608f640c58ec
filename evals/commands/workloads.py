"""`tierroute eval workloads`: where the cascade pays, one row per suite (`evals.report.workloads`):
the median saving at 95% and 99% of the top tier's accuracy over random splits, the ceiling of a
perfect verifier, the prices, and a plot of saving against the quality target. Headed by the
command that regenerates it.

`--top RUN=TOP_RUN[:TIER]` puts another run's tier above a run's first tier: the run's own upper
tiers are left out and the top tier is TOP_RUN's (its only tier, or TIER), joined item by item
(`evals.frontier.cascade.join`). That is how a published frontier tier imported as a run
(`tierroute eval frontier-import ifeval`: GPT-4's IFEval responses) becomes a suite's top tier.
Only the first tier of RUN is read, so RUN's other tiers may still be incomplete."""

from __future__ import annotations

import argparse
import csv
import shlex
from pathlib import Path
from typing import Any

from evals.commands.common import add_runs_dir, run_dir, table_of
from router.errors import ConfigError


def _tops(specs: list[str], runs: list[str]) -> dict[str, tuple[str, str | None]]:
    """`--top RUN=TOP_RUN[:TIER]` options as run -> (top run, tier or None)."""
    out: dict[str, tuple[str, str | None]] = {}
    for spec in specs:
        run, sep, top = spec.partition("=")
        top_run, _, tier = top.partition(":")
        if not sep or not run or not top_run:
            raise ConfigError(f"--top {spec!r}: expected RUN=TOP_RUN[:TIER]")
        if run not in runs:
            raise ConfigError(f"--top {spec!r}: {run} is not one of the runs listed")
        if run in out:
            raise ConfigError(f"--top: {run} given twice")
        out[run] = (top_run, tier or None)
    return out


def _table(args: argparse.Namespace, run: str, top: tuple[str, str | None] | None, prices: Any = None) -> Any:
    """The run as a result table; with `top`, its first tier in front of the top run's tier."""
    if top is None:
        return table_of(args, run, prices)
    from dataclasses import replace

    from evals.frontier.cascade import join
    from evals.store import RunStore
    from evals.sweep import load_table

    store, upper_store = RunStore(run_dir(args, run)), RunStore(run_dir(args, top[0]))
    first = store.manifest()["tiers"][0]["name"]
    tiers = [t["name"] for t in upper_store.manifest()["tiers"]]
    tier = top[1] or (tiers[0] if len(tiers) == 1 else None)
    if tier is None or tier not in tiers:
        raise ConfigError(f"--top {run}={top[0]}: name one of its tiers ({', '.join(tiers)}) as {top[0]}:TIER")
    local = load_table(store, tiers=[first], prices=prices)
    upper = load_table(upper_store, tiers=[tier], prices=prices)
    if local.suite != upper.suite:
        raise ConfigError(f"--top {run}={top[0]}: runs of different suites ({local.suite}, {upper.suite})")
    joined = join(local, upper, [tier])
    if not joined.items:
        raise ConfigError(f"--top {run}={top[0]}: no item has results in both runs")
    return replace(joined, run=local.run)


def cmd_workloads(args: argparse.Namespace) -> int:
    from evals.report import workloads
    from evals.report.suite import local_prices

    if args.splits < 200:
        raise ConfigError("--splits: at least 200 random splits make a median and a 95% range")
    from router.config import PriceSettings

    as_run, frontier = [], []
    usd_in, usd_out, stands_for = workloads.FRONTIER_PRICE
    tops = _tops(args.top, args.runs)
    notes = []
    for run in args.runs:
        top = tops.get(run)
        table = _table(args, run, top)
        if len(table.tiers) < 2:
            raise ConfigError(f"run {run}: one tier only; a cascade needs two")
        if top is not None:
            notes.append(
                f"{run}: the first tier of run `{run}` in front of run `{top[0]}`'s tier `{table.tiers[-1].name}` "
                f"({table.tiers[-1].model}), on the {len(table.items)} items both hold"
            )
        as_run.append(workloads.workload(table, _table(args, run, top, local_prices(table, 0.0)), n_splits=args.splits))
        dearer = {t.name: t.price for t in table.tiers}
        dearer[table.tiers[-1].name] = PriceSettings(
            usd_per_1m_input_tokens=usd_in, usd_per_1m_output_tokens=usd_out, stands_for=stands_for
        )
        top_dear = _table(args, run, top, dearer)
        frontier.append(
            workloads.workload(top_dear, _table(args, run, top, local_prices(top_dear, 0.0)), n_splits=args.splits)
        )
    priced = [("The top tier priced as each run priced it", as_run), (f"The top tier at {stands_for}", frontier)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = ["tierroute", "eval", "workloads", *args.runs]
    for spec in args.top:
        parts += ["--top", spec]
    parts += ["--runs-dir", args.runs_dir, "--out", args.out]
    if args.splits != 200:
        parts += ["--splits", str(args.splits)]
    command = " ".join(shlex.quote(p) for p in parts)
    page = out / "workloads.md"
    page.write_text(workloads.markdown(priced, command, args.splits, notes), encoding="utf-8")
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
    p.add_argument(
        "--top",
        action="append",
        default=[],
        metavar="RUN=TOP_RUN[:TIER]",
        help="put TOP_RUN's tier (a published frontier tier: `eval frontier-import`) above RUN's first tier, "
        "in place of RUN's upper tiers (repeatable)",
    )
    p.add_argument("--out", default="eval-report", help="output directory (default ./eval-report)")
    p.add_argument("--splits", type=int, default=200, help="random calibration/held-out splits (default 200)")
