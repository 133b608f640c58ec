"""Ledger rows built by hand, and an old schema to migrate from."""

from __future__ import annotations

from router.ledger.store import AttemptEntry, LedgerEntry


def attempt(idx: int, tier: str, decision: str = "accepted", cost: float = 1e-6) -> AttemptEntry:
    return AttemptEntry(
        idx=idx,
        tier=tier,
        decision=decision,
        reason="r",
        error=None,
        score=0.5,
        threshold=0.4,
        scores={"v": 0.5},
        prompt_tokens=10,
        completion_tokens=5,
        finish_reason="stop",
        latency_ms=12.5,
        busy_ms=11.0,
        verify_ms=0.1,
        cost_usd=cost,
        verifier_cost_usd=cost / 10,
        verifier_tokens=3,
    )


def entry(rid: str, ts: float, key: str = "alice", attempts: tuple[AttemptEntry, ...] | None = None) -> LedgerEntry:
    atts = attempts or (attempt(0, "small", "rejected", 1.25e-7), attempt(1, "large", "accepted", 3.3e-5))
    return LedgerEntry(
        request_id=rid,
        ts=ts,
        key_id=key,
        model="auto",
        tier=atts[-1].tier,
        escalated=len(atts) > 1,
        unverified=False,
        latency_ms=40.0,
        cost_usd=sum(a.cost_usd + a.verifier_cost_usd for a in atts),
        counterfactual_usd=3.3e-5,
        attempts=atts,
    )


# The requests table as version 2 wrote it, before requests had a task.
_V2_REQUESTS = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '2');
CREATE TABLE requests (
    request_id TEXT PRIMARY KEY, ts REAL NOT NULL, key_id TEXT NOT NULL, model TEXT NOT NULL,
    tier TEXT NOT NULL, escalated INTEGER NOT NULL, unverified INTEGER NOT NULL, n_attempts INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, latency_ms REAL NOT NULL,
    cost_usd REAL NOT NULL, verifier_cost_usd REAL NOT NULL, counterfactual_usd REAL NOT NULL
);
INSERT INTO requests VALUES ('old', 5.0, 'alice', 'auto', 'small', 0, 0, 0, 10, 5, 12.0, 0.001, 0.0, 0.002);
CREATE TABLE pending (
    request_id TEXT PRIMARY KEY, ts REAL NOT NULL, key_id TEXT NOT NULL, model TEXT NOT NULL, reserved_usd REAL NOT NULL
);
CREATE TABLE attempts (
    request_id TEXT NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE, idx INTEGER NOT NULL,
    tier TEXT NOT NULL, decision TEXT NOT NULL, reason TEXT NOT NULL, error TEXT, score REAL, threshold REAL NOT NULL,
    scores_json TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, finish_reason TEXT,
    latency_ms REAL, busy_ms REAL, verify_ms REAL NOT NULL, cost_usd REAL NOT NULL, verifier_cost_usd REAL NOT NULL,
    verifier_tokens INTEGER NOT NULL, PRIMARY KEY (request_id, idx)
);
"""
