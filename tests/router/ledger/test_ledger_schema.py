"""The ledger's one schema description: both stores' DDL generated from it, the same tables and
columns in each, the released text reproduced token for token, and rows mapped by column name.

No server here: the PostgreSQL DDL is plain SQL that SQLite also accepts, so its catalog is read
from an in-memory SQLite database. `test_ledger_pg.py` checks the same on a real PostgreSQL."""

from __future__ import annotations

import hashlib
import re
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from router.ledger import rows, schema
from router.ledger.entries import AttemptEntry, Feedback, LedgerEntry, PendingEntry, ShadowPair
from router.ledger.postgres_migrations import MIGRATIONS, RELEASED
from router.ledger.store import SCHEMA_VERSION, SQLiteStore

# What each store has that the other has not, on purpose: SQLite keeps its version in `meta`;
# PostgreSQL's replicas share limits (reservations that expire, per-key spend, rate events).
ONLY_SQLITE = {"meta"}
ONLY_POSTGRES = {"limit_keys", "key_spend", "rate_events", "token_events", "pending.expires_at"}
ONLY_POSTGRES_INDEXES = {"pending_key", "rate_events_key_ts", "token_events_subject_ts", "token_events_request"}

# The SQLite schema as schema 5 wrote it, by hand, before the description: a file made by it
# must be what a file made now is.
_SCHEMA_5 = """
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

# sha256 of each released PostgreSQL migration's text: databases ran exactly these, so they never change
_RELEASED_SHA256 = {
    1: "58491ddfbd47cfe7c027a37339b7c0e00d80af7871730813eb50acbd6ba5c380",
    2: "7e9ad8a17e9a337e8dc221e122ebe776f578160f9b0e0e440ddaf8400356840f",
}


def tokens(sql: str) -> list[str]:
    """SQL as the server reads it: quoted names, words and symbols, whatever the whitespace."""
    return re.findall(r'"[^"]*"|\w+|[^\s\w]', sql)


Columns = dict[str, tuple[str, bool, bool]]  # column: (type affinity, nullable, in the primary key)


def catalog(ddl: str) -> tuple[dict[str, Columns], dict[str, str]]:
    """The tables and indexes ({name: "table(columns)"}) of a database made by `ddl`."""
    conn = sqlite3.connect(":memory:")
    conn.executescript(ddl)
    tables: dict[str, Columns] = {}
    indexes: dict[str, str] = {}
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        tables[name] = {
            col: (_affinity(kind), not notnull and not pk, bool(pk))
            for _, col, kind, notnull, _, pk in conn.execute(f"PRAGMA table_info({name})")
        }
        for _, index, *_ in conn.execute(f"PRAGMA index_list({name})").fetchall():
            if not index.startswith("sqlite_autoindex"):  # a primary key's own index
                cols = ", ".join(r[2] for r in conn.execute(f"PRAGMA index_info({index})"))
                indexes[index] = f"{name}({cols})"
    conn.close()
    return tables, indexes


def _affinity(kind: str) -> str:
    """SQLite's type affinity: REAL and DOUBLE PRECISION are the same 8-byte float."""
    kind = kind.upper()
    return "INTEGER" if "INT" in kind else "TEXT" if "TEXT" in kind else "REAL"


def test_both_generated_schemas_have_the_same_tables_and_columns() -> None:
    (lite, lite_indexes), (pg, pg_indexes) = catalog(schema.sqlite_ddl()), catalog(schema.postgres_ddl())
    assert set(lite) - set(pg) == ONLY_SQLITE
    assert set(pg) - set(lite) == {t for t in ONLY_POSTGRES if "." not in t}
    for table in set(lite) & set(pg):
        assert lite[table] == {c: v for c, v in pg[table].items() if f"{table}.{c}" not in ONLY_POSTGRES}, table
    assert lite_indexes == {i: v for i, v in pg_indexes.items() if i not in ONLY_POSTGRES_INDEXES}
    assert lite["requests"]["user"] == ("TEXT", True, False)  # quoted in both: a reserved word in PostgreSQL
    assert lite["attempts"]["idx"] == ("INTEGER", False, True)


