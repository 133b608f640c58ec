"""The ledger in PostgreSQL: one database that every replica of the service writes and reads.

It is the same ledger as `SQLiteStore` (the tables and columns of `router.ledger.schema`, one
transaction per request, a settled row replacing its pending row atomically), plus what replicas
need to agree on a key's limits (`router.admission.limits.SharedLimits`):

    limit_keys   key_id PK                  one row per key: admissions lock it (SELECT ... FOR UPDATE),
                                            so a key's admissions are serial across replicas
    key_spend    key_id, kind, start, usd   settled cost per key and UTC day ('day') or month ('month'),
                                            added to in the settling transaction: an admission reads two
                                            rows, not a month of requests
    rate_events  key_id, ts                 one row per admission of a rate-limited key, on the
                                            database's clock; rows older than the window are deleted
    pending.expires_at                      a reservation stops counting then (its replica died, or
                                            never released it)
    token_events subject, request_id, ts,   tokens per admission of a token-limited key, team or
                 tokens                     user: its worst case, replaced by its real count when it
                                            settles; rows older than the window are deleted

A key's team and a team's end user are limited like a key: each is a subject (`team:NAME`,
`user:TEAM:USER`) with its own `limit_keys` row, `key_spend` rows and events, and an admission
locks every subject it falls under, in one order. A client can name a new end user with every
request, so `prune` (run by each replica every `ledger.prune_every_s`, one at a time) deletes the
rows no admission reads again: idle users' lock rows, events past the window, past days' spend.

The module is the ledger's rows (requests, attempts, pending, shadow pairs, feedback); the shared
admission state is `router.ledger.postgres_limits`, the response cache's rows
`router.ledger.postgres_cache`, and the schema's versioned migrations, applied at start-up under an
advisory lock, `router.ledger.postgres_migrations`.

Connections come from a psycopg pool: the ledger's writer thread takes one per write, admissions
(on their own threads) take others, and a report takes one for its snapshot. A connection that
cannot be had within `connect_timeout_s` is an error the caller turns into 503.

Durability is the SQLite store's by default (`ledger.synchronous_commit = "off"`, as SQLite's
`synchronous=NORMAL`): a commit is visible to every replica at once and survives any replica being
killed; a crash of the database server itself may lose its last fraction of a second of commits.
"on" waits for each commit's fsync; the writer thread is one per replica, so a replica's ledger
then writes at most one request per fsync (measured here: ~7 ms p50 on a loaded disk, which
cannot keep up with 100 requests/s).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool
from psycopg.rows import dict_row

from router.admission.limits import day_start, month_start
from router.errors import ConfigError
from router.ledger import rows, schema
from router.ledger.entries import (
    AttemptEntry,
    DuplicateEntry,
    Feedback,
    LabelCount,
    LedgerEntry,
    PendingEntry,
    RejectedEntry,
    ShadowPair,
)
from router.ledger.postgres_cache import CacheRows
from router.ledger.postgres_limits import _NOW, SharedAdmission
from router.ledger.postgres_migrations import applied, migrate
from router.ledger.store import spend_subjects

log = logging.getLogger(__name__)


_INSERT_REQUEST = rows.insert("requests", "postgres")
# the pending columns both stores have (`expires_at` is this store's own, read by admissions only)
_SHARED_PENDING = ", ".join(f'"{f.name}"' if f.name in ("user",) else f.name for f in dataclasses.fields(PendingEntry))
_INSERT_ATTEMPT = rows.insert("attempts", "postgres")
_INSERT_PAIR = (
    rows.insert("shadow_pairs", "postgres")
    + " ON CONFLICT (request_id) DO UPDATE SET "
    + ", ".join(f"{c.quoted} = EXCLUDED.{c.quoted}" for c in schema.columns("shadow_pairs", "postgres")[1:])
)
_INSERT_FEEDBACK = rows.insert("feedback", "postgres")


class PostgresStore(SharedAdmission, CacheRows):
    """A `LedgerStore`, a `SharedCounter` (`SharedAdmission`) and the response cache's store
    (`CacheRows`) on one PostgreSQL database. Thread-safe: each call takes its own connection from
    the pool."""

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        read_only: bool = False,
        pool_size: int = 8,
        connect_timeout_s: float = 5.0,
        hold_ttl_s: float = 600.0,
        synchronous_commit: str = "off",
    ) -> None:
        self.url = url
        self.synchronous_commit = synchronous_commit
        self.read_only = read_only
        self.pool_size = pool_size
        self.connect_timeout_s = connect_timeout_s
        self.hold_ttl_s = hold_ttl_s  # how long a pending row written by `begin` counts
        self._password = password
        self._pool: psycopg_pool.ConnectionPool | None = None
        self.migrated: list[int] = []  # the migrations `open` applied

    @property
    def pool(self) -> psycopg_pool.ConnectionPool:
        if self._pool is None:
            raise RuntimeError("ledger store is not open")
        return self._pool

    # -- LedgerStore -----------------------------------------------------------------------------

    def open(self) -> None:
        kwargs: dict[str, Any] = {
            "connect_timeout": max(1, round(self.connect_timeout_s)),
            "options": f"-c synchronous_commit={self.synchronous_commit}",
        }
        if self._password is not None:
            kwargs["password"] = self._password
        pool = psycopg_pool.ConnectionPool(
            self.url,
            min_size=1,
            max_size=self.pool_size,
            kwargs=kwargs,
            timeout=self.connect_timeout_s,
            open=False,
            name="tierroute-ledger",
        )
        try:
            pool.open(wait=True, timeout=self.connect_timeout_s)
            if not self.read_only:
                with pool.connection() as conn:
                    self.migrated = migrate(conn)
            else:
                with pool.connection() as conn:
                    if applied(conn) == 0:
                        raise ConfigError(f"ledger.url: no ledger at {self.url} (run `tierroute ledger migrate`)")
        except ConfigError:
            pool.close()
            raise
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            pool.close()
            raise ConfigError(f"ledger.url: cannot open ledger {self.url}: {exc}") from None
        self._pool = pool

    def begin(self, pending: PendingEntry) -> None:
        with self.pool.connection() as conn:
            conn.execute(
                'INSERT INTO pending (request_id, ts, key_id, model, reserved_usd, team, "user", expires_at) '
                "VALUES (%(request_id)s, %(ts)s, %(key_id)s, %(model)s, %(reserved_usd)s, %(team)s, %(user)s, "
                f"{_NOW} + %(hold_ttl_s)s) ON CONFLICT (request_id) DO UPDATE SET "
                "ts = EXCLUDED.ts, key_id = EXCLUDED.key_id, model = EXCLUDED.model, "
                'reserved_usd = EXCLUDED.reserved_usd, team = EXCLUDED.team, "user" = EXCLUDED."user", '
                "expires_at = EXCLUDED.expires_at",
                {**rows.pending_values(pending), "hold_ttl_s": self.hold_ttl_s},
            )

    def write(self, entry: LedgerEntry) -> None:
        try:
            # pipelined: the transaction's statements go out together, one round trip to the server
            with self.pool.connection() as conn, conn.pipeline(), conn.transaction():
                _insert(conn, entry)
        except psycopg.errors.UniqueViolation as exc:
            raise DuplicateEntry(f"{entry.request_id}: {exc}") from exc
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            raise RejectedEntry(f"{entry.request_id}: {exc}") from exc

    def spend_by_key(self, since: float) -> dict[str, float]:
        with self.pool.connection() as conn:
            found = conn.execute(
                "SELECT key_id, SUM(usd) FROM ("
                " SELECT key_id, cost_usd AS usd FROM requests WHERE ts >= %s"
                f" UNION ALL SELECT key_id, reserved_usd FROM pending WHERE ts >= %s AND expires_at > {_NOW}"
                ") s GROUP BY key_id",
                (since, since),
            ).fetchall()
        return {key: float(total) for key, total in found}

    def pending(self) -> Iterator[PendingEntry]:
        with self.pool.connection() as conn:
            found = (
                conn.cursor(row_factory=dict_row)
                .execute(f"SELECT {_SHARED_PENDING} FROM pending ORDER BY ts, request_id")
                .fetchall()
            )
        for row in found:
            yield rows.pending_from_row(row)

    def entries(self, since: float | None = None, until: float | None = None) -> Iterator[LedgerEntry]:
        where, params = _window("ts", since, until)
        r_where, _ = _window("r.ts", since, until)
        attempts: dict[str, list[AttemptEntry]] = {}
        with self.pool.connection() as conn, conn.transaction():
            # one snapshot for both tables: a request and its attempts are read together
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur = conn.cursor(row_factory=dict_row)
            for row in cur.execute(
                f"SELECT {schema.column_list('attempts', 'postgres', 'a.')} FROM attempts a "
                f"JOIN requests r ON r.request_id = a.request_id {r_where} ORDER BY a.request_id, a.idx",
                params,
            ):
                attempts.setdefault(row["request_id"], []).append(rows.attempt_from_row(row))
            fetched = cur.execute(
                f"SELECT {schema.column_list('requests', 'postgres')} FROM requests {where} ORDER BY ts, request_id",
                params,
            ).fetchall()
        for row in fetched:
            yield rows.entry_from_row(row, attempts.get(row["request_id"], ()))

    def write_pair(self, pair: ShadowPair, entry: LedgerEntry | None = None) -> None:
        with self.pool.connection() as conn, conn.transaction():
            if entry is not None:
                _insert(conn, entry)
            conn.execute(_INSERT_PAIR, rows.pair_values(pair))

    def pairs(self, since: float | None = None, until: float | None = None) -> Iterator[ShadowPair]:
        where, params = _window("ts", since, until)
        with self.pool.connection() as conn:
            found = (
                conn.cursor(row_factory=dict_row)
                .execute(
                    f"SELECT {schema.column_list('shadow_pairs', 'postgres')} FROM shadow_pairs {where} "
                    "ORDER BY ts, request_id",
                    params,
                )
                .fetchall()
            )
        for row in found:
            yield rows.pair_from_row(row)

    def entry(self, request_id: str) -> LedgerEntry | None:
        with self.pool.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur = conn.cursor(row_factory=dict_row)
            row = cur.execute(
                f"SELECT {schema.column_list('requests', 'postgres')} FROM requests WHERE request_id = %s",
                (request_id,),
            ).fetchone()
            found = cur.execute(
                f"SELECT {schema.column_list('attempts', 'postgres')} FROM attempts WHERE request_id = %s ORDER BY idx",
                (request_id,),
            ).fetchall()
        return None if row is None else rows.entry_from_row(row, [rows.attempt_from_row(a) for a in found])

    def write_feedback(self, feedback: Feedback, limit: int | None = None) -> LabelCount:
        try:
            with self.pool.connection() as conn:
                # the request's row locked for the count and the insert: labels raced at once, on
                # any replica, are counted one after another
                conn.execute("SELECT 1 FROM requests WHERE request_id = %s FOR NO KEY UPDATE", (feedback.request_id,))
                row = conn.execute(
                    "SELECT count(*), count(*) FILTER (WHERE key_id = %s) FROM feedback WHERE request_id = %s",
                    (feedback.key_id, feedback.request_id),
                ).fetchone()
                earlier = LabelCount(int(row[0]), int(row[1])) if row is not None else LabelCount(0, 0)
                if limit is None or earlier.giver < limit:
                    conn.execute(_INSERT_FEEDBACK, rows.feedback_values(feedback))
        except psycopg.errors.UniqueViolation as exc:
            raise DuplicateEntry(f"{feedback.feedback_id}: {exc}") from exc
        return earlier

    def feedback(
        self, since: float | None = None, until: float | None = None, request_id: str | None = None
    ) -> Iterator[Feedback]:
        where, window = _window("ts", since, until)
        params: tuple[float | str, ...] = window
        if request_id is not None:
            where = f"{where} AND request_id = %s" if where else "WHERE request_id = %s"
            params = (*params, request_id)
        with self.pool.connection() as conn:
            found = (
                conn.cursor(row_factory=dict_row)
                .execute(
                    f"SELECT {schema.column_list('feedback', 'postgres')} FROM feedback {where} "
                    "ORDER BY ts, feedback_id",
                    params,
                )
                .fetchall()
            )
        for row in found:
            yield rows.feedback_from_row(row)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _insert(conn: psycopg.Connection[Any], entry: LedgerEntry) -> None:
    """The settled rows, the pending row's removal and the key's spend, in the caller's transaction."""
    conn.execute("DELETE FROM pending WHERE request_id = %s", (entry.request_id,))
    conn.execute(_INSERT_REQUEST, rows.request_values(entry))
    attempts = rows.attempt_values(entry)
    if attempts:
        conn.cursor().executemany(_INSERT_ATTEMPT, attempts)
    for subject in spend_subjects(entry.key_id, entry.team, entry.user):
        conn.execute(
            "INSERT INTO key_spend (key_id, kind, start, usd) VALUES (%s, 'day', %s, %s), (%s, 'month', %s, %s) "
            "ON CONFLICT (key_id, kind, start) DO UPDATE SET usd = key_spend.usd + EXCLUDED.usd",
            (subject, day_start(entry.ts), entry.cost_usd, subject, month_start(entry.ts), entry.cost_usd),
        )
    # a token-rate window counts the request at its real size from now on
    conn.execute(
        "UPDATE token_events SET tokens = %s WHERE request_id = %s",
        (entry.prompt_tokens + entry.completion_tokens, entry.request_id),
    )


def _window(column: str, since: float | None, until: float | None) -> tuple[str, tuple[float, ...]]:
    clauses, params = [], []
    if since is not None:
        clauses.append(f"{column} >= %s")
        params.append(since)
    if until is not None:
        clauses.append(f"{column} < %s")
        params.append(until)
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", tuple(params)
