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

Schema changes are versioned migrations (`MIGRATIONS`, recorded in `schema_migrations`), applied
in order at start-up under an advisory lock, so replicas starting together migrate once;
`tierroute ledger migrate` applies them without serving. The released ones (`RELEASED`) run as
they were written; later ones are generated from `router.ledger.schema`, which a test holds to
the released text token for token.

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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import psycopg_pool
from psycopg.rows import dict_row

from router.admission.limits import PRUNE_BATCH, WINDOW_S, KeyWindow, Reservation, day_start, month_start
from router.admission.quota import Quota
from router.errors import ConfigError
from router.ledger import rows, schema
from router.ledger.entries import (
    AttemptEntry,
    CacheRow,
    DuplicateEntry,
    Feedback,
    LabelCount,
    LedgerEntry,
    PendingEntry,
    RejectedEntry,
    ShadowPair,
)
from router.ledger.store import spend_subjects

log = logging.getLogger(__name__)

_NOW = "extract(epoch from clock_timestamp())::double precision"
_MIGRATION_LOCK = 0x7469657272  # pg_advisory_xact_lock key: one replica migrates at a time
_PRUNE_LOCK = _MIGRATION_LOCK + 1  # pg_try_advisory_xact_lock key: one replica prunes at a time
# an event is pruned only a whole window after it left the window: an admission that read its
# clock a moment before the prune did still finds every event it must count
_EVENT_KEEP_S = 2 * WINDOW_S

# (version, why, statements). Append only: a released migration is never edited, and a new one is
# not written here but generated from the description (`router.ledger.schema`).
RELEASED: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "the ledger (schema 4 of the SQLite store) and the shared limits' tables",
        """
CREATE TABLE requests (
    request_id         TEXT PRIMARY KEY,
    ts                 DOUBLE PRECISION NOT NULL,
    key_id             TEXT NOT NULL,
    model              TEXT NOT NULL,
    tier               TEXT NOT NULL,
    escalated          INTEGER NOT NULL,
    unverified         INTEGER NOT NULL,
    n_attempts         INTEGER NOT NULL,
    prompt_tokens      INTEGER NOT NULL,
    completion_tokens  INTEGER NOT NULL,
    latency_ms         DOUBLE PRECISION NOT NULL,
    cost_usd           DOUBLE PRECISION NOT NULL,
    verifier_cost_usd  DOUBLE PRECISION NOT NULL,
    counterfactual_usd DOUBLE PRECISION NOT NULL,
    task               TEXT,
    task_why           TEXT
);
CREATE INDEX requests_ts ON requests (ts);
CREATE INDEX requests_key_ts ON requests (key_id, ts);
CREATE TABLE pending (
    request_id   TEXT PRIMARY KEY,
    ts           DOUBLE PRECISION NOT NULL,
    key_id       TEXT NOT NULL,
    model        TEXT NOT NULL,
    reserved_usd DOUBLE PRECISION NOT NULL,
    expires_at   DOUBLE PRECISION NOT NULL
);
CREATE INDEX pending_key ON pending (key_id, expires_at);
CREATE TABLE attempts (
    request_id        TEXT NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    idx               INTEGER NOT NULL,
    tier              TEXT NOT NULL,
    decision          TEXT NOT NULL,
    reason            TEXT NOT NULL,
    error             TEXT,
    score             DOUBLE PRECISION,
    threshold         DOUBLE PRECISION NOT NULL,
    scores_json       TEXT NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    finish_reason     TEXT,
    latency_ms        DOUBLE PRECISION,
    busy_ms           DOUBLE PRECISION,
    verify_ms         DOUBLE PRECISION NOT NULL,
    cost_usd          DOUBLE PRECISION NOT NULL,
    verifier_cost_usd DOUBLE PRECISION NOT NULL,
    verifier_tokens   INTEGER NOT NULL,
    PRIMARY KEY (request_id, idx)
);
CREATE TABLE shadow_pairs (
    request_id        TEXT PRIMARY KEY,
    shadow_request_id TEXT NOT NULL,
    ts                DOUBLE PRECISION NOT NULL,
    tier              TEXT NOT NULL,
    target            TEXT NOT NULL,
    task              TEXT,
    score             DOUBLE PRECISION,
    threshold         DOUBLE PRECISION NOT NULL,
    scores_json       TEXT NOT NULL,
    agree             INTEGER NOT NULL,
    rule              TEXT NOT NULL,
    detail            TEXT NOT NULL,
    answer_extracted  TEXT,
    shadow_extracted  TEXT,
    prompt_sha256     TEXT NOT NULL,
    answer_sha256     TEXT NOT NULL,
    shadow_sha256     TEXT NOT NULL,
    shadow_cost_usd   DOUBLE PRECISION NOT NULL,
    prompt_json       TEXT,
    answer_text       TEXT,
    shadow_text       TEXT
);
CREATE INDEX shadow_pairs_ts ON shadow_pairs (ts);
CREATE TABLE limit_keys (key_id TEXT PRIMARY KEY);
CREATE TABLE key_spend (
    key_id TEXT NOT NULL,
    kind   TEXT NOT NULL,
    start  DOUBLE PRECISION NOT NULL,
    usd    DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (key_id, kind, start)
);
CREATE TABLE rate_events (key_id TEXT NOT NULL, ts DOUBLE PRECISION NOT NULL);
CREATE INDEX rate_events_key_ts ON rate_events (key_id, ts);
""",
    ),
    (2, "requests.user: OpenAI's `user` field as the client sent it", 'ALTER TABLE requests ADD COLUMN "user" TEXT;'),
)
MIGRATIONS = RELEASED + tuple(
    (version, schema.postgres_why(version), schema.postgres_migration(version))
    for version in schema.versions("postgres")
    if version > RELEASED[-1][0]
)
SCHEMA_VERSION = MIGRATIONS[-1][0]

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

