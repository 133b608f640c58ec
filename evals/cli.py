"""`tierroute eval run | import | sweep | calibrate | report | train`: registered into the main CLI by `register`."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path
from typing import Any

from router.errors import ConfigError

DEFAULT_RUNS_DIR = "runs"
_ESTIMATORS_HELP = (
    "add the learned verifier and the pre-router trained by `eval train --out DIR` "
    "(their stored out-of-fold and held-out predictions)"
)


def _settings(args: argparse.Namespace) -> Any:
    from router.config import load_settings

    return load_settings(args.config)


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


def _run_dir(args: argparse.Namespace, run: str) -> Path:
    path = Path(run)
    if (path / "manifest.json").is_file():
        return path
    return Path(args.runs_dir) / run


def _parse_suites(args: argparse.Namespace) -> list[tuple[str, int | None]]:
    out = []
    for spec in args.suite:
        name, limit = spec, args.limit
        head, sep, tail = spec.rpartition(":")
        if sep and head and tail.isdigit():
            name, limit = head, int(tail)
        out.append((name, limit))
    return out


class _RichProgress:
    """One bar per tier: items done, rate and time left."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        class Rate(TextColumn):
            def __init__(self) -> None:
                super().__init__("")

            def render(self, task: Any) -> Any:
                from rich.text import Text

                speed = task.finished_speed or task.speed
                return Text(
                    "–/s" if not speed else (f"{speed:.2f} items/s" if speed >= 0.1 else f"{60 * speed:.2f} items/min")
                )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            Rate(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            transient=False,
        )
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> _RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start(self, tier: str, total: int, cached: int) -> None:
        label = f"{tier}" + (f" ({cached} cached)" if cached else "")
        self.tasks[tier] = self.progress.add_task(label, total=total)

    def advance(self, tier: str) -> None:
        self.progress.advance(self.tasks[tier])

    def finish(self, tier: str) -> None:
        self.progress.refresh()


def cmd_run(args: argparse.Namespace) -> int:
    from evals.runner import EvalPlan, parse_verifier_option, plan_tiers, run_eval, select_items
    from evals.store import RunStore
    from evals.suites import get_suite
    from router.config import VerifierSpec

    settings = _with_width(_settings(args), args.width)
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
            with store, _RichProgress() as progress:
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
        with _RichProgress() as progress:
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


def cmd_import(args: argparse.Namespace) -> int:
    """`eval import FILE --run NAME`: logged answers as an eval run (see `evals.importer`)."""
    from evals.importer import TASK_KINDS, import_records, read_file, read_ledger, tier_order
    from evals.runner import parse_verifier_option

    settings = _settings(args)
    tiers = args.tiers.split(",") if args.tiers else None
    if (args.file is None) == (args.ledger is None):
        raise ConfigError("eval import reads one source: a JSONL file, or --ledger PATH (its shadow pairs)")
    source: str | Path
    if args.file is not None:
        source = Path(args.file)
        records = read_file(source)
    else:
        source = args.ledger  # a SQLite file or a postgresql:// URL, as ledger.url takes
        read = read_ledger(source, tiers=tiers, settings=settings.ledger)
        print(
            f"{source}: {read.pairs} shadow pairs; {read.other_tiers} of other tiers, {read.without_text} kept hashes "
            f"and extracted answers only (ledger.store_prompts was off), {len(read.records)} importable",
            file=sys.stderr,
        )
        if not read.records:
            raise ConfigError(
                f"{source}: no shadow pair kept its prompt and answers; pairs without them give agreement rates "
                "(`tierroute report quality`) but no eval run. Turn on ledger.store_prompts to collect them."
            )
        records = read.records
    verifiers = [parse_verifier_option(v) for v in args.verifier]
    kinds = {r.task for r in records} if args.task is None else set()
    task = args.task or (kinds.pop() if len(kinds) == 1 else "text")
    if not verifiers and not args.no_default_verifiers:
        # what an import cannot feed is left out: `choice` reads each token's alternatives (never
        # imported), `confidence` the logprobs (without them it scores every answer 0)
        deciding = tier_order(records, settings, tiers)[:-1]
        has_logprobs = all(r.answers[t].logprobs is not None for r in records for t in deciding)
        skip = {"choice"} if has_logprobs else {"choice", "confidence"}
        verifiers = [v for v in default_verifiers(TASK_KINDS.get(task, task)) if v.name not in skip]
    result = import_records(
        records,
        settings=settings,
        runs_dir=Path(args.runs_dir),
        name=args.run,
        source=str(source),
        verifiers=verifiers,
        tiers=tiers,
        task=args.task,
    )
    graded = ", ".join(f"{n} by {kind.replace('_', ' ')}" for kind, n in sorted(result.grading.items()))
    print(f"imported {result.items} items x {len(result.tiers)} tiers ({', '.join(result.tiers)}) into {result.root}")
    print(f"  graded: {graded}")
    if result.grading.get("agreement"):
        print(
            f"  note: {result.grading['agreement']} items have no label: a tier is graded right there when it agrees "
            f"with {result.tiers[-1]} (a proxy, recorded in the manifest)"
        )
    print(f"  prices: {', '.join(f'{t} {how}' for t, how in result.prices.items())}")
    print(f"next: tierroute eval sweep {result.root}")
    return 0


