"""The cost ledger: one durable record per served request, with every tier attempt it took.

Two layers:

- a `LedgerStore` is the storage: synchronous, one transaction per write, no knowledge of
  asyncio. `SQLiteStore` is the embedded default; `router.ledger.postgres.PostgresStore` implements the
  same methods on a database every replica shares, and `router.ledger.stores.open_store` picks
  one from the config.
- `Ledger` is what the service talks to: it owns one writer thread, and every store call runs on
  it, so a write never blocks the event loop and the store's single connection never crosses
  threads.

A plain request is written once, when its answer settles: its `requests` row and all its
`attempts` rows in one transaction, committed before any byte of the response is sent. A streamed
request's text leaves before its answer settles, so it is written twice: at admission a `pending`
row (the key, and the most the request can cost: its budget reservation) is written ahead, no
byte is sent before it is committed, and the settled rows replace it in one transaction before
the final chunk (the one with the cost) is sent. So there is no delivered answer without a row:
when the settling write fails (a full or failing disk), the pending row stands for the stream at
its worst-case cost, budgets count it at that cost (also after a restart), and the settled entry
is kept in memory and written as soon as a later write succeeds. While writes fail, every new
request gets a pending row first (see `router.admission.accounting`). A kill -9 leaves the pending rows of
the streams in flight, never a half request; the reverse can happen (a row committed, the
process killed before the bytes left), and such a row is a request the client never saw
completed.

The pending write runs on the writer thread while generation starts, so it costs a stream
nothing while the disk is healthy (a first token takes longer than a commit). SQLite runs in WAL
mode with `synchronous=NORMAL`: a commit survives the process dying at any instant, with no fsync
per request; a power cut of the whole machine may lose the last commits (use `FULL` for that, at
an fsync per request).

Shadow pairs (schema 4, `router.quality.shadow`): a sampled share of accepted answers is also asked of a
larger tier, off the client's path; the shadow generation is an ordinary request row charged to
the operator key `_shadow` (so `report costs --by key` shows it), and the comparison of the two
answers is one row of `shadow_pairs`, written through the same writer thread:

    shadow_pairs
    request_id        TEXT PK   the client's request (its row in `requests`)
    shadow_request_id TEXT      the shadow generation's row in `requests` (key_id '_shadow')
    ts                REAL      unix seconds (UTC) when the pair was compared
    tier              TEXT      the tier that answered and was accepted
    target            TEXT      the tier asked in the shadow
    task              TEXT      the request's task (router.tasks), NULL if unknown
    score             REAL      the tier's combined verifier score at the time (NULL: all abstained)
    threshold         REAL      the threshold it was accepted at
    scores_json       TEXT      each verifier's score then, {"name": value}
    agree             INTEGER   1 when the agreement rule says the two answers agree, else 0
    rule              TEXT      which rule decided: number | choice | code_tests | text
    detail            TEXT      why, in words (e.g. "similarity 0.93 >= 0.80")
    answer_extracted  TEXT      the accepted answer's extracted form (number, letter, normalised text)
    shadow_extracted  TEXT      the shadow answer's extracted form
    prompt_sha256     TEXT      SHA-256 of the prompt as canonical JSON (see `prompt_json`)
    answer_sha256     TEXT      SHA-256 of the accepted answer's UTF-8 text
    shadow_sha256     TEXT      SHA-256 of the shadow answer's UTF-8 text
    shadow_cost_usd   REAL      what the shadow generation cost (charged to '_shadow')
    prompt_json       TEXT      NULL unless ledger.store_prompts: {"messages": [{"role", "content"}]}
                                or {"prompt": "..."}, canonical JSON (sorted keys, no spaces)
    answer_text       TEXT      NULL unless ledger.store_prompts: the accepted answer in full
    shadow_text       TEXT      NULL unless ledger.store_prompts: the shadow answer in full

Without `store_prompts` a pair keeps hashes and extracted answers only: enough for agreement
rates, drift and deduplication, not to replay the prompt to another model.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from router.config import SHADOW_KEY as SHADOW_KEY  # the operator key shadow rows are written under
from router.errors import ConfigError

if TYPE_CHECKING:
    from router.cascade import Attempt, CascadeResult

log = logging.getLogger(__name__)
T = TypeVar("T")

# 2: the pending table (write-ahead rows); 3: requests.task and task_why; 4: the shadow_pairs table;
# 5: requests.user (OpenAI's `user` field, as the client sent it)
SCHEMA_VERSION = 5
# settled entries whose write failed, kept for the next successful write; past this many the
# oldest is logged and dropped (its pending row still stands for it at its worst-case cost)
MAX_UNSETTLED = 10_000


@dataclass(frozen=True)
class AttemptEntry:
    """One tier's try at a request, as the client saw it in `tierroute.attempts`."""

    idx: int
    tier: str
    decision: str  # accepted | rejected | skipped (pre-router) | error | abandoned (the client went away)
    reason: str
    error: str | None
    score: float | None
    threshold: float
    scores: dict[str, float]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    latency_ms: float | None
    busy_ms: float | None  # compute time the backend measured (what time-priced tiers charge for)
    verify_ms: float
    cost_usd: float
    verifier_cost_usd: float
    verifier_tokens: int

    @classmethod
    def from_attempt(cls, idx: int, a: Attempt) -> AttemptEntry:
        g = a.generation
        if a.abandoned:
            decision = "abandoned"
        elif a.accepted:
            decision = "accepted"
        elif a.error:
            decision = "error"
        elif a.skipped:
            decision = "skipped"  # the pre-router passed the tier over: nothing generated, nothing rejected
        else:
            decision = "rejected"
        return cls(
            idx=idx,
            tier=a.tier,
            decision=decision,
            reason=a.reason,
            error=a.error,
            score=a.score,
            threshold=a.threshold,
            scores={name: s.value for name, s in a.scores.items() if s.value is not None},
            prompt_tokens=g.prompt_tokens if g else 0,
            completion_tokens=g.completion_tokens if g else 0,
            finish_reason=g.finish_reason if g else None,
            latency_ms=g.latency_s * 1000 if g else None,
            busy_ms=g.busy_s * 1000 if g and g.busy_s is not None else None,
            verify_ms=a.verify_s * 1000,
            cost_usd=a.cost_usd,
            verifier_cost_usd=a.verifier_cost_usd,
            verifier_tokens=a.verifier_cost.prompt_tokens + a.verifier_cost.completion_tokens,
        )