_INSERT_CACHE = (
    rows.insert("cache_entries", "postgres")
    + " ON CONFLICT (cache_key) DO UPDATE SET "
    + ", ".join(f"{c.quoted} = EXCLUDED.{c.quoted}" for c in schema.columns("cache_entries", "postgres")[1:])
)


class PostgresStore:
    """A `LedgerStore` and a `SharedCounter` on one PostgreSQL database. Thread-safe: each call
    takes its own connection from the pool."""

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

    def cache_get(self, cache_key: str, scope: str, now: float) -> CacheRow | None:
        with self.pool.connection() as conn:
            found = (
                conn.cursor(row_factory=dict_row)
                .execute(
                    f"SELECT {schema.column_list('cache_entries', 'postgres')} FROM cache_entries "
                    "WHERE cache_key = %s AND scope = %s AND expires_at > %s",
                    (cache_key, scope, now),
                )
                .fetchone()
            )
        return None if found is None else rows.cache_from_row(found)

    def cache_put(self, row: CacheRow, max_entries: int | None, max_per_scope: int | None = None) -> None:
        with self.pool.connection() as conn, conn.pipeline(), conn.transaction():
            conn.execute(_INSERT_CACHE, rows.cache_values(row))
            conn.execute("DELETE FROM cache_entries WHERE expires_at <= %s", (row.created,))
            if max_per_scope is not None:  # the row's own scope's oldest past its share: no one else's
                own = conn.execute(
                    "SELECT created FROM cache_entries WHERE scope = %s ORDER BY created DESC LIMIT 1 OFFSET %s",
                    (row.scope, max_per_scope),
                ).fetchone()
                if own is not None:
                    conn.execute("DELETE FROM cache_entries WHERE scope = %s AND created <= %s", (row.scope, own[0]))
            if max_entries is None:
                return
            # the newest max_entries stay, whichever replica stored them: the cutoff is read off the
            # created index alone (ordering by more than `created` sorted the whole table)
            cutoff = conn.execute(
                "SELECT created FROM cache_entries ORDER BY created DESC LIMIT 1 OFFSET %s", (max_entries,)
            ).fetchone()
            if cutoff is not None:
                conn.execute("DELETE FROM cache_entries WHERE created <= %s", (cutoff[0],))

    def cache_drop(self, cache_key: str) -> None:
        with self.pool.connection() as conn:
            conn.execute("DELETE FROM cache_entries WHERE cache_key = %s", (cache_key,))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # -- SharedCounter ---------------------------------------------------------------------------

    def admit(
        self,
        reservation: Reservation,
        quotas: Sequence[Quota],
        day_start: float,
        month_start: float,
        decide: Callable[[Quota, KeyWindow], None],
    ) -> None:
        r = reservation
        with self.pool.connection() as conn, conn.transaction():
            # every quota's lock, taken in one order (so two admissions never wait on each other)
            # and held to commit: no other replica admits against any of them meanwhile
            ordered = sorted(quotas, key=lambda q: q.subject)
            now = 0.0
            for q in ordered:
                now = _lock_subject(conn, q.subject)
            for q in ordered:
                decide(q, _quota_window(conn, q, now, day_start, month_start))  # raises to refuse: all rolls back
            for q in ordered:
                if q.requests_per_minute is not None:
                    conn.execute("INSERT INTO rate_events (key_id, ts) VALUES (%s, %s)", (q.subject, now))
                if q.tokens_per_minute is not None:
                    conn.execute(
                        "INSERT INTO token_events (subject, request_id, ts, tokens) VALUES (%s, %s, %s, %s)",
                        (q.subject, r.request_id, now, r.reserved_tokens),
                    )
            if r.holds:
                conn.execute(
                    'INSERT INTO pending (request_id, ts, key_id, model, reserved_usd, team, "user", expires_at) '
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    (r.request_id, r.ts, r.key_id, r.model, r.reserved_usd, r.team, r.user, now + r.ttl_s),
                )

    def drop(self, request_id: str) -> None:
        with self.pool.connection() as conn:
            conn.execute("DELETE FROM pending WHERE request_id = %s", (request_id,))

    def prune(self, keep_day: float, keep_month: float, batch: int = PRUNE_BATCH) -> dict[str, int]:
        """Delete the counter rows no admission reads again, in batches of at most `batch` rows
        a table; what was deleted, per table (nothing when another replica is pruning now).

        - `rate_events`, `token_events`: events a window older than the window (`_EVENT_KEEP_S`).
        - `key_spend`: rows of a day before `keep_day` or a month before `keep_month` (the
          caller keeps yesterday's and last month's, which a request settling late may still add
          to), and rows at $0 (reading no row reads $0 too).
        - `limit_keys`: an end user's lock row (`user:TEAM:USER`) once that user is idle: no event
          in the window, no pending row, no spend row left (so nothing spent this month).

        Safe beside admissions and settlements on every replica: each row is locked with SKIP
        LOCKED before it is deleted, so the prune never waits on a row another transaction holds
        (it is never part of a deadlock), a row being written is left for the next prune, and a
        `key_spend` row that a settlement has just raised above $0 is re-checked under its lock
        and kept: no spend is lost. An admission whose subject's lock row is deleted under it
        inserts the row again (`_lock_subject`). One replica prunes at a time (an advisory lock)."""
        done = {"rate_events": 0, "token_events": 0, "key_spend": 0, "limit_keys": 0}
        with self.pool.connection() as conn, conn.transaction():
            row = conn.execute(f"SELECT pg_try_advisory_xact_lock(%s), {_NOW}", (_PRUNE_LOCK,)).fetchone()
            if row is None or not row[0]:
                return done
            cutoff = float(row[1]) - _EVENT_KEEP_S
            # rate_events rows are never updated, so a locked row's ctid names it to its delete
            done["rate_events"] = conn.execute(
                "WITH doomed AS (SELECT ctid FROM rate_events WHERE ts <= %s LIMIT %s FOR UPDATE SKIP LOCKED) "
                "DELETE FROM rate_events r USING doomed d WHERE r.ctid = d.ctid",
                (cutoff, batch),
            ).rowcount
            done["token_events"] = conn.execute(
                "WITH doomed AS (SELECT subject, request_id FROM token_events WHERE ts <= %s LIMIT %s "
                "FOR UPDATE SKIP LOCKED) DELETE FROM token_events t USING doomed d "
                "WHERE t.subject = d.subject AND t.request_id = d.request_id AND t.ts <= %s",
                (cutoff, batch, cutoff),
            ).rowcount
            # the condition again on the deleted row: a row a settlement raised above $0 after the
            # statement's snapshot is re-read under its lock, and kept
            dead = "(k.usd = 0 OR (k.kind = 'day' AND k.start < %s) OR (k.kind = 'month' AND k.start < %s))"
            done["key_spend"] = conn.execute(
                f"WITH doomed AS (SELECT key_id, kind, start FROM key_spend k WHERE {dead} LIMIT %s "
                "FOR UPDATE SKIP LOCKED) DELETE FROM key_spend k USING doomed d "
                f"WHERE k.key_id = d.key_id AND k.kind = d.kind AND k.start = d.start AND {dead}",
                (keep_day, keep_month, batch, keep_day, keep_month),
            ).rowcount
            done["limit_keys"] = conn.execute(
                "WITH doomed AS (SELECT key_id FROM limit_keys l WHERE key_id LIKE 'user:%%' "
                " AND NOT EXISTS (SELECT 1 FROM rate_events e WHERE e.key_id = l.key_id)"
                " AND NOT EXISTS (SELECT 1 FROM token_events t WHERE t.subject = l.key_id)"
                " AND NOT EXISTS (SELECT 1 FROM key_spend s WHERE s.key_id = l.key_id)"
                ' AND NOT EXISTS (SELECT 1 FROM pending p WHERE p.team IS NOT NULL AND p."user" IS NOT NULL'
                "   AND 'user:' || p.team || ':' || p.\"user\" = l.key_id)"
                " LIMIT %s FOR UPDATE SKIP LOCKED) "
                "DELETE FROM limit_keys k USING doomed d WHERE k.key_id = d.key_id",
                (batch,),
            ).rowcount
        return done

    def live_reservations(self) -> dict[str, float]:
        """USD per key held by unexpired reservations, on the database's clock (for checks and tests)."""
        with self.pool.connection() as conn:
            found = conn.execute(
                f"SELECT key_id, sum(reserved_usd) FROM pending WHERE expires_at > {_NOW} GROUP BY key_id"
            ).fetchall()
        return {key: float(total) for key, total in found}


