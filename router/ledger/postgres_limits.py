"""What replicas of the service agree on through the PostgreSQL ledger: a key's, team's and end
user's limits (`router.admission.limits.SharedLimits`), decided in the database.

An admission locks every subject it falls under (`limit_keys`, in one order), reads each one's
window (its settled spend in `key_spend`, its live reservations in `pending`, its rate and token
events), lets the caller decide, and writes its events and its reservation, all in one
transaction; `prune` deletes the rows no admission reads again. The tables are described in
`router.ledger.postgres`'s docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import psycopg_pool

from router.admission.limits import PRUNE_BATCH, WINDOW_S, KeyWindow, Reservation
from router.admission.quota import Quota

_NOW = "extract(epoch from clock_timestamp())::double precision"
_PRUNE_LOCK = 0x7469657272 + 1  # pg_try_advisory_xact_lock key: one replica prunes at a time
# an event is pruned only a whole window after it left the window: an admission that read its
# clock a moment before the prune did still finds every event it must count
_EVENT_KEEP_S = 2 * WINDOW_S


class SharedAdmission:
    """The `SharedCounter` half of `PostgresStore` (which gives it its pool)."""

    @property
    def pool(self) -> psycopg_pool.ConnectionPool:
        raise NotImplementedError

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
