"""The PostgreSQL ledger's schema as versioned migrations (`MIGRATIONS`, recorded in
`schema_migrations`), applied in order at start-up under an advisory lock, so replicas starting
together migrate once; `tierroute ledger migrate` applies them without serving. The released ones
(`RELEASED`) run as they were written; later ones are generated from `router.ledger.schema`, which
a test holds to the released text token for token.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from router.ledger import schema

log = logging.getLogger(__name__)

_MIGRATION_LOCK = 0x7469657272  # pg_advisory_xact_lock key: one replica migrates at a time

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