def sqlite_as_of(version: int) -> tuple[schema.Table, ...]:
    """The description as it stood at SQLite version `version`: what it had then, nothing later."""

    def then(v: int | None) -> bool:
        return v is None or v <= version  # None on a column: never in SQLite; the DDL leaves it out

    return tuple(
        replace(
            t,
            columns=tuple(c for c in t.columns if then(c.sqlite)),
            indexes=tuple(i for i in t.indexes if then(i.sqlite)),
        )
        for t in schema.TABLES
        if t.sqlite is not None and t.sqlite <= version
    )


def test_the_sqlite_ddl_is_the_one_schema_5_wrote_by_hand() -> None:
    assert tokens(schema.sqlite_ddl(sqlite_as_of(5))) == tokens(_SCHEMA_5)
    assert SCHEMA_VERSION == schema.latest("sqlite") >= 5


def test_released_postgres_migrations_are_unchanged_and_are_what_the_description_generates() -> None:
    assert MIGRATIONS[: len(RELEASED)] == RELEASED
    for version, _, text in RELEASED:
        assert hashlib.sha256(text.encode()).hexdigest() == _RELEASED_SHA256[version]
        assert tokens(schema.postgres_migration(version)) == tokens(text)
    assert RELEASED[-1][0] == 2
    for version, why, text in MIGRATIONS[len(RELEASED) :]:  # later ones: generated from the description
        assert text == schema.postgres_migration(version) and why == schema.postgres_why(version)
    assert MIGRATIONS[-1][0] == schema.latest("postgres")


def test_a_file_made_by_schema_5_opens_unchanged(tmp_path: Path) -> None:
    old, new = tmp_path / "old.sqlite3", tmp_path / "new.sqlite3"
    with sqlite3.connect(old) as conn:
        conn.executescript(_SCHEMA_5)
    for path in (old, new):
        s = SQLiteStore(path)
        s.open()
        s.close()

    def dump(path: Path) -> list[tuple[str, ...]]:
        with sqlite3.connect(path) as conn:
            return [
                (t, *map(str, r))
                for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
                for r in conn.execute(f"PRAGMA table_info({t})")
            ]

    assert dump(old) == dump(new)


# ---- a change to come: one edit of the description ---------------------------------------------

REQUESTS = schema.table("requests")
NEXT_SQLITE, NEXT_PG = schema.latest("sqlite") + 1, schema.latest("postgres") + 1
LATER = (
    *(t for t in schema.TABLES if t.name != "requests"),
    replace(REQUESTS, columns=(*REQUESTS.columns, schema.Column("region", "text", "where", null=True, sqlite=NEXT_SQLITE, postgres=NEXT_PG))),
    schema.Table(
        "notes", "a new table", (schema.Column("id", "text", "its id"), schema.Column("at", "real", "when")), ("id",),
        sqlite=NEXT_SQLITE, postgres=NEXT_PG, indexes=(schema.Index("notes_at", ("at",)),),
    ),
)  # fmt: skip


def test_a_column_and_a_table_added_later_are_one_edit_for_both_stores() -> None:
    assert schema.latest("sqlite", LATER) == NEXT_SQLITE and schema.latest("postgres", LATER) == NEXT_PG
    assert schema.sqlite_added_columns(LATER)["requests"]["region"] == "ALTER TABLE requests ADD COLUMN region TEXT;"
    migration = schema.postgres_migration(NEXT_PG, LATER)
    assert tokens(migration) == tokens(
        "ALTER TABLE requests ADD COLUMN region TEXT;"
        "CREATE TABLE notes (id TEXT PRIMARY KEY, at DOUBLE PRECISION NOT NULL);"
        "CREATE INDEX notes_at ON notes (at);"
    )
    assert "requests.region: where" in schema.postgres_why(NEXT_PG, LATER)
    assert "region" not in schema.postgres_migration(1, LATER)  # released migrations are not rewritten
    assert "region" in catalog(schema.sqlite_ddl(LATER))[0]["requests"]