@dataclass(frozen=True)
class LedgerEntry:
    """One served request. Costs are the same floats the client received, not recomputed."""

    request_id: str
    ts: float  # unix seconds (UTC) when the answer settled
    key_id: str  # the API key's name, never the key
    model: str  # what the client asked for: 'auto' or a tier name
    tier: str  # the tier that answered
    escalated: bool
    unverified: bool
    latency_ms: float  # admission to settled answer, as the router measured it
    cost_usd: float  # every attempt's generation and verifier cost
    counterfactual_usd: float  # had the request gone straight to the top tier
    attempts: tuple[AttemptEntry, ...] = field(default_factory=tuple)
    task: str | None = None  # the request's task (router.tasks); None in rows written before tasks existed
    task_why: str | None = None  # why it was given that task
    user: str | None = None  # OpenAI's `user` request field: the client's own end-user id, unchecked

    @property
    def prompt_tokens(self) -> int:
        return sum(a.prompt_tokens for a in self.attempts)

    @property
    def completion_tokens(self) -> int:
        return sum(a.completion_tokens for a in self.attempts)

    @property
    def verifier_cost_usd(self) -> float:
        return sum(a.verifier_cost_usd for a in self.attempts)

    @classmethod
    def from_result(
        cls,
        request_id: str,
        key_id: str,
        result: CascadeResult,
        *,
        latency_s: float,
        ts: float | None = None,
        user: str | None = None,
    ) -> LedgerEntry:
        return cls(
            request_id=request_id,
            ts=time.time() if ts is None else ts,
            key_id=key_id,
            model=result.model,
            tier=result.final.tier,
            escalated=result.escalated,
            unverified=result.unverified,
            latency_ms=latency_s * 1000,
            cost_usd=result.cost_usd,
            counterfactual_usd=result.counterfactual_usd,
            attempts=tuple(AttemptEntry.from_attempt(i, a) for i, a in enumerate(result.attempts)),
            task=result.task.task if result.task else None,
            task_why=result.task.why if result.task else None,
            user=user,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PendingEntry:
    """A request admitted and not yet settled, written ahead of its answer. `reserved_usd` is the
    most it can cost (its budget reservation): what it counts for until its entry replaces it."""

    request_id: str
    ts: float  # unix seconds (UTC) at admission
    key_id: str
    model: str
    reserved_usd: float


@dataclass(frozen=True)
class ShadowPair:
    """An accepted answer and a larger tier's answer to the same request, compared (see the
    `shadow_pairs` table in the module docstring, column for column)."""

    request_id: str
    shadow_request_id: str
    ts: float
    tier: str
    target: str
    task: str | None
    score: float | None
    threshold: float
    scores: dict[str, float]
    agree: bool
    rule: str
    detail: str
    answer_extracted: str | None
    shadow_extracted: str | None
    prompt_sha256: str
    answer_sha256: str
    shadow_sha256: str
    shadow_cost_usd: float
    prompt_json: str | None = None
    answer_text: str | None = None
    shadow_text: str | None = None


class DuplicateEntry(Exception):
    """The store already holds a row with this request id: writing it again would fail again
    (SQLite's own `sqlite3.IntegrityError` says the same for the SQLite store)."""


class LedgerStore(Protocol):
    """Storage for ledger entries. Methods are synchronous and called from one thread only."""

    def open(self) -> None:
        """Connect and create the schema if needed."""

    def begin(self, pending: PendingEntry) -> None:
        """Store the pending row of an admitted request."""

    def write(self, entry: LedgerEntry) -> None:
        """Store the entry and its attempts, and drop its pending row, atomically: all or nothing."""

    def spend_by_key(self, since: float) -> dict[str, float]:
        """USD per key at or after `since` (unix seconds): settled requests at their cost, pending
        ones at their reservation."""

    def pending(self) -> Iterator[PendingEntry]:
        """The pending rows, oldest first: requests admitted and never settled."""

    def entries(self, since: float | None = None, until: float | None = None) -> Iterator[LedgerEntry]:
        """Entries with since <= ts < until, oldest first, each with its attempts."""

    def write_pair(self, pair: ShadowPair, entry: LedgerEntry | None = None) -> None:
        """Store one shadow pair (a second write for the same request replaces it); with `entry`
        (the shadow generation's own request row), both in one transaction."""

    def pairs(self, since: float | None = None, until: float | None = None) -> Iterator[ShadowPair]:
        """Shadow pairs with since <= ts < until, oldest first."""

    def close(self) -> None:
        """Commit nothing further and release the connection."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    request_id         TEXT PRIMARY KEY,
    ts                 REAL NOT NULL,
    key_id             TEXT NOT NULL,
    model              TEXT NOT NULL,
    tier               TEXT NOT NULL,
    escalated          INTEGER NOT NULL,
    unverified         INTEGER NOT NULL,
    n_attempts         INTEGER NOT NULL,
    prompt_tokens      INTEGER NOT NULL,
    completion_tokens  INTEGER NOT NULL,
    latency_ms         REAL NOT NULL,
    cost_usd           REAL NOT NULL,
    verifier_cost_usd  REAL NOT NULL,
    counterfactual_usd REAL NOT NULL,
    task               TEXT,
    task_why           TEXT,
    "user"             TEXT
);
CREATE INDEX IF NOT EXISTS requests_ts ON requests (ts);
CREATE INDEX IF NOT EXISTS requests_key_ts ON requests (key_id, ts);
CREATE TABLE IF NOT EXISTS pending (
    request_id   TEXT PRIMARY KEY,
    ts           REAL NOT NULL,
    key_id       TEXT NOT NULL,
    model        TEXT NOT NULL,
    reserved_usd REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS attempts (
    request_id        TEXT NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    idx               INTEGER NOT NULL,
    tier              TEXT NOT NULL,
    decision          TEXT NOT NULL,
    reason            TEXT NOT NULL,
    error             TEXT,
    score             REAL,
    threshold         REAL NOT NULL,
    scores_json       TEXT NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    finish_reason     TEXT,
    latency_ms        REAL,
    busy_ms           REAL,
    verify_ms         REAL NOT NULL,
    cost_usd          REAL NOT NULL,
    verifier_cost_usd REAL NOT NULL,
    verifier_tokens   INTEGER NOT NULL,
    PRIMARY KEY (request_id, idx)
);
CREATE TABLE IF NOT EXISTS shadow_pairs (
    request_id        TEXT PRIMARY KEY,
    shadow_request_id TEXT NOT NULL,
    ts                REAL NOT NULL,
    tier              TEXT NOT NULL,
    target            TEXT NOT NULL,
    task              TEXT,
    score             REAL,
    threshold         REAL NOT NULL,
    scores_json       TEXT NOT NULL,
    agree             INTEGER NOT NULL,
    rule              TEXT NOT NULL,
    detail            TEXT NOT NULL,
    answer_extracted  TEXT,
    shadow_extracted  TEXT,
    prompt_sha256     TEXT NOT NULL,
    answer_sha256     TEXT NOT NULL,
    shadow_sha256     TEXT NOT NULL,
    shadow_cost_usd   REAL NOT NULL,
    prompt_json       TEXT,
    answer_text       TEXT,
    shadow_text       TEXT
);
CREATE INDEX IF NOT EXISTS shadow_pairs_ts ON shadow_pairs (ts);
"""

REQUEST_COLUMNS = (
    "request_id, ts, key_id, model, tier, escalated, unverified, n_attempts, prompt_tokens, "
    'completion_tokens, latency_ms, cost_usd, verifier_cost_usd, counterfactual_usd, task, task_why, "user"'
)
# Columns added to a table after its first release, with their type: a ledger file written by an
# older version gets them on open (older rows hold NULL), so no file is ever rewritten or lost.
_ADDED_COLUMNS = {"requests": (("task", "TEXT"), ("task_why", "TEXT"), ('"user"', "TEXT"))}
PAIR_COLUMNS = (
    "request_id, shadow_request_id, ts, tier, target, task, score, threshold, scores_json, agree, rule, detail, "
    "answer_extracted, shadow_extracted, prompt_sha256, answer_sha256, shadow_sha256, shadow_cost_usd, "
    "prompt_json, answer_text, shadow_text"
)
ATTEMPT_COLUMNS = (
    "request_id, idx, tier, decision, reason, error, score, threshold, scores_json, prompt_tokens, "
    "completion_tokens, finish_reason, latency_ms, busy_ms, verify_ms, cost_usd, verifier_cost_usd, verifier_tokens"
)


class SQLiteStore:
    """The ledger in one SQLite file, WAL mode. Readers (reports) never block the writer."""

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
            self._conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # autocommit mode: transactions are the explicit BEGIN/COMMIT in write()
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.executescript(_SCHEMA)
            _migrate(conn)
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
        except (sqlite3.Error, OSError) as exc:
            raise ConfigError(f"ledger.path: cannot open ledger {self.path}: {exc}") from None
        self._conn = conn

    def begin(self, pending: PendingEntry) -> None:
        self.conn.execute(  # one statement: its own transaction in autocommit mode
            "INSERT OR REPLACE INTO pending (request_id, ts, key_id, model, reserved_usd) VALUES (?, ?, ?, ?, ?)",
            (pending.request_id, pending.ts, pending.key_id, pending.model, pending.reserved_usd),
        )

    def write(self, entry: LedgerEntry) -> None:
        self._transaction(lambda: self._insert(entry))

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
        conn.execute(f"INSERT INTO requests ({REQUEST_COLUMNS}) VALUES ({', '.join('?' * 17)})", request_row(entry))
        conn.executemany(
            f"INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES ({', '.join('?' * 18)})", attempt_rows(entry)
        )

    def spend_by_key(self, since: float) -> dict[str, float]:
        rows = self.conn.execute(
            "SELECT key_id, SUM(usd) FROM ("
            " SELECT key_id, cost_usd AS usd FROM requests WHERE ts >= ?"
            " UNION ALL SELECT key_id, reserved_usd FROM pending WHERE ts >= ?"
            ") GROUP BY key_id",
            (since, since),
        ).fetchall()
        return {key: float(total) for key, total in rows}

    def pending(self) -> Iterator[PendingEntry]:
        for row in self.conn.execute(
            "SELECT request_id, ts, key_id, model, reserved_usd FROM pending ORDER BY ts, request_id"
        ).fetchall():
            yield PendingEntry(*row)

    def entries(self, since: float | None = None, until: float | None = None) -> Iterator[LedgerEntry]:
        if self.read_only:
            # a ledger of an older version, opened read-only (a report), cannot be migrated: the
            # columns it lacks read as NULL
            have = _columns(self.conn, "requests")
            added = [c for c, _ in _ADDED_COLUMNS["requests"]]
            columns = [c if c not in added or c.strip('"') in have else "NULL" for c in REQUEST_COLUMNS.split(", ")]
            yield from self._entries(since, until, ", ".join(columns))
            return
        yield from self._entries(since, until, REQUEST_COLUMNS)

    def _entries(self, since: float | None, until: float | None, columns: str) -> Iterator[LedgerEntry]:
        where, params = _window("ts", since, until)
        r_where, _ = _window("r.ts", since, until)
        attempts: dict[str, list[AttemptEntry]] = {}
        # one consistent snapshot for both tables: a request and its attempts are read together
        self.conn.execute("BEGIN")
        try:
            for row in self.conn.execute(
                f"SELECT a.{ATTEMPT_COLUMNS.replace(', ', ', a.')} FROM attempts a "
                f"JOIN requests r ON r.request_id = a.request_id {r_where} "
                "ORDER BY a.request_id, a.idx",
                params,
            ):
                attempts.setdefault(row[0], []).append(attempt_from_row(row))
            rows = self.conn.execute(
                f"SELECT {columns} FROM requests {where} ORDER BY ts, request_id", params
            ).fetchall()
        finally:
            self.conn.execute("COMMIT")
        for row in rows:
            yield entry_from_row(row, attempts.get(row[0], ()))

    def write_pair(self, pair: ShadowPair, entry: LedgerEntry | None = None) -> None:
        if entry is None:
            self._insert_pair(pair)  # one statement: its own transaction in autocommit mode
            return

        def both() -> None:
            self._insert(entry)
            self._insert_pair(pair)

        self._transaction(both)

    def _insert_pair(self, pair: ShadowPair) -> None:
        self.conn.execute(
            f"INSERT OR REPLACE INTO shadow_pairs ({PAIR_COLUMNS}) VALUES ({', '.join('?' * 21)})", pair_row(pair)
        )

    def pairs(self, since: float | None = None, until: float | None = None) -> Iterator[ShadowPair]:
        if not _columns(self.conn, "shadow_pairs"):
            return  # a ledger older than shadow pairs, opened read-only: it has none
        where, params = _window("ts", since, until)
        for row in self.conn.execute(
            f"SELECT {PAIR_COLUMNS} FROM shadow_pairs {where} ORDER BY ts, request_id", params
        ).fetchall():
            yield pair_from_row(row)

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
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a ledger file of an older schema up to this one: add the columns it lacks."""
    for table, added in _ADDED_COLUMNS.items():
        have = _columns(conn, table)
        for column, kind in added:
            if column.strip('"') not in have:  # "user" is quoted: a reserved word in PostgreSQL
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _window(column: str, since: float | None, until: float | None) -> tuple[str, tuple[float, ...]]:
    clauses, params = [], []
    if since is not None:
        clauses.append(f"{column} >= ?")
        params.append(since)
    if until is not None:
        clauses.append(f"{column} < ?")
        params.append(until)
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", tuple(params)


def entry_from_row(row: Sequence[Any], attempts: Sequence[AttemptEntry]) -> LedgerEntry:
    """A `requests` row, read as `REQUEST_COLUMNS`, with its attempts."""
    return LedgerEntry(
        request_id=row[0],
        ts=row[1],
        key_id=row[2],
        model=row[3],
        tier=row[4],
        escalated=bool(row[5]),
        unverified=bool(row[6]),
        latency_ms=row[10],
        cost_usd=row[11],
        counterfactual_usd=row[13],
        attempts=tuple(attempts),
        task=row[14],
        task_why=row[15],
        user=row[16],
    )


def request_row(entry: LedgerEntry) -> tuple[Any, ...]:
    """The entry's `requests` row, in `REQUEST_COLUMNS` order."""
    return (
        entry.request_id,
        entry.ts,
        entry.key_id,
        entry.model,
        entry.tier,
        int(entry.escalated),
        int(entry.unverified),
        len(entry.attempts),
        entry.prompt_tokens,
        entry.completion_tokens,
        entry.latency_ms,
        entry.cost_usd,
        entry.verifier_cost_usd,
        entry.counterfactual_usd,
        entry.task,
        entry.task_why,
        entry.user,
    )


def attempt_rows(entry: LedgerEntry) -> list[tuple[Any, ...]]:
    """The entry's `attempts` rows, in `ATTEMPT_COLUMNS` order."""
    return [
        (
            entry.request_id,
            a.idx,
            a.tier,
            a.decision,
            a.reason,
            a.error,
            a.score,
            a.threshold,
            json.dumps(a.scores, sort_keys=True),
            a.prompt_tokens,
            a.completion_tokens,
            a.finish_reason,
            a.latency_ms,
            a.busy_ms,
            a.verify_ms,
            a.cost_usd,
            a.verifier_cost_usd,
            a.verifier_tokens,
        )
        for a in entry.attempts
    ]


# PAIR_COLUMNS are ShadowPair's fields in order (its scores stored as `scores_json`), so a pair
# and its row convert positionally; checked here, at import, so the two cannot drift apart
_PAIR_SCORES, _PAIR_AGREE = PAIR_COLUMNS.split(", ").index("scores_json"), PAIR_COLUMNS.split(", ").index("agree")
if [f.name for f in dataclasses.fields(ShadowPair)] != PAIR_COLUMNS.replace("scores_json", "scores").split(", "):
    raise RuntimeError("PAIR_COLUMNS and ShadowPair's fields differ")


def pair_row(pair: ShadowPair) -> tuple[Any, ...]:
    """The pair's `shadow_pairs` row, in `PAIR_COLUMNS` order (the dataclass's field order; the
    scores as JSON, agreement as 0/1)."""
    row = list(dataclasses.astuple(pair))
    row[_PAIR_SCORES] = json.dumps(pair.scores, sort_keys=True)
    row[_PAIR_AGREE] = int(pair.agree)
    return tuple(row)


def pair_from_row(row: Sequence[Any]) -> ShadowPair:
    """A `shadow_pairs` row, read as `PAIR_COLUMNS`."""
    values = list(row)
    values[_PAIR_SCORES] = json.loads(values[_PAIR_SCORES])
    values[_PAIR_AGREE] = bool(values[_PAIR_AGREE])
    return ShadowPair(*values)


def attempt_from_row(row: Sequence[Any]) -> AttemptEntry:
    return AttemptEntry(
        idx=row[1],
        tier=row[2],
        decision=row[3],
        reason=row[4],
        error=row[5],
        score=row[6],
        threshold=row[7],
        scores=json.loads(row[8]),
        prompt_tokens=row[9],
        completion_tokens=row[10],
        finish_reason=row[11],
        latency_ms=row[12],
        busy_ms=row[13],
        verify_ms=row[14],
        cost_usd=row[15],
        verifier_cost_usd=row[16],
        verifier_tokens=row[17],
    )


class Ledger:
    """The async face of a store: every call runs on the ledger's own thread (one by default: in order).

    A settled entry whose write fails is kept (in memory) and written again before each later
    write: the pending row stands for it meanwhile. `healthy` says whether the last write
    succeeded; the service refuses to start new work on a ledger known to be failing until a write
    succeeds again.

    `writers` > 1 is for a store whose calls may run at once (PostgreSQL: each takes its own
    connection): a write that waits on the database server (a busy machine may not schedule it
    for milliseconds) then holds up no other request's write. The order that matters, a request's
    pending row before its settled row, is kept by the caller, which waits for the first before
    sending the second."""

    def __init__(self, store: LedgerStore, *, writers: int = 1) -> None:
        self.store = store
        self.writers = writers
        self._pool: ThreadPoolExecutor | None = None
        self._unsettled: collections.deque[LedgerEntry] = collections.deque()
        self._unsettled_lock = threading.Lock()
        self.healthy = True

    async def open(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.writers, thread_name_prefix="tierroute-ledger")
        await self._call(self.store.open)

    def begin(self, pending: PendingEntry) -> asyncio.Future[None]:
        """Write the pending row; the future is done once it is committed (or has failed)."""
        return self._submit(self._begin, pending)

    async def record(self, entry: LedgerEntry) -> None:
        """Return once the entry is committed; on failure it is kept for a later write."""
        await self._call(self._write, entry)

    @property
    def unsettled(self) -> int:
        """Settled entries waiting for the disk (their pending rows stand for them)."""
        return len(self._unsettled)

    async def spend_by_key(self, since: float) -> dict[str, float]:
        return await self._call(self.store.spend_by_key, since)

    async def entries(self, since: float | None = None, until: float | None = None) -> list[LedgerEntry]:
        return await self._call(lambda: list(self.store.entries(since, until)))

    async def pending(self) -> list[PendingEntry]:
        return await self._call(lambda: list(self.store.pending()))

    async def record_pair(self, pair: ShadowPair, entry: LedgerEntry | None = None) -> None:
        """Write a shadow pair, and with it the shadow generation's row (one write, so shadow work
        takes one turn of the writer thread that clients' records wait on). Best effort: a pair
        lost to a failing disk loses a sample and operator spend, not a client's record, so it is
        never kept for a retry nor marks the ledger unhealthy."""
        await self._call(self.store.write_pair, pair, entry)

    async def pairs(self, since: float | None = None, until: float | None = None) -> list[ShadowPair]:
        return await self._call(lambda: list(self.store.pairs(since, until)))

    async def close(self) -> None:
        """Finish every queued write (and retry the unsettled ones once), then close the store."""
        pool = self._pool
        if pool is None:
            return
        try:
            await self._call(self._flush)
            for entry in self._unsettled:  # the log is all that is left of these
                log.error("ledger: never written (its pending row stands for it): %s", json.dumps(asdict(entry)))
            await self._call(self.store.close)
        finally:
            self._pool = None
            await asyncio.to_thread(pool.shutdown, wait=True)

    # -- on the writer thread --------------------------------------------------------------------

    def _begin(self, pending: PendingEntry) -> None:
        self._flush()
        self._guarded(self.store.begin, pending)

    def _write(self, entry: LedgerEntry) -> None:
        self._flush()
        try:
            self._guarded(self.store.write, entry)
        except (sqlite3.IntegrityError, DuplicateEntry):
            raise  # not the disk: writing it again would fail again
        except Exception:
            with self._unsettled_lock:
                self._unsettled.append(entry)
                lost = self._unsettled.popleft() if len(self._unsettled) > MAX_UNSETTLED else None
            if lost is not None:
                log.error("ledger: too many unwritten entries; dropping %s", json.dumps(asdict(lost)))
            raise

    def _flush(self) -> None:
        while True:
            with self._unsettled_lock:  # taken out while written: another writer does not write it too
                if not self._unsettled:
                    return
                entry = self._unsettled.popleft()
            try:
                self._guarded(self.store.write, entry)
            except (sqlite3.IntegrityError, DuplicateEntry):
                continue  # already there
            except Exception as exc:  # noqa: BLE001 - still failing: keep them for the next write
                with self._unsettled_lock:
                    self._unsettled.appendleft(entry)
                    log.warning("ledger: %d entries still unwritten: %s", len(self._unsettled), exc)
                return

    def _guarded(self, fn: Callable[[T], None], arg: T) -> None:
        try:
            fn(arg)
        except Exception:
            self.healthy = False
            raise
        self.healthy = True

    def _submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        if self._pool is None:
            raise RuntimeError("ledger is not open")
        return asyncio.wrap_future(self._pool.submit(fn, *args))

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._submit(fn, *args)
