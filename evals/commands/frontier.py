"""`tierroute eval frontier`: what the local small tier saves in front of frontier models whose
per-item answers were published (see `evals.frontier`): imports them as eval runs under
`--runs-dir`, joins them with the local tiers' stored runs, writes the report to `--out`, headed
by the command that regenerates it. The bfcl suite's published tiers are GPT-4o and GPT-4-turbo's
per-item correctness (`evals.frontier.bfcl`, read from `--bfcl-data`), reported in `bfcl.md` and
`bfcl.csv` beside the others.

`tierroute eval frontier-import SUITE`: a frontier model's published per-item answers written as an
eval run under `--runs-dir` and nothing else, for reports that read runs (`eval workloads --top`):
ifeval's GPT-4 responses as `ifeval-published`, graded by this project's grader
(`evals.frontier.ifeval`).

`tierroute eval frontier-score`: the local large tier's `cross_tier` reading of the weak frontier
tier's published answers, cached per item in `--out` and resumed by a rerun
(`evals.frontier.scoring`); `eval frontier --weak-scores SUITE=DIR` reads it.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from router.errors import ConfigError


def _local(specs: list[str]) -> dict[str, list[str]]:
    """`--local SUITE=RUN[,RUN...]` options as suite -> run directories, in the order given."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        suite, sep, runs = spec.partition("=")
        if not sep or not suite or not runs:
            raise ConfigError(f"--local {spec!r}: expected SUITE=RUN_DIR[,RUN_DIR...]")
        out.setdefault(suite, []).extend(r for r in runs.split(",") if r)
    return out


def cmd_frontier(args: argparse.Namespace) -> int:
    from evals.frontier.page import write
    from evals.frontier.report import build
    from evals.store import RunStore
    from evals.suites import get_suite

    local = _local(args.local)
    if not local:
        raise ConfigError("eval frontier needs at least one --local SUITE=RUN_DIR")
    weak = _pairs(args.weak_scores, "--weak-scores")
    if args.splits < 200:
        raise ConfigError("--splits: at least 200 random splits make a median and a 95% range")
    reports = []
    paths: list[Path] = []
    for suite_name, runs in local.items():
        stores = [RunStore(Path(r)) for r in runs]
        for s in stores:
            s.manifest()  # a ConfigError naming a missing run
        if suite_name == "bfcl":
            from evals.frontier import bfcl

            rep = bfcl.build(
                get_suite(suite_name),
                stores,
                Path(args.runs_dir),
                data_dir=Path(args.bfcl_data),
                seed=args.seed,
                fraction=args.fraction,
            )
            paths += bfcl.write(rep, Path(args.out), command=_command(args))
            continue
        reports.append(
            build(
                get_suite(suite_name),
                stores,
                Path(args.runs_dir),
                data_dir=Path(args.data),
                seed=args.seed,
                fraction=args.fraction,
                weak_scores=Path(weak[suite_name]) if suite_name in weak else None,
                n_splits=args.splits,
            )
        )
    if reports:
        paths = write(reports, Path(args.out), command=_command(args)) + paths
    for path in paths:
        print(path)
    return 0