def _load(args: argparse.Namespace, run: str, prices: Any = None) -> Any:
    """`prices` (tier name -> PriceSettings) overrides the run's price sheet and `--reprice`."""
    from evals.store import RunStore
    from evals.sweep import load_table

    if prices is None and getattr(args, "reprice", False):
        settings = _settings(args)
        prices = {t.name: t.price for t in settings.tiers}
    store = RunStore(_run_dir(args, run))
    tiers = args.tiers.split(",") if getattr(args, "tiers", None) else None
    table = load_table(store, prices=prices, tiers=tiers)
    if getattr(args, "estimators", None):
        from evals.estimators import attach, load_predictions

        preds = load_predictions(args.estimators)
        seed, fraction = getattr(args, "seed", preds.seed), getattr(args, "fraction", preds.fraction)
        table = attach(table, preds, seed=seed, fraction=fraction)
    return table


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from evals.formatting import num, pct, th, usd
    from evals.sweep import baselines, summarize

    table = _load(args, args.run)
    console = Console(highlight=False)

    def curve_table(first: str, curve: list[Any]) -> Table:
        out = Table(first, "accuracy", "cost/1k", "escalation", "savings", "p50", "p95")
        for p in curve[:: max(1, len(curve) // args.rows)]:
            out.add_row(
                th(p.param),
                pct(p.accuracy),
                usd(p.cost_per_1k),
                pct(p.escalation_rate),
                pct(p.savings),
                num(p.latency_p50, 2),
                num(p.latency_p95, 2),
            )
        return out

    verifiers = [args.verifier] if args.verifier else table.verifiers
    for v in verifiers:
        s = summarize(table, v)
        console.print(
            f"[bold]{table.suite} / {v}[/]: AUROC {', '.join(num(a) for a in s.auroc)}; APGR {num(s.apgr)}; "
            f"CPT(50/80/95%) {', '.join(pct(s.cpt[x]) for x in (0.5, 0.8, 0.95))}; AIQ {num(s.aiq)}"
        )
        console.print(curve_table("threshold", s.curve))
    if args.estimators:
        from evals.estimators import PREROUTER
        from evals.sweep import preroute_sweep

        console.print(
            f"[bold]{table.suite} / pre-route only[/]: "
            "skip a tier when the pre-router's P(right) is below the threshold"
        )
        console.print(curve_table("skip below", preroute_sweep(table, PREROUTER)))
    base = baselines(table)
    for p in base["tiers"] + base["oracle"]:
        console.print(f"{p.policy}: accuracy {pct(p.accuracy)}, {usd(p.cost_per_1k)} per 1k")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from evals.calibrate import Target, baseline_hint, calibrate, toml_snippet, write_thresholds
    from evals.formatting import pct, th, usd
    from evals.sweep import CONFIG
    from router.tasks import task_of_suite

    table = _load(args, args.run)
    target = Target.parse(args.target)
    verifier = args.verifier or CONFIG
    cal = calibrate(table, verifier, target, seed=args.seed, fraction=args.fraction)
    ths = ", ".join(f"{n}={th(v)}" for n, v in cal.thresholds.items())
    print(
        f"{table.suite}: verifier '{verifier}', target {target}: thresholds {ths} "
        f"(chosen on {cal.n_calibration} calibration items"
        f"{'' if cal.met else '; target NOT reachable there, nearest shown'})"
    )
    for label, r in (("calibration", cal.calibration), ("held-out", cal.held_out)):
        print(
            f"  {label:12s} accuracy {pct(r.accuracy)}, {usd(r.cost_per_1k)} per 1k, escalation "
            f"{pct(r.escalation_rate)}, savings vs top {pct(r.savings)} (n={r.n})"
        )
    for t in cal.held_out_tiers:
        print(f"  held-out, always {t.policy}: accuracy {pct(t.accuracy)}, {usd(t.cost_per_1k)} per 1k")
    print(f"  target met on held-out items: {'yes' if cal.held_out_met else 'no'}")
    # the thresholds belong to the policy of the suite's task, unless the tier's own is asked for
    task = None if args.tier_threshold else task_of_suite(table.manifest.get("suite", {}).get("task", "text"))
    snippet = toml_snippet(cal, task)
    configured = _single_configured(table, verifier)
    if args.write:
        if not configured:
            raise ConfigError(
                f"--write sets the tiers' thresholds, which apply to their configured verifiers; '{verifier}' is not "
                "what every calibrated tier is configured with. Set the tiers' verifiers, or paste:\n" + snippet
            )
        from router.config import DEFAULT_CONFIG

        path = Path(args.config) if args.config else DEFAULT_CONFIG
        write_thresholds(path, cal.thresholds, task=task)
        where = "the tiers' own threshold" if task is None else f"the tiers' policy for task '{task}'"
        print(f"wrote thresholds into {path} ({where})")
        print(baseline_hint(cal, task), end="")
    else:
        print("\n# paste into config.toml (or rerun with --write):\n" + snippet)
    return 0


def _single_configured(table: Any, verifier: str) -> bool:
    """Whether a threshold on `verifier` means the same as the config's threshold on each tier."""
    from evals.sweep import CONFIG

    if verifier == CONFIG:
        return True
    for snap in table.manifest["tiers"][: max(1, len(table.tiers) - 1)]:
        members = snap["verifiers"]
        if len(members) != 1 or members[0]["label"] != verifier:
            return False
    return True


def cmd_report(args: argparse.Namespace) -> int:
    from evals.breakeven import scaled_top_prices
    from evals.calibrate import Target
    from evals.report.pages import write
    from evals.report.suite import build

    target = Target.parse(args.target)
    reports = []
    for run in args.runs:
        table = _load(args, run)
        # the same run with the top tier free: the part of each cost that does not scale with its price
        top_free = _load(args, run, scaled_top_prices(table, 0.0)) if len(table.tiers) > 1 else None
        reports.append(build(table, target, seed=args.seed, fraction=args.fraction, top_free=top_free))
    if args.estimators:
        from evals.estimators import compare

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


def cmd_train(args: argparse.Namespace) -> int:
    from evals.calibrate import Target
    from evals.train import train
    from evals.train_report import toml_snippet
    from evals.training_data import load_run

    tiers = args.tiers.split(",") if args.tiers else None
    cache_dir = Path(args.cache_dir) if args.cache_dir else None
    runs = [
        load_run(_run_dir(args, r), suite=args.suite if len(args.run) == 1 else None, cache_dir=cache_dir, tiers=tiers)
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


def _report_command(args: argparse.Namespace) -> str:
    """The command that regenerates this report, spelled the same however it was typed."""
    from evals.calibrate import split_options

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
    if args.estimators:
        parts += ["--estimators", args.estimators]
    return " ".join(shlex.quote(p) for p in parts)


def register(sub: Any, add: Any) -> None:
    ev = sub.add_parser("eval", help="run eval suites, sweep policies, calibrate thresholds, write reports")
    esub = ev.add_subparsers(dest="eval_command", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--runs-dir", default=DEFAULT_RUNS_DIR, help=f"where runs live (default: ./{DEFAULT_RUNS_DIR})")

    p = add(
        "run", "run every tier on every item once; score with every verifier; store and cache per item", cmd_run, esub
    )
    common(p)
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
    p.add_argument("--estimators", default=None, metavar="DIR", help="that report: " + _ESTIMATORS_HELP)

    p = add(
        "import",
        "turn a JSONL of prompts with per-tier answers (and optional labels) into an eval run",
        cmd_import,
        esub,
    )
    common(p)
    p.add_argument("file", nargs="?", default=None, help="the JSONL file (format: docs/eval-import.md)")
    p.add_argument(
        "--ledger",
        default=None,
        metavar="PATH|URL",
        help="import the shadow pairs of this ledger (a SQLite file or a postgresql:// URL) instead of a file "
        "(those that kept their prompt and answers)",
    )
    p.add_argument("--run", required=True, help="name of the new run (a directory under --runs-dir)")
    p.add_argument(
        "--tiers",
        default=None,
        help="comma-separated tiers, cheapest first (default: config order; --ledger: the accepting tier and the "
        "shadow target, default the most frequent pair)",
    )
    p.add_argument(
        "--task",
        default=None,
        help="import only items of this task (math, code, choice, text, structured; default: all)",
    )
    p.add_argument(
        "--verifier",
        action="append",
        default=[],
        metavar="NAME[:JSON]",
        help="score every tier's answers with this verifier too (repeatable; default: the cheap built-ins "
        "for the items' task, confidence only where every answer carries logprobs)",
    )
    p.add_argument("--no-default-verifiers", action="store_true", help="only the tiers' configured verifiers")

    p = add("sweep", "print the cascade's accuracy and cost at every threshold, from stored results", cmd_sweep, esub)
    common(p)
    p.add_argument("run", help="run name or directory")
    p.add_argument("--verifier", default=None, help="one verifier label (default: all)")
    p.add_argument("--tiers", default=None, help="comma-separated subset of the run's tiers, cheapest first")
    p.add_argument("--rows", type=int, default=15, help="rows per table (default 15)")
    p.add_argument("--reprice", action="store_true", help="price with the config's price sheet, not the run's")
    p.add_argument("--estimators", default=None, metavar="DIR", help=_ESTIMATORS_HELP)

    p = add(
        "calibrate",
        "choose thresholds on a calibration split for a target; report them on held-out items",
        cmd_calibrate,
        esub,
    )
    common(p)
    p.add_argument("--run", required=True, help="run name or directory")
    p.add_argument(
        "--target",
        required=True,
        metavar="KIND=VALUE",
        help="min-accuracy=0.6, min-pgr=0.8, max-cost=0.05 (USD per 1k requests) or max-escalation=0.3",
    )
    p.add_argument("--verifier", default=None, help="the verifier to threshold (default: 'config', the tiers' own)")
    p.add_argument("--seed", type=int, default=0, help="fixes the calibration split (default 0)")
    p.add_argument("--fraction", type=float, default=0.5, help="share of items used to calibrate (default 0.5)")
    p.add_argument("--tiers", default=None, help="comma-separated subset of the run's tiers, cheapest first")
    p.add_argument("--reprice", action="store_true", help="price with the config's price sheet, not the run's")
    p.add_argument(
        "--write",
        action="store_true",
        help="write the thresholds into the config file: each tier's policy for the suite's task "
        "(tiers[].tasks.<task>.threshold)",
    )
    p.add_argument(
        "--tier-threshold",
        action="store_true",
        help="with --write: set the tiers' own threshold (every task without a policy) instead",
    )
    p.add_argument("--estimators", default=None, metavar="DIR", help=_ESTIMATORS_HELP)

    p = add("report", "Markdown + self-contained HTML + CSV report from stored runs", cmd_report, esub)
    common(p)
    p.add_argument("runs", nargs="+", help="run names or directories (one per suite)")
    p.add_argument("--out", default="eval-report", help="output directory (default ./eval-report)")
    p.add_argument("--target", default="min-pgr=0.8", help="calibration target for the held-out section")
    p.add_argument("--seed", type=int, default=0, help="fixes the calibration split (default 0)")
    p.add_argument("--fraction", type=float, default=0.5, help="share of items used to calibrate (default 0.5)")
    p.add_argument("--tiers", default=None, help="comma-separated subset of the runs' tiers, cheapest first")
    p.add_argument("--reprice", action="store_true", help="price with the config's price sheet, not the runs'")
    p.add_argument("--estimators", default=None, metavar="DIR", help=_ESTIMATORS_HELP)
    p.add_argument("--command-line", default=None, help=argparse.SUPPRESS)

    p = add(
        "train",
        "fit the learned verifier and the pre-router on stored runs; report them on held-out items",
        cmd_train,
        esub,
    )
    common(p)
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
