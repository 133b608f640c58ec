"""The control plane's tables in the ledger's database: one SQL text for SQLite and PostgreSQL.

Keys, teams, user limits, the audit log and `control_version` live beside the ledger (their
tables are in `router.ledger.schema`), so a PostgreSQL deployment has one database to run and
every replica reads the same keys. Each change is one transaction that writes the rows, its
audit row and the version bump together: a replica that sees the new version sees the change,
and no change exists without its audit row.

The statements are written once with `?` placeholders; PostgreSQL's driver gets them as `%s`.
Both stores take `INSERT ... ON CONFLICT`, so replicas importing the config's keys at the same
instant import each once. This module opens its own connection (a small pool on PostgreSQL): the
ledger's writer thread is never blocked by an admin's query, nor an admin by the ledger.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from router.config import LedgerSettings
from router.control.records import ControlError, KeyRecord, Limits, Snapshot, TeamRecord, UserLimit
from router.ledger.stores import is_postgres, open_store, password_of

_KEY_COLUMNS = (
    "name, hash, roles, team, usd_per_day, usd_per_month, requests_per_minute, tokens_per_minute, "
    "models, allow_tests, expires_at, revoked_at, created_at, created_by"
)
_LIMIT_COLUMNS = ("usd_per_day", "usd_per_month", "requests_per_minute", "tokens_per_minute")
AUDIT_PAGE_MAX = 1000  # rows in one page of the audit log (the admin API's and the CLI's)


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def fetchone(self) -> Any: ...

    @property
    def rowcount(self) -> int: ...


class _Sql:
    """One transaction's cursor, translating `?` to the driver's placeholder."""

    def __init__(self, cur: Any, postgres: bool) -> None:
        self.cur = cur
        self.postgres = postgres

    def run(self, sql: str, params: Sequence[Any] = ()) -> _Sql:
        self.cur.execute(sql.replace("?", "%s") if self.postgres else sql, tuple(params))
        return self

    def all(self) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.cur.fetchall()]

    def one(self) -> tuple[Any, ...] | None:
        row = self.cur.fetchone()
        return None if row is None else tuple(row)

    @property
    def count(self) -> int:
        return int(self.cur.rowcount)


class ControlStore:
    """The control tables at the ledger's location. Thread-safe; every method blocks."""

    def __init__(self, location: str | Path, settings: LedgerSettings | None = None) -> None:
        self.location = str(location)
        self.settings = settings if settings is not None else LedgerSettings()
        self.postgres = is_postgres(self.location)
        self._lock = threading.Lock()  # SQLite: one connection, one transaction at a time
        self._conn: sqlite3.Connection | None = None
        self._pool: Any = None

    def open(self) -> None:
        # the ledger's own open creates (SQLite) or migrates (PostgreSQL) every table, these included
        ledger = open_store(self.location, settings=self.settings)
        ledger.open()
        ledger.close()
        if self.postgres:
            import psycopg_pool

            kwargs: dict[str, Any] = {"connect_timeout": max(1, round(self.settings.connect_timeout_s))}
            password = password_of(self.settings)
            if password is not None:
                kwargs["password"] = password
            self._pool = psycopg_pool.ConnectionPool(
                self.location, min_size=1, max_size=2, kwargs=kwargs, open=False, name="tierroute-control"
            )
            self._pool.open(wait=True, timeout=self.settings.connect_timeout_s)
        else:
            self._conn = sqlite3.connect(self.location, isolation_level=None, timeout=30.0, check_same_thread=False)
        with self.transaction() as sql:
            sql.run(
                "INSERT INTO control_version (id, version, changed_at) VALUES (1, 0, ?) ON CONFLICT DO NOTHING",
                (time.time(),),
            )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        with self._lock:  # never under a transaction another thread is in (a poll the close outran)
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Sql]:
        if self.postgres:
            if self._pool is None:
                raise RuntimeError("control store is not open")
            with self._pool.connection() as conn, conn.transaction():
                yield _Sql(conn.cursor(), True)
            return
        if self._conn is None:
            raise RuntimeError("control store is not open")
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield _Sql(conn.cursor(), False)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise

    # -- reads -----------------------------------------------------------------------------------

    def version(self) -> int:
        with self.transaction() as sql:
            row = sql.run("SELECT version FROM control_version WHERE id = 1").one()
        return int(row[0]) if row else 0

    def snapshot(self) -> Snapshot:
        with self.transaction() as sql:
            row = sql.run("SELECT version FROM control_version WHERE id = 1").one()
            keys = [_key(r) for r in sql.run(f"SELECT {_KEY_COLUMNS} FROM api_keys").all()]
            teams = [
                TeamRecord(r[0], Limits(*r[1:5]), float(r[5]))
                for r in sql.run(f"SELECT name, {', '.join(_LIMIT_COLUMNS)}, created_at FROM teams").all()
            ]
            users = [
                UserLimit(r[0], r[1], Limits(*r[2:6]))
                for r in sql.run(f"SELECT team, end_user, {', '.join(_LIMIT_COLUMNS)} FROM user_limits").all()
            ]
        return Snapshot(
            int(row[0]) if row else 0,
            {k.name: k for k in keys},
            {t.name: t for t in teams},
            {(u.team, u.user): u for u in users},
        )

    def spend(self, where: str, params: Sequence[Any], day: float, month: float) -> dict[str, float | int]:
        """Settled spend today and this month, requests today, and live reservations, of the
        requests `where` selects (a clause on `requests`/`pending` columns)."""
        with self.transaction() as sql:
            row = sql.run(
                "SELECT coalesce(sum(CASE WHEN ts >= ? THEN cost_usd ELSE 0 END), 0), coalesce(sum(cost_usd), 0), "
                "coalesce(sum(CASE WHEN ts >= ? THEN 1 ELSE 0 END), 0), "
                "coalesce(sum(CASE WHEN ts >= ? THEN prompt_tokens + completion_tokens ELSE 0 END), 0) "
                f"FROM requests WHERE ts >= ? AND {where}",
                (day, day, day, month, *params),
            ).one()
            live = " AND expires_at > ?" if self.postgres else ""
            reserved = sql.run(
                f"SELECT coalesce(sum(reserved_usd), 0) FROM pending WHERE {where}{live}",
                (*params, time.time()) if self.postgres else tuple(params),
            ).one()
        assert row is not None and reserved is not None
        return {
            "usd_today": float(row[0]),
            "usd_this_month": float(row[1]),
            "requests_today": int(row[2]),
            "tokens_today": int(row[3]),
            "usd_reserved_in_flight": float(reserved[0]),
        }

    def note(self, actor: str, action: str, target: str, detail: dict[str, Any]) -> None:
        """An audit row for something that changed nothing (a refused admin attempt): no version
        bump, so no replica reloads its keys for it."""
        with self.transaction() as sql:
            sql.run(
                "INSERT INTO audit (ts, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)",
                (time.time(), actor, action, target, json.dumps(detail, sort_keys=True)),
            )

    def audit(self, since: float | None = None, limit: int = AUDIT_PAGE_MAX) -> list[dict[str, Any]]:
        """The newest `limit` rows since `since`, newest first (`audit_page` reaches the rest)."""
        return self.audit_page(since, limit).rows

    def audit_page(
        self, since: float | None = None, limit: int = AUDIT_PAGE_MAX, cursor: str | None = None
    ) -> AuditPage:
        """One page of the audit log, newest first: the `limit` rows after `cursor` (None: from
        the newest), and the cursor of the next page (None when no row is left).

        The table has no id (PostgreSQL has no rowid, and a column added to both stores would
        be a migration for a page), and timestamps can tie, so a cursor is the last row's `ts`
        and how many rows of that `ts` were already given; ties are ordered by every column,
        so each page continues exactly where the last stopped. Rows written later have a later
        `ts` and land before the first page, never inside the walk."""
        at, skip = _cursor(cursor)
        upto, bound = ("", ()) if at is None else (" AND ts <= ?", (at,))
        with self.transaction() as sql:
            found = sql.run(
                f"SELECT ts, actor, action, target, detail FROM audit WHERE ts >= ?{upto} "
                "ORDER BY ts DESC, actor, action, target, detail LIMIT ? OFFSET ?",
                (since or 0.0, *bound, limit + 1, skip),
            ).all()
        more = len(found) > limit
        rows = [
            {"ts": float(r[0]), "actor": r[1], "action": r[2], "target": r[3], "detail": json.loads(r[4])}
            for r in found[:limit]
        ]
        if not more or not rows:
            return AuditPage(rows, None)
        last = rows[-1]["ts"]
        same = sum(1 for r in rows if r["ts"] == last) + (skip if last == at else 0)
        return AuditPage(rows, f"{last!r}:{same}")