def _pairs(specs: list[str], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for spec in specs:
        suite, sep, value = spec.partition("=")
        if not sep or not suite or not value:
            raise ConfigError(f"{option} {spec!r}: expected SUITE=DIR")
        out[suite] = value
    return out


def _command(args: argparse.Namespace) -> str:
    from evals.calibrate import split_options
    from evals.splits import SPLITS

    parts = ["tierroute", "eval", "frontier"]
    for spec in args.local:
        parts += ["--local", spec]
    for spec in args.weak_scores:
        parts += ["--weak-scores", spec]
    parts += ["--data", args.data]
    if "bfcl" in _local(args.local):
        parts += ["--bfcl-data", args.bfcl_data]
    parts += ["--runs-dir", args.runs_dir, "--out", args.out, *split_options(args)]
    if args.splits != SPLITS:
        parts += ["--splits", str(args.splits)]
    return " ".join(shlex.quote(p) for p in parts)


def cmd_frontier_import(args: argparse.Namespace) -> int:
    from evals.frontier import ifeval
    from evals.store import RunStore
    from evals.suites import get_suite

    if args.suite != "ifeval":
        raise ConfigError(f"eval frontier-import: no published answers to import for {args.suite!r}; have: ifeval")
    data = Path(args.data)
    published = ifeval.load(data)
    root = ifeval.write_run(published, get_suite("ifeval"), Path(args.runs_dir))
    right: int = RunStore(root).manifest()["published"]["right"]
    print(
        f"{root}: {len(published.items)} GPT-4 responses ({len(published.edited)} matched through the authors' "
        f"stated edit of its prompt), {right} right by this project's grader ({right / len(published.items):.1%})"
    )
    return 0


def cmd_frontier_score(args: argparse.Namespace) -> int:
    import asyncio

    from evals.commands.common import settings_of
    from evals.frontier.published import load
    from evals.frontier.scoring import score_published
    from evals.suites import get_suite

    if args.limit is not None and args.limit < 1:
        raise ConfigError("--limit must be at least 1")
    suite = get_suite(args.suite)
    published = load(suite.name, Path(args.data))
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if done % 10 == 0:
            print(f"{done} scored", flush=True)

    summary = asyncio.run(
        score_published(published, suite, settings_of(args), args.tier, Path(args.out), limit=args.limit, on_item=tick)
    )
    print(
        f"{summary.items} answers: {summary.cached} cached, {summary.scored} scored now "
        f"({summary.abstained} abstained), {len(summary.failed or [])} failed (a rerun retries them), "
        f"{summary.wall_s:.0f} s"
    )
    for line in (summary.failed or [])[:10]:
        print(f"  failed: {line}")
    return 1 if summary.failed else 0


def register(esub: Any, add: Any) -> None:
    p = add(
        "frontier",
        "what the small tier saves in front of published frontier tiers (GPT-4-1106, Mixtral; GPT-4o and "
        "GPT-4-turbo on bfcl): import and report",
        cmd_frontier,
        esub,
    )
    p.add_argument(
        "--local",
        action="append",
        default=[],
        metavar="SUITE=RUN_DIR[,RUN_DIR...]",
        help="the small tier's stored runs of a suite (repeatable; gsm8k, mmlu and bfcl have published frontier "
        "results); the first run that holds an item gives it, and its measured throughput prices the small tier",
    )
    p.add_argument("--data", default="evals/data/routellm", help="the published subset (default: the committed one)")
    p.add_argument(
        "--bfcl-data",
        default="evals/data/bfcl",
        help="BFCL's published correctness and token estimates (default: committed)",
    )
    p.add_argument("--runs-dir", default="runs", help="where the imported frontier runs are written (default ./runs)")
    p.add_argument("--out", default="frontier-report", help="output directory (default ./frontier-report)")
    p.add_argument("--seed", type=int, default=0, help="fixes the calibration split (default 0)")
    p.add_argument("--fraction", type=float, default=0.5, help="share of items used to calibrate (default 0.5)")
    p.add_argument(
        "--weak-scores",
        action="append",
        default=[],
        metavar="SUITE=DIR",
        help="the local large tier's cross_tier readings of the weak frontier tier's answers (eval frontier-score "
        "--out DIR), used once they cover every item",
    )
    p.add_argument("--splits", type=int, default=200, help="random calibration/held-out splits (default 200)")

    i = add(
        "frontier-import",
        "write a frontier model's published per-item answers as an eval run (ifeval: GPT-4's responses)",
        cmd_frontier_import,
        esub,
    )
    i.add_argument("suite", help="the suite whose published answers to import (ifeval)")
    i.add_argument("--data", default="evals/data/ifeval", help="the published data (default: the committed one)")
    i.add_argument("--runs-dir", default="runs", help="where the run is written (default ./runs)")

    q = add(
        "frontier-score",
        "the local large tier reads the weak frontier tier's published answers (cross_tier), cached per item",
        cmd_frontier_score,
        esub,
    )
    q.add_argument("--suite", default="gsm8k", help="the suite whose published answers to read (default gsm8k)")
    q.add_argument("--tier", default="large", help="the configured tier whose model reads them (default large)")
    q.add_argument("--out", required=True, help="the cache directory (resumed when it exists)")
    q.add_argument("--data", default="evals/data/routellm", help="the published subset (default: the committed one)")
    q.add_argument("--limit", type=int, default=None, help="only the first N answers (a sample)")
