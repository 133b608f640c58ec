"""Ledger values to rows and back, by column name: both stores write and read through these.

Rows used to be tuples in a hand-kept column order, read back as `row[13]`: a column added in the
middle of the list shifted every number after it, silently. Here a value becomes a dict keyed by
column name (written with named parameters, `:name` in SQLite and `%(name)s` in PostgreSQL, so
the order of the dict does not matter), and a row is read by name (`sqlite3.Row`, psycopg's
`dict_row`). A test holds each mapping to its table's columns in `router.ledger.schema`, so a
column that one side forgets fails there, not in a report.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, Protocol

from router.ledger import schema
from router.ledger.entries import AttemptEntry, CacheRow, Feedback, LedgerEntry, PendingEntry, ShadowPair

# named-parameter placeholders of each store's driver
_PLACEHOLDER: dict[schema.Store, str] = {"sqlite": ":{}", "postgres": "%({})s"}


class Row(Protocol):
    """A row read by column name: `sqlite3.Row` or a psycopg `dict_row`."""

    def __getitem__(self, key: str, /) -> Any: ...


def insert(table: str, store: schema.Store, verb: str = "INSERT INTO") -> str:
    """An INSERT of every column the table has in `store`, one named parameter per column."""
    names = schema.columns(table, store)
    values = ", ".join(_PLACEHOLDER[store].format(c.name) for c in names)
    return f"{verb} {table} ({schema.column_list(table, store)}) VALUES ({values})"


def _fields(value: Any, *skip: str) -> dict[str, Any]:
    """A dataclass's fields by name, less `skip`: each store column that holds a field is named after it."""
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.name not in skip}


def _read(cls: type[Any], row: Row, *skip: str) -> dict[str, Any]:
    """The columns of `row` named after `cls`'s fields, less `skip`."""
    return {f.name: row[f.name] for f in dataclasses.fields(cls) if f.name not in skip}


def request_values(entry: LedgerEntry) -> dict[str, Any]:
    """The entry's `requests` row: its fields, flags as 0/1, and the sums over its attempts."""
    return {
        **_fields(entry, "attempts"),
        "escalated": int(entry.escalated),
        "unverified": int(entry.unverified),
        "n_attempts": len(entry.attempts),
        "prompt_tokens": entry.prompt_tokens,
        "completion_tokens": entry.completion_tokens,
        "verifier_cost_usd": entry.verifier_cost_usd,
    }


def attempt_values(entry: LedgerEntry) -> list[dict[str, Any]]:
    """The entry's `attempts` rows: each attempt's fields, its scores as JSON."""
    return [
        {
            "request_id": entry.request_id,
            **_fields(a, "scores"),
            "scores_json": json.dumps(a.scores, sort_keys=True),
        }
        for a in entry.attempts
    ]


def pending_values(pending: PendingEntry) -> dict[str, Any]:
    """The pending row's columns that both stores share (PostgreSQL adds `expires_at` itself)."""
    return _fields(pending)


def pair_values(pair: ShadowPair) -> dict[str, Any]:
    """The pair's `shadow_pairs` row: its fields by name, the scores as JSON, agreement as 0/1."""
    return {
        **_fields(pair, "scores"),
        "scores_json": json.dumps(pair.scores, sort_keys=True),
        "agree": int(pair.agree),
    }


def entry_from_row(row: Row, attempts: Sequence[AttemptEntry]) -> LedgerEntry:
    """A `requests` row with its attempts (the sums it stores are recomputed from them)."""
    values = _read(LedgerEntry, row, "attempts", "escalated", "unverified")
    return LedgerEntry(
        escalated=bool(row["escalated"]), unverified=bool(row["unverified"]), attempts=tuple(attempts), **values
    )


def attempt_from_row(row: Row) -> AttemptEntry:
    return AttemptEntry(scores=json.loads(row["scores_json"]), **_read(AttemptEntry, row, "scores"))


def pending_from_row(row: Row) -> PendingEntry:
    return PendingEntry(**_read(PendingEntry, row))


def pair_from_row(row: Row) -> ShadowPair:
    values = _read(ShadowPair, row, "scores", "agree")
    return ShadowPair(scores=json.loads(row["scores_json"]), agree=bool(row["agree"]), **values)


def feedback_values(feedback: Feedback) -> dict[str, Any]:
    """The label's `feedback` row: its fields by name."""
    return _fields(feedback)


def feedback_from_row(row: Row) -> Feedback:
    return Feedback(**_read(Feedback, row))


def cache_values(row: CacheRow) -> dict[str, Any]:
    """The cached answer's `cache_entries` row: its fields by name."""
    return _fields(row)


def cache_from_row(row: Row) -> CacheRow:
    return CacheRow(**_read(CacheRow, row))