@dataclass(frozen=True)
class AuditPage:
    rows: list[dict[str, Any]]
    next_cursor: str | None  # None: no row is left


def _cursor(cursor: str | None) -> tuple[float | None, int]:
    """(the newest ts a page may hold, None for any; how many rows of exactly that ts to skip)
    from a cursor `audit_page` made; ControlError for anything else."""
    if cursor is None:
        return None, 0
    at, _, skip = cursor.partition(":")
    try:
        # ASCII digits only (int() reads other scripts' digits too), and a skip no page could need:
        # SQLite's OFFSET is a 64-bit integer, and a larger one was a 500
        found = float(at), int(skip) if skip.isascii() and skip.isdigit() and len(skip) <= 9 else -1
    except ValueError:
        found = (math.nan, -1)
    if not math.isfinite(found[0]) or found[1] < 0:
        raise ControlError(f"cursor: not one this audit log gave (got {cursor[:80]!r}); start without one")
    return found


def record(sql: _Sql, actor: str, action: str, target: str, detail: dict[str, Any]) -> None:
    """The change's audit row and the version bump, in its transaction."""
    now = time.time()
    sql.run(
        "INSERT INTO audit (ts, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)",
        (now, actor, action, target, json.dumps(detail, sort_keys=True)),
    )
    sql.run("UPDATE control_version SET version = version + 1, changed_at = ? WHERE id = 1", (now,))


def insert_key(sql: _Sql, key: KeyRecord) -> bool:
    """Insert the key unless one of its name exists (whatever its state); whether it was inserted."""
    sql.run(
        f"INSERT INTO api_keys ({_KEY_COLUMNS}) VALUES ({', '.join('?' * 14)}) ON CONFLICT (name) DO NOTHING",
        (
            key.name,
            key.hash,
            ",".join(key.roles),
            key.team,
            *key.limits.as_dict().values(),
            None if key.models is None else json.dumps(list(key.models)),
            int(key.allow_tests),
            key.expires_at,
            key.revoked_at,
            key.created_at,
            key.created_by,
        ),
    )
    return sql.count == 1


def _key(r: tuple[Any, ...]) -> KeyRecord:
    return KeyRecord(
        name=r[0],
        hash=r[1],
        roles=tuple(r[2].split(",")),
        team=r[3],
        limits=Limits(r[4], r[5], r[6], r[7]),
        models=None if r[8] is None else tuple(json.loads(r[8])),
        allow_tests=bool(r[9]),
        expires_at=None if r[10] is None else float(r[10]),
        revoked_at=None if r[11] is None else float(r[11]),
        created_at=float(r[12]),
        created_by=r[13],
    )
