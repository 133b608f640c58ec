"""`tierroute eval import`: logged answers, from a JSONL file or a ledger's shadow pairs (graded by
the labels of the givers it trusts where they exist: admin reviewers', and the client keys or teams
named with `--labels-from`), as an eval run that `sweep`, `calibrate` and `report` read like any
other (see `evals.importer`, `evals.ledger_import`).

Named for the command; `import` itself is a keyword.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evals.commands.common import add_runs_dir, settings_of
from evals.commands.run import default_verifiers
from router.errors import ConfigError


def cmd_import(args: argparse.Namespace) -> int:
    """`eval import FILE --run NAME`: logged answers as an eval run (see `evals.importer`)."""
    from evals.importer import TASK_KINDS, import_records, read_file, tier_order
    from evals.ledger_import import Givers, read_ledger, whose_labels
    from evals.runner import parse_verifier_option

    settings = settings_of(args)
    tiers = args.tiers.split(",") if args.tiers else None
    if (args.file is None) == (args.ledger is None):
        raise ConfigError("eval import reads one source: a JSONL file, or --ledger PATH (its shadow pairs)")
    if args.labels_from and args.ledger is None:
        raise ConfigError("--labels-from chooses whose labels grade a ledger's pairs: it goes with --ledger")
    source: str | Path
    labels: dict[str, Any] | None = None
    if args.file is not None:
        source = Path(args.file)
        records = read_file(source)
    else:
        source = args.ledger  # a SQLite file or a postgresql:// URL, as ledger.url takes
        givers = Givers.parse(args.labels_from)
        read = read_ledger(source, tiers=tiers, settings=settings.ledger, givers=givers)
        print(
            f"{source}: {read.pairs} shadow pairs; {read.other_tiers} of other tiers, {read.without_text} kept hashes "
            f"and extracted answers only (ledger.store_prompts was off), {len(read.records)} importable; "
            f"{read.labelled} labelled by trusted givers (POST /v1/feedback), {read.labelled_elsewhere} other "
            "labelled requests have no stored pair of these tiers",
            file=sys.stderr,
        )
        labels = read.provenance()
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
        labels=labels,
    )
    graded = ", ".join(f"{n} by {kind.replace('_', ' ')}" for kind, n in sorted(result.grading.items()))
    print(f"imported {result.items} items x {len(result.tiers)} tiers ({', '.join(result.tiers)}) into {result.root}")
    print(f"  graded: {graded}")
    if labels is not None:
        print(f"  labels: {whose_labels(labels)}")
        for name in _unmatched(labels):
            print(f"  note: --labels-from {name}: no label of the imported items came from it")
    if result.grading.get("shadow_agreement"):
        print(
            f"  note: {result.grading['shadow_agreement']} items have no trusted label: {result.tiers[0]} is graded "
            f"right there when it agreed with {result.tiers[-1]} in the shadow (a proxy, recorded in the manifest)"
        )
    if result.grading.get("agreement"):
        print(
            f"  note: {result.grading['agreement']} items have no label: a tier is graded right there when it agrees "
            f"with {result.tiers[-1]} (a proxy, recorded in the manifest)"
        )
    print(f"  prices: {', '.join(f'{t} {how}' for t, how in result.prices.items())}")
    print(f"next: tierroute eval sweep {result.root}")
    return 0


def _unmatched(labels: Mapping[str, Any]) -> list[str]:
    """The keys named with --labels-from that gave none of the labels read (a misspelt name reads
    as nobody: said, not refused, as a window may hold no label of a trusted key)."""
    return [n for n in labels["from"] if n.startswith("key:") and n[4:] not in labels["used"]]


def register(esub: Any, add: Any) -> None:
    p = add(
        "import",
        "turn a JSONL of prompts with per-tier answers (and optional labels) into an eval run",
        cmd_import,
        esub,
    )
    add_runs_dir(p)
    p.add_argument("file", nargs="?", default=None, help="the JSONL file (format: docs/eval-import.md)")
    p.add_argument(
        "--ledger",
        default=None,
        metavar="PATH|URL",
        help="import the shadow pairs of this ledger (a SQLite file or a postgresql:// URL) instead of a file "
        "(those that kept their prompt and answers), graded by trusted labels where they exist (--labels-from)",
    )
    p.add_argument(
        "--labels-from",
        action="append",
        default=[],
        metavar="key:NAME|team:NAME|all",
        help="with --ledger, also grade by the labels of this client key or team (repeatable; 'all': every key's). "
        "Admin reviewers' labels are always read, and by default only theirs: a client's labels of its own "
        "requests would otherwise recalibrate the thresholds of every tenant",
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
