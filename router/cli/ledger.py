"""`tierroute ledger migrate|copy`: bring a ledger's schema up to date without serving, and move a
ledger from one store to another (a SQLite file to the PostgreSQL database replicas share).

A copy writes each request through the destination store's own `write` (its row, its attempts,
its key's spend, one transaction each), so the copy is a ledger like any other; a request already
there is skipped, which makes an interrupted copy safe to run again. Copy from a ledger no
service is writing to: a request settled during the copy may be missed.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router.config import LedgerSettings


def _location(text: str) -> str:
    """`sqlite:PATH` or a plain path names a SQLite file; a postgresql:// URL, a database."""
    return text.removeprefix("sqlite:") if text.startswith("sqlite:") else text


def _settings(args: argparse.Namespace) -> LedgerSettings | None:
    """The config's ledger settings (the PostgreSQL password variable, pool, timeout), if it loads."""
    from router.config import load_settings
    from router.errors import TierrouteError

    try:
        return load_settings(args.config).ledger
    except TierrouteError:
        return None


def cmd_ledger_migrate(args: argparse.Namespace) -> int:
    from router.ledger.store import SCHEMA_VERSION
    from router.ledger.stores import is_postgres, open_store

    settings = _settings(args)
    if args.ledger is None and settings is None:
        print("error: no --ledger and no loadable config", file=sys.stderr)
        return 2
    location = _location(args.ledger) if args.ledger else settings.location  # type: ignore[union-attr]
    store = open_store(location, settings=settings)
    store.open()  # opening a ledger read-write applies what it lacks
    store.close()
    if is_postgres(location):
        from router.ledger.postgres import PostgresStore
        from router.ledger.postgres_migrations import SCHEMA_VERSION as PG_SCHEMA_VERSION

        done = store.migrated if isinstance(store, PostgresStore) else []
        print(f"{location}: applied migrations {done or 'none (up to date)'}; schema version {PG_SCHEMA_VERSION}")
    else:
        print(f"{location}: schema version {SCHEMA_VERSION}")
    return 0


def cmd_ledger_copy(args: argparse.Namespace) -> int:
    from router.ledger.entries import DuplicateEntry
    from router.ledger.stores import open_store

    settings = _settings(args)
    source = open_store(_location(args.source), read_only=True, settings=settings)
    target = open_store(_location(args.target), settings=settings)
    source.open()
    try:
        target.open()
        try:
            copied = skipped = 0
            for entry in source.entries():
                try:
                    target.write(entry)
                except (DuplicateEntry, sqlite3.IntegrityError):
                    skipped += 1
                    continue
                copied += 1
            pairs = 0
            for pair in source.pairs():
                target.write_pair(pair)
                pairs += 1
            labels = 0
            for label in source.feedback():
                try:
                    target.write_feedback(label)
                except (DuplicateEntry, sqlite3.IntegrityError):
                    continue  # copied before
                labels += 1
            pending = 0
            for row in source.pending():
                target.begin(row)
                pending += 1
        finally:
            target.close()
    finally:
        source.close()
    print(
        f"copied {copied} requests ({skipped} already there), {pairs} shadow pairs, {labels} feedback labels and "
        f"{pending} pending rows "
        f"from {args.source} to {args.target}"
    )
    return 0


def register(sub: Any, add: Any) -> None:
    ledger = sub.add_parser("ledger", help="the ledger's schema, and copying a ledger between stores")
    lsub = ledger.add_subparsers(dest="ledger_command", metavar="COMMAND", required=True)
    m = add(
        "migrate",
        "apply the schema migrations a ledger lacks (the service also applies them at start-up)",
        cmd_ledger_migrate,
        lsub,
    )
    m.add_argument("--ledger", default=None, help="ledger file or postgresql:// URL (default: the config's)")
    c = add(
        "copy",
        "copy every request, shadow pair and pending row from one ledger to another (safe to rerun)",
        cmd_ledger_copy,
        lsub,
    )
    c.add_argument("--from", dest="source", required=True, help="sqlite:PATH, a file path, or a postgresql:// URL")
    c.add_argument("--to", dest="target", required=True, help="postgresql:// URL, sqlite:PATH or a file path")
