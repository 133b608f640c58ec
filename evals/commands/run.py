"""`tierroute eval run`: every tier on every item of a suite once, scored with every verifier,
stored and cached per item (see `evals.runner`).

`--suite mixed` replays the suites' items, with open-ended prompts among them, through the
cascade (see `evals.mixed`); `--report DIR` then writes the report of the runs. Also here: what an
eval scores with when no verifier is named (`default_verifiers`), which `eval import` uses too.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path
from typing import Any

from evals.commands.common import ESTIMATORS_HELP, add_runs_dir, settings_of
from evals.commands.progress import RichProgress
from evals.commands.report import cmd_report
from router.errors import ConfigError


def _with_width(settings: Any, width: int | None) -> Any:
    """The settings with every local tier decoding `width` sequences together (an eval's batch
    width; outputs are cached without it, so changing it recomputes nothing)."""
    if width is None:
        return settings
    if not 1 <= width <= 64:
        raise ConfigError(f"--width {width}: a local tier decodes 1 to 64 sequences together")
    tiers = [
        t.model_copy(update={"llamacpp": t.llamacpp.model_copy(update={"n_parallel": width})})
        if t.llamacpp is not None
        else t
        for t in settings.tiers
    ]
    return settings.model_copy(update={"tiers": tiers})


def _parse_suites(args: argparse.Namespace) -> list[tuple[str, int | None]]:
    out = []
    for spec in args.suite:
        name, limit = spec, args.limit
        head, sep, tail = spec.rpartition(":")
        if sep and head and tail.isdigit():
            name, limit = head, int(tail)
        out.append((name, limit))
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from evals.runner import EvalPlan, parse_verifier_option, plan_tiers, run_eval, select_items
    from evals.store import RunStore
    from evals.suites import get_suite
    from router.config import VerifierSpec

    settings = _with_width(settings_of(args), args.width)
    suites = _parse_suites(args)
    if args.run and len(suites) > 1:
        raise ConfigError("--run names one run; leave it out to run several suites (each into its own run)")
    tiers = plan_tiers(settings, args.tiers.split(",") if args.tiers else None)
    explicit = [*_verifiers_of(args.verifiers_from), *(parse_verifier_option(v) for v in args.verifier)]
    cache_dir = Path(args.cache_dir) if args.cache_dir else settings.models.cache_dir
    status = 0
    runs: list[str] = []
    for name, limit in suites:
        suite = get_suite(name)
        if name == "mixed":
            status |= _run_mixed(args, suite, limit, settings, tiers, explicit, cache_dir)
            continue
        store = RunStore(Path(args.runs_dir) / (args.run or suite.name))
        verifiers: list[VerifierSpec] = explicit
        if not verifiers and store.exists():
            verifiers = [
                VerifierSpec(name=v["name"], params=v["params"]) for v in store.manifest().get("verifiers", [])
            ]
        if not verifiers and not args.no_default_verifiers:
            verifiers = default_verifiers(suite.task)
        runs.append(store.name)
        items = select_items(suite, limit, args.seed, cache_dir)
        plan = EvalPlan(
            suite=suite,
            items=items,
            settings=settings,
            tiers=tiers,
            verifiers=verifiers,
            limit=limit,
            seed=args.seed,
            concurrency=args.concurrency,
            timeout_s=args.timeout_s,
            config_path=str(args.config) if args.config else None,
        )
        labels = ", ".join(sorted({v.name for v in verifiers})) or "none besides the tiers' own"
        print(
            f"{suite.name}: {len(items)} items x {len(tiers)} tiers ({', '.join(tiers)}); eval verifiers: {labels}; "
            f"results in {store.root}",
            file=sys.stderr,
        )
        try:
            with store, RichProgress() as progress:
                summary = asyncio.run(run_eval(plan, store, progress=progress))
        except KeyboardInterrupt:
            print(
                f"interrupted: every finished item is stored in {store.root}; run the same command to resume",
                file=sys.stderr,
            )
            return 130
        what = (
            f"computed {summary.generated} generations, {summary.scored} scores, {summary.graded} grades"
            if summary.computed
            else "everything was cached"
        )
        print(f"{suite.name}: {what} in {summary.wall_s:.1f}s", file=sys.stderr)
        if summary.failed:
            status = 1
            print(f"{len(summary.failed)} failed (not stored; a rerun retries them):", file=sys.stderr)
            for line in summary.failed[:20]:
                print(f"  {line}", file=sys.stderr)
    if args.report and status == 0 and runs:
        from evals.splits import SPLITS

        report_args = argparse.Namespace(
            runs=runs,
            runs_dir=args.runs_dir,
            out=args.report,
            target=args.target,
            seed=0,
            fraction=0.5,
            tiers=None,
            reprice=False,
            config=args.config,
            command_line=None,
            estimators=args.estimators,
            splits=SPLITS,
        )
        cmd_report(report_args)
    return status


def _mixed_command(args: argparse.Namespace, limit: int | None) -> str:
    """The command that regenerates a mixed run and its report, spelled the same however it was typed."""
    parts = ["tierroute", "eval", "run", "--suite", "mixed", "--runs-dir", args.runs_dir, "--seed", str(args.seed)]
    if limit is not None:
        parts += ["--limit", str(limit)]
    parts += ["--open-ended", str(args.open_ended), "--open-ended-max-tokens", str(args.open_ended_max_tokens)]
    if args.run:
        parts += ["--run", args.run]
    if args.tiers:
        parts += ["--tiers", args.tiers]
    if args.verifiers_from:
        parts += ["--verifiers-from", args.verifiers_from]
    for v in args.verifier:
        parts += ["--verifier", v]
    if args.report:
        parts += ["--report", args.report]
    return " ".join(shlex.quote(p) for p in parts)


def _run_mixed(
    args: argparse.Namespace,
    suite: Any,
    limit: int | None,
    settings: Any,
    tiers: list[str],
    verifiers: list[Any],
    cache_dir: Path | None,
) -> int:
    """`eval run --suite mixed`: see `evals.mixed`. Prints the per-task table; `--report DIR`
    writes it as DIR/mixed.md."""
    from rich.console import Console
    from rich.table import Table

    from evals.mixed import HEADERS, default_classifier, markdown, plan_mixed, report_rows, run_mixed, table_rows
    from evals.suites.mixed import Mixed, OpenEnded

    assert isinstance(suite, Mixed)
    suite.open_ended = OpenEnded(max_tokens=args.open_ended_max_tokens)
    drawn = suite.draw(limit, args.open_ended, args.seed, cache_dir)
    root = Path(args.runs_dir) / (args.run or suite.name)
    mixed = plan_mixed(drawn, default_classifier(settings), root)
    print(
        f"mixed: {len(drawn)} items ({', '.join(f'{p.run} {len(p.items)}' for p in mixed.parts)}) x {len(tiers)} "
        f"tiers; suite items seeded from the runs in {args.runs_dir}; results in {root}",
        file=sys.stderr,
    )
    try:
        with RichProgress() as progress:
            summaries = asyncio.run(
                run_mixed(
                    mixed,
                    Path(args.runs_dir),
                    settings,
                    tiers,
                    verifiers=verifiers,
                    seed=args.seed,
                    concurrency=args.concurrency,
                    timeout_s=args.timeout_s,
                    config_path=str(args.config) if args.config else None,
                    progress=progress,
                )
            )
    except KeyboardInterrupt:
        print(
            f"interrupted: every finished item is stored under {root}; run the same command to resume", file=sys.stderr
        )
        return 130
    failed = [line for s in summaries.values() for line in s.failed]
    computed = sum(s.generated for s in summaries.values())
    print(f"mixed: generated {computed} answers (the rest reused)", file=sys.stderr)
    if failed:
        print(f"{len(failed)} failed (not stored; a rerun retries them):", file=sys.stderr)
        for line in failed[:20]:
            print(f"  {line}", file=sys.stderr)
        return 1
    rows = asyncio.run(report_rows(root, settings))
    table = Table(title=f"mixed traffic: {root}")
    for h in HEADERS:
        table.add_column(h)
    for cells in table_rows(rows):
        table.add_row(*cells)
    Console().print(table)
    if args.report:
        out = Path(args.report) / "mixed.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(markdown(rows, command=_mixed_command(args, limit), tiers=tiers), encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)
    return 0


def _verifiers_of(run_dir: str | None) -> list[Any]:
    """The verifier list another run scored with (`--verifiers-from`): how a committed run's costly
    columns, which no default list holds, are scored again from empty."""
    if run_dir is None:
        return []
    from evals.store import RunStore
    from router.config import VerifierSpec

    store = RunStore(Path(run_dir))
    if not store.exists():
        raise ConfigError(f"--verifiers-from {run_dir}: no eval run there (no manifest.json)")
    try:
        listed = [VerifierSpec(name=v["name"], params=v["params"]) for v in store.manifest().get("verifiers", [])]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"--verifiers-from {run_dir}: its manifest's verifier list is unreadable ({exc})") from None
    if not listed:  # an empty list would read as "not given" and fall back to the defaults
        raise ConfigError(f"--verifiers-from {run_dir}: that run lists no verifiers (use --no-default-verifiers)")
    return listed


def default_verifiers(task: str) -> list[Any]:
    """What an eval scores with when `--verifier` is not given: every built-in verifier that costs
    no extra generation and applies to the task. Only the registered ones are used."""
    from router.config import VerifierSpec
    from router.plugins import VerifierRegistry as Registry

    confidence = [("confidence", {"stat": "mean"}), ("confidence", {"stat": "min", "name": "confidence_min"})]
    wanted = {
        "math": [
            *confidence,
            ("format", {"regex": r"\\boxed\{", "name": "boxed"}),
            ("math_answer", {}),
            ("execution", {}),
        ],
        "code": [*confidence, ("format", {"regex": r"```(?:python|py)?\n", "name": "code_block"}), ("code_tests", {})],
        "choice": [
            *confidence,
            ("format", {"regex": r"^\s*\(?[A-D]\)?[.)]?\s*$", "name": "letter_only"}),
            ("choice", {}),
            ("choice", {"stat": "margin", "name": "choice_margin"}),
        ],
    }.get(task, confidence)
    try:
        known = set(Registry.from_entry_points().names())
    except Exception:  # the built-ins not installed yet: score with the tiers' own verifiers only
        return []
    return [VerifierSpec(name=n, params=p) for n, p in wanted if n in known]


def register(esub: Any, add: Any) -> None:
    p = add(
        "run", "run every tier on every item once; score with every verifier; store and cache per item", cmd_run, esub
    )
    add_runs_dir(p)
    p.add_argument(
        "--suite",
        action="append",
        required=True,
        metavar="NAME[:LIMIT]",
        help="gsm8k, humaneval, mmlu, or a .jsonl file; repeat for several (each its own run)",
    )
    p.add_argument("--limit", type=int, default=None, help="items per suite (default: all)")
    p.add_argument("--seed", type=int, default=0, help="which items are drawn (default 0)")
    p.add_argument("--tiers", default=None, help="comma-separated tier names (default: every configured tier)")
    p.add_argument(
        "--verifier",
        action="append",
        default=[],
        metavar="NAME[:JSON]",
        help='score every tier with this verifier too, e.g. confidence:\'{"stat":"min"}\' (repeatable; '
        "default: the run's earlier list, else the cheap built-ins for the suite's task)",
    )
    p.add_argument(
        "--verifiers-from",
        default=None,
        metavar="RUN_DIR",
        help="score with the verifiers another run's manifest lists (a committed run's, to reproduce its "
        "columns from empty); --verifier adds to them",
    )
    p.add_argument("--no-default-verifiers", action="store_true", help="only the tiers' own verifiers")
    p.add_argument("--run", default=None, help="run name (default: the suite's name)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight for a remote tier (default 8)")
    p.add_argument(
        "--width",
        type=int,
        default=None,
        help="sequences each local tier decodes together in this eval (default: its n_parallel)",
    )
    p.add_argument("--cache-dir", default=None, help="model and data cache (default: config or XDG cache)")
    p.add_argument(
        "--timeout-s",
        type=float,
        default=1800.0,
        help="deadline of one generation in an eval (default 1800; the tiers' serving timeout_s "
        "does not apply: items are decoded in batches and take longer)",
    )
    p.add_argument(
        "--open-ended",
        type=int,
        default=40,
        metavar="N",
        help="suite mixed: open-ended prompts interleaved with --limit items of each suite (default 40)",
    )
    p.add_argument(
        "--open-ended-max-tokens",
        type=int,
        default=128,
        metavar="N",
        help="suite mixed: max_tokens of the open-ended prompts (default 128)",
    )
    p.add_argument(
        "--report",
        default=None,
        metavar="DIR",
        help="then write the report of these runs into DIR (suite mixed: DIR/mixed.md)",
    )
    p.add_argument("--target", default="min-pgr=0.8", help="calibration target of that report (default min-pgr=0.8)")
    p.add_argument("--estimators", default=None, metavar="DIR", help="that report: " + ESTIMATORS_HELP)
