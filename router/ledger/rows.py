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
from router.ledger.entries import AttemptEntry, LedgerEntry, PendingEntry, ShadowPair

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


def request_values(entry: LedgerEntry) -> dict[str, Any]:
    """The entry's `requests` row."""
    return {
        "request_id": entry.request_id,
        "ts": entry.ts,
        "key_id": entry.key_id,
        "model": entry.model,
        "tier": entry.tier,
        "escalated": int(entry.escalated),
        "unverified": int(entry.unverified),
        "n_attempts": len(entry.attempts),
        "prompt_tokens": entry.prompt_tokens,
        "completion_tokens": entry.completion_tokens,
        "latency_ms": entry.latency_ms,
        "cost_usd": entry.cost_usd,
        "verifier_cost_usd": entry.verifier_cost_usd,
        "counterfactual_usd": entry.counterfactual_usd,
        "task": entry.task,
        "task_why": entry.task_why,
        "user": entry.user,
    }


def attempt_values(entry: LedgerEntry) -> list[dict[str, Any]]:
    """The entry's `attempts` rows."""
    return [
        {
            "request_id": entry.request_id,
            "idx": a.idx,
            "tier": a.tier,
            "decision": a.decision,
            "reason": a.reason,
            "error": a.error,
            "score": a.score,
            "threshold": a.threshold,
            "scores_json": json.dumps(a.scores, sort_keys=True),
            "prompt_tokens": a.prompt_tokens,
            "completion_tokens": a.completion_tokens,
            "finish_reason": a.finish_reason,
            "latency_ms": a.latency_ms,
            "busy_ms": a.busy_ms,
            "verify_ms": a.verify_ms,
            "cost_usd": a.cost_usd,
            "verifier_cost_usd": a.verifier_cost_usd,
            "verifier_tokens": a.verifier_tokens,
        }
        for a in entry.attempts
    ]


def pending_values(pending: PendingEntry) -> dict[str, Any]:
    """The pending row's columns that both stores share (PostgreSQL adds `expires_at` itself)."""
    return {
        "request_id": pending.request_id,
        "ts": pending.ts,
        "key_id": pending.key_id,
        "model": pending.model,
        "reserved_usd": pending.reserved_usd,
    }


def pair_values(pair: ShadowPair) -> dict[str, Any]:
    """The pair's `shadow_pairs` row: its fields by name, the scores as JSON, agreement as 0/1."""
    values = {f.name: getattr(pair, f.name) for f in dataclasses.fields(pair)}
    values["scores_json"] = json.dumps(values.pop("scores"), sort_keys=True)
    values["agree"] = int(pair.agree)
    return values


def entry_from_row(row: Row, attempts: Sequence[AttemptEntry]) -> LedgerEntry:
    """A `requests` row with its attempts (the sums it stores are recomputed from them)."""
    return LedgerEntry(
        request_id=row["request_id"],
        ts=row["ts"],
        key_id=row["key_id"],
        model=row["model"],
        tier=row["tier"],
        escalated=bool(row["escalated"]),
        unverified=bool(row["unverified"]),
        latency_ms=row["latency_ms"],
        cost_usd=row["cost_usd"],
        counterfactual_usd=row["counterfactual_usd"],
        attempts=tuple(attempts),
        task=row["task"],
        task_why=row["task_why"],
        user=row["user"],
    )


def attempt_from_row(row: Row) -> AttemptEntry:
    return AttemptEntry(
        idx=row["idx"],
        tier=row["tier"],
        decision=row["decision"],
        reason=row["reason"],
        error=row["error"],
        score=row["score"],
        threshold=row["threshold"],
        scores=json.loads(row["scores_json"]),
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
        finish_reason=row["finish_reason"],
        latency_ms=row["latency_ms"],
        busy_ms=row["busy_ms"],
        verify_ms=row["verify_ms"],
        cost_usd=row["cost_usd"],
        verifier_cost_usd=row["verifier_cost_usd"],
        verifier_tokens=row["verifier_tokens"],
    )


def pending_from_row(row: Row) -> PendingEntry:
    return PendingEntry(**{f.name: row[f.name] for f in dataclasses.fields(PendingEntry)})


def pair_from_row(row: Row) -> ShadowPair:
    values = {f.name: row[f.name] for f in dataclasses.fields(ShadowPair) if f.name != "scores"}
    values["agree"] = bool(values["agree"])
    return ShadowPair(scores=json.loads(row["scores_json"]), **values)