def _lock_subject(conn: psycopg.Connection[Any], subject: str) -> float:
    """Lock a subject's row for the rest of the transaction (made if missing); the database's
    clock once it is held. A prune may delete an idle user's row between the insert and the lock
    (`PostgresStore.prune`): then the row is made again."""
    for _ in range(5):
        conn.execute("INSERT INTO limit_keys (key_id) VALUES (%s) ON CONFLICT DO NOTHING", (subject,))
        row = conn.execute(f"SELECT {_NOW} FROM limit_keys WHERE key_id = %s FOR UPDATE", (subject,)).fetchone()
        if row is not None:
            return float(row[0])
    raise RuntimeError(f"limits: the lock row of '{subject}' vanished five times in a row")


def _pending_filter(q: Quota) -> tuple[str, tuple[Any, ...]]:
    """Which pending rows hold a quota's reservations."""
    if q.level == "key":
        return "key_id = %s", (q.name,)
    if q.level == "team":
        return "team = %s", (q.name,)
    return 'team = %s AND "user" = %s', (q.team, q.name)


def _quota_window(
    conn: psycopg.Connection[Any], q: Quota, now: float, day_start: float, month_start: float
) -> KeyWindow:
    """One quota's window, read under its lock."""
    subject = q.subject
    recent, oldest = 0, None
    if q.requests_per_minute is not None:
        conn.execute("DELETE FROM rate_events WHERE key_id = %s AND ts <= %s", (subject, now - WINDOW_S))
        recent, oldest = conn.execute(
            "SELECT count(*), min(ts) FROM rate_events WHERE key_id = %s", (subject,)
        ).fetchone() or (0, None)
    tokens, tokens_oldest = 0, None
    if q.tokens_per_minute is not None:
        conn.execute("DELETE FROM token_events WHERE subject = %s AND ts <= %s", (subject, now - WINDOW_S))
        tokens, tokens_oldest = conn.execute(
            "SELECT coalesce(sum(tokens), 0), min(ts) FROM token_events WHERE subject = %s", (subject,)
        ).fetchone() or (0, None)
    spend: dict[str, float] = {}
    reserved = 0.0
    if q.has_budget:
        spend = dict(
            conn.execute(
                "SELECT kind, usd FROM key_spend WHERE key_id = %s AND "
                "((kind = 'day' AND start = %s) OR (kind = 'month' AND start = %s))",
                (subject, day_start, month_start),
            ).fetchall()
        )
        where, params = _pending_filter(q)
        row = conn.execute(
            f"SELECT coalesce(sum(reserved_usd), 0) FROM pending WHERE {where} AND expires_at > %s", (*params, now)
        ).fetchone()
        reserved = float(row[0]) if row else 0.0
    return KeyWindow(
        day_usd=float(spend.get("day", 0.0)),
        month_usd=float(spend.get("month", 0.0)),
        reserved_usd=reserved,
        recent=int(recent),
        oldest_age_s=None if oldest is None else now - float(oldest),
        tokens=int(tokens),
        tokens_oldest_age_s=None if tokens_oldest is None else now - float(tokens_oldest),
    )


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


def applied(conn: psycopg.Connection[Any]) -> int:
    """The highest migration applied to this database (0: none, an empty database)."""
    exists = conn.execute("SELECT to_regclass('schema_migrations')").fetchone()
    if exists is None or exists[0] is None:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: psycopg.Connection[Any]) -> list[int]:
    """Apply the migrations this database lacks, each in its own transaction; return their versions."""
    done: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version INTEGER PRIMARY KEY, why TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        have = applied(conn)
        for version, why, statements in MIGRATIONS:
            if version <= have:
                continue
            with conn.transaction():
                conn.execute(statements)  # no parameters: several statements at once
                conn.execute("INSERT INTO schema_migrations (version, why) VALUES (%s, %s)", (version, why))
            done.append(version)
            log.info("ledger: applied migration %d (%s)", version, why)
    return done


def _window(column: str, since: float | None, until: float | None) -> tuple[str, tuple[float, ...]]:
    clauses, params = [], []
    if since is not None:
        clauses.append(f"{column} >= %s")
        params.append(since)
    if until is not None:
        clauses.append(f"{column} < %s")
        params.append(until)
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", tuple(params)