def test_a_change_the_generator_cannot_make_in_place_is_refused() -> None:
    not_null = replace(
        REQUESTS,
        columns=(*REQUESTS.columns, schema.Column("region", "text", "where", sqlite=NEXT_SQLITE, postgres=NEXT_PG)),
    )
    tables = (*(t for t in schema.TABLES if t.name != "requests"), not_null)
    with pytest.raises(schema.SchemaError, match="requests.region: .* must be nullable"):
        schema.postgres_migration(NEXT_PG, tables)
    with pytest.raises(schema.SchemaError, match="must be nullable"):
        schema.sqlite_added_columns(tables)
    with pytest.raises(schema.SchemaError, match="adds nothing"):
        schema.postgres_migration(NEXT_PG)


# ---- rows, by name ----------------------------------------------------------------------------

ATTEMPT = AttemptEntry(
    idx=0, tier="small", decision="accepted", reason="r", error=None, score=0.5, threshold=0.4, scores={"v": 0.5},
    prompt_tokens=10, completion_tokens=5, finish_reason="stop", latency_ms=12.5, busy_ms=None, verify_ms=0.1,
    cost_usd=1e-6, verifier_cost_usd=1e-7, verifier_tokens=3,
)  # fmt: skip
ENTRY = LedgerEntry(
    request_id="r1", ts=1.5, key_id="alice", model="auto", tier="small", escalated=False, unverified=True,
    latency_ms=40.0, cost_usd=1.1e-6, counterfactual_usd=3e-5, attempts=(ATTEMPT,), task="math", task_why="digits",
    user="end-7",
)  # fmt: skip
PAIR = ShadowPair(
    "r1", "r1-shadow", 3.0, "small", "large", None, None, 0.5, {"v": 0.8}, False, "number", "4 != 5", "4", "5",
    "p" * 64, "a" * 64, "s" * 64, 1e-5, prompt_json='{"prompt":"2+2"}',
)  # fmt: skip

FEEDBACK = Feedback("fb-1", "r1", 4.0, "alice", 0.0, label="thumbs_down", comment=None, role="client", team="lab")


def names(table: str) -> set[str]:
    return {c.name for c in schema.columns(table, "sqlite")}


def test_each_mapping_writes_exactly_its_tables_columns() -> None:
    assert set(rows.request_values(ENTRY)) == names("requests")
    assert set(rows.attempt_values(ENTRY)[0]) == names("attempts")
    assert set(rows.pair_values(PAIR)) == names("shadow_pairs")
    assert set(rows.pending_values(PendingEntry("r", 1.0, "k", "auto", 0.5))) == names("pending")
    assert set(rows.feedback_values(FEEDBACK)) == names("feedback")


def test_rows_are_read_by_name_whatever_their_order() -> None:
    def shuffled(values: dict[str, object]) -> dict[str, object]:
        return dict(reversed(values.items()))  # a row whose columns come in another order

    attempts = [rows.attempt_from_row(shuffled(v)) for v in rows.attempt_values(ENTRY)]
    assert rows.entry_from_row(shuffled(rows.request_values(ENTRY)), attempts) == ENTRY
    assert rows.pair_from_row(shuffled(rows.pair_values(PAIR))) == PAIR
    pending = PendingEntry("r", 1.0, "k", "auto", 0.5)
    assert rows.pending_from_row(shuffled(rows.pending_values(pending))) == pending
    assert rows.feedback_from_row(shuffled(rows.feedback_values(FEEDBACK))) == FEEDBACK


def test_an_entry_reads_back_exactly_through_the_sqlite_store(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "ledger.sqlite3")
    s.open()
    try:
        s.write(ENTRY)
        s.write_pair(PAIR)
        s.write_feedback(FEEDBACK)
        assert list(s.entries()) == [ENTRY]
        assert s.entry("r1") == ENTRY and s.entry("r2") is None
        assert list(s.pairs()) == [PAIR]
        assert list(s.feedback()) == list(s.feedback(request_id="r1")) == [FEEDBACK]
        assert list(s.feedback(since=4.5)) == list(s.feedback(request_id="r2")) == []
        with pytest.raises(sqlite3.IntegrityError):  # a label of no request is refused by the store too
            s.write_feedback(replace(FEEDBACK, feedback_id="fb-2", request_id="nope"))
    finally:
        s.close()
