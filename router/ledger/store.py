"""The ledger in one SQLite file: the embedded default, for a service that runs as one process.

WAL mode with `synchronous=NORMAL`: readers (reports) never block the writer, and a commit
survives the process dying at any instant, with no fsync per request; a power cut of the whole
machine may lose the last commits (use `FULL` for that, at an fsync per request).

The tables are `router.ledger.schema`'s; opening a file read-write brings one written by an older
version up to date in place (the tables it lacks, the columns added since; older rows hold NULL),
and records the schema version in `meta`. A file opened read-only (a report) is never changed: the
columns it lacks read as NULL. Rows are written and read by column name (`router.ledger.rows`).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

from router.errors import ConfigError
from router.ledger import rows, schema
from router.ledger.entries import AttemptEntry, Feedback, LabelCount, LedgerEntry, PendingEntry, ShadowPair
from router.ledger.sqlite_cache import CacheRows

log = logging.getLogger(__name__)

# the SQLite schema version recorded in `meta`: the latest the description names (2: the pending
# table; 3: requests.task and task_why; 4: shadow_pairs; 5: requests.user; 6: requests.deployment;
# then the response cache's cache_entries; the control plane's keys, teams, user limits and audit,
# with requests.team (router.control); feedback; 10: cache_entries' (scope, created) index; 11:
# feedback.role and team, who gave each label; 12: requests.surface, the API a request came through)
SCHEMA_VERSION = schema.latest("sqlite")

_INSERT_REQUEST = rows.insert("requests", "sqlite")
_INSERT_ATTEMPT = rows.insert("attempts", "sqlite")
_INSERT_PENDING = rows.insert("pending", "sqlite", "INSERT OR REPLACE INTO")
_INSERT_PAIR = rows.insert("shadow_pairs", "sqlite", "INSERT OR REPLACE INTO")
_INSERT_FEEDBACK = rows.insert("feedback", "sqlite")


class SQLiteStore(CacheRows):
    """The ledger in one SQLite file, WAL mode. Readers (reports) never block the writer. Rows
    come back as `sqlite3.Row`, read by column name."""

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._conn: sqlite3.Connection | None = None

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("ledger store is not open")
        return self._conn

    def open(self) -> None:
        if self.read_only:
            if not self.path.is_file():
                raise ConfigError(f"ledger.path: no ledger at {self.path}")
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
            conn.row_factory = sqlite3.Row
            self._conn = conn
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # autocommit mode: transactions are the explicit BEGIN/COMMIT in write()
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            _migrate(conn)
            conn.executescript(schema.sqlite_ddl())
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
        except (sqlite3.Error, OSError) as exc:
            raise ConfigError(f"ledger.path: cannot open ledger {self.path}: {exc}") from None
        self._conn = conn

    def begin(self, pending: PendingEntry) -> None:
        # one statement: its own transaction in autocommit mode
        self.conn.execute(_INSERT_PENDING, rows.pending_values(pending))

    def write(self, entry: LedgerEntry) -> None:
        self._transaction(lambda: self._insert(entry))

    def drop(self, request_id: str) -> None:
        # one statement: its own transaction in autocommit mode
        self.conn.execute("DELETE FROM pending WHERE request_id = ?", (request_id,))

    def _transaction(self, work: Callable[[], None]) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            work()
            conn.execute("COMMIT")
        except BaseException:
            # a failed COMMIT (disk full) may leave the transaction open, or SQLite may have rolled it back
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    def _insert(self, entry: LedgerEntry) -> None:
        conn = self.conn
        conn.execute("DELETE FROM pending WHERE request_id = ?", (entry.request_id,))
        conn.execute(_INSERT_REQUEST, rows.request_values(entry))
        conn.executemany(_INSERT_ATTEMPT, rows.attempt_values(entry))

    def spend_by_key(self, since: float) -> dict[str, float]:
        found: dict[str, float] = {}
        for row in self.conn.execute(
            'SELECT key_id, team, "user", cost_usd AS usd FROM requests WHERE ts >= ?'
            ' UNION ALL SELECT key_id, team, "user", reserved_usd FROM pending WHERE ts >= ?',
            (since, since),
        ).fetchall():
            for subject in spend_subjects(row["key_id"], row["team"], row["user"]):
                found[subject] = found.get(subject, 0.0) + float(row["usd"])
        return found

    def pending(self) -> Iterator[PendingEntry]:
        for row in self.conn.execute(
            f"SELECT {schema.column_list('pending', 'sqlite')} FROM pending ORDER BY ts, request_id"
        ).fetchall():
            yield rows.pending_from_row(row)

    def entries(self, since: float | None = None, until: float | None = None) -> Iterator[LedgerEntry]:
        yield from self._entries(since, until, self._request_columns())

    def _request_columns(self) -> str:
        return self._read_columns("requests")

    def _read_columns(self, table: str) -> str:
        if self.read_only:
            # a ledger of an older version, opened read-only (a report), cannot be migrated: the
            # columns it lacks read as NULL
            have = _columns(self.conn, table)
            wanted = schema.columns(table, "sqlite")
            return ", ".join(c.quoted if c.name in have else f"NULL AS {c.quoted}" for c in wanted)
        return schema.column_list(table, "sqlite")

    def entry(self, request_id: str) -> LedgerEntry | None:
        conn = self.conn
        conn.execute("BEGIN")  # the request and its attempts from one snapshot
        try:
            row = conn.execute(
                f"SELECT {self._request_columns()} FROM requests WHERE request_id = ?", (request_id,)
            ).fetchone()
            found = conn.execute(
                f"SELECT {schema.column_list('attempts', 'sqlite')} FROM attempts WHERE request_id = ? ORDER BY idx",
                (request_id,),
            ).fetchall()
        finally:
            conn.execute("COMMIT")
        return None if row is None else rows.entry_from_row(row, [rows.attempt_from_row(a) for a in found])

    def write_feedback(self, feedback: Feedback, limit: int | None = None) -> LabelCount:
        # the count and the insert in one write transaction: labels raced at once see each other
        earlier = LabelCount(0, 0)

        def work() -> None:
            nonlocal earlier
            sql = "SELECT count(*), coalesce(sum(key_id = ?), 0) FROM feedback WHERE request_id = ?"
            total, mine = self.conn.execute(sql, (feedback.key_id, feedback.request_id)).fetchone()
            earlier = LabelCount(int(total), int(mine))
            if limit is None or earlier.giver < limit:
                self.conn.execute(_INSERT_FEEDBACK, rows.feedback_values(feedback))

        self._transaction(work)
        return earlier

    def feedback(
        self, since: float | None = None, until: float | None = None, request_id: str | None = None
    ) -> Iterator[Feedback]:
        if not _columns(self.conn, "feedback"):
            return  # a ledger older than feedback, opened read-only: it has none
        where, window = _window("ts", since, until)
        params: tuple[float | str, ...] = window
        if request_id is not None:
            where = f"{where} AND request_id = ?" if where else "WHERE request_id = ?"
            params = (*params, request_id)
        for row in self.conn.execute(
            f"SELECT {self._read_columns('feedback')} FROM feedback {where} ORDER BY ts, feedback_id",
            params,
        ).fetchall():
            yield rows.feedback_from_row(row)

    def _entries(self, since: float | None, until: float | None, columns: str) -> Iterator[LedgerEntry]:
        where, params = _window("ts", since, until)
        r_where, _ = _window("r.ts", since, until)
        attempts: dict[str, list[AttemptEntry]] = {}
        # one consistent snapshot for both tables: a request and its attempts are read together
        self.conn.execute("BEGIN")
        try:
            # CROSS JOIN keeps SQLite's join order: the window's requests off the ts index, then
            # their attempts by key. Left to choose, it scanned every attempt in key order for the
            # ORDER BY and probed each one's request (0.84 s against 0.23 s for a day of a
            # 1,000,000-request ledger: scripts/dashboard_bench.py)
            for row in self.conn.execute(
                f"SELECT {schema.column_list('attempts', 'sqlite', 'a.')} FROM requests r "
                f"CROSS JOIN attempts a ON a.request_id = r.request_id {r_where} "
                "ORDER BY a.request_id, a.idx",
                params,
            ):
                attempts.setdefault(row["request_id"], []).append(rows.attempt_from_row(row))
            found = self.conn.execute(
                f"SELECT {columns} FROM requests {where} ORDER BY ts, request_id", params
            ).fetchall()
        finally:
            self.conn.execute("COMMIT")
        for row in found:
            yield rows.entry_from_row(row, attempts.get(row["request_id"], ()))

    def write_pair(self, pair: ShadowPair, entry: LedgerEntry | None = None) -> None:
        if entry is None:
            self._insert_pair(pair)  # one statement: its own transaction in autocommit mode
            return

        def both() -> None:
            self._insert(entry)
            self._insert_pair(pair)

        self._transaction(both)

    def _insert_pair(self, pair: ShadowPair) -> None:
        self.conn.execute(_INSERT_PAIR, rows.pair_values(pair))

    def pairs(self, since: float | None = None, until: float | None = None) -> Iterator[ShadowPair]:
        if not _columns(self.conn, "shadow_pairs"):
            return  # a ledger older than shadow pairs, opened read-only: it has none
        where, params = _window("ts", since, until)
        for row in self.conn.execute(
            f"SELECT {schema.column_list('shadow_pairs', 'sqlite')} FROM shadow_pairs {where} ORDER BY ts, request_id",
            params,
        ).fetchall():
            yield rows.pair_from_row(row)

    def close(self) -> None:
        if self._conn is not None:
            if not self.read_only:
                try:  # fold the WAL back into the main file so a copied .sqlite3 is complete
                    self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except sqlite3.Error as exc:
                    log.warning("ledger checkpoint failed: %s", exc)
            self._conn.close()
            self._conn = None


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The table's columns in this file (none: the file has no such table)."""
    return {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a ledger file of an older schema up to this one: add the columns its tables lack.
    Runs before the schema's CREATE statements, so an index may name an added column."""
    for table, added in schema.sqlite_added_columns().items():
        have = _columns(conn, table)
        if not have:
            continue  # no such table yet: it is created whole
        for column, statement in added.items():
            if column not in have:
                conn.execute(statement)


def _window(column: str, since: float | None, until: float | None) -> tuple[str, tuple[float, ...]]:
    clauses, params = [], []
    if since is not None:
        clauses.append(f"{column} >= ?")
        params.append(since)
    if until is not None:
        clauses.append(f"{column} < ?")
        params.append(until)
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", tuple(params)


def spend_subjects(key_id: str, team: str | None, user: str | None) -> list[str]:
    """The limit subjects a request's cost counts for: its key, its team, and that team's user
    (`router.admission.quota.Quota.subject`)."""
    found = [key_id]
    if team is not None:
        found.append(f"team:{team}")
        if user:
            found.append(f"user:{team}:{user}")
    return found
