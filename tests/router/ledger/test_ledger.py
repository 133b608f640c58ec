"""The ledger: atomic per-request writes off the event loop, and an exact record of what clients got."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from router.errors import ConfigError
from router.ledger.entries import Feedback, LabelCount, LedgerEntry, PendingEntry
from router.ledger.store import SCHEMA_VERSION, SQLiteStore
from router.ledger.stores import open_store
from router.ledger.writer import Ledger
from tests.support.accounting import (
    ESCALATE_ON_MARK,
    MARK,
    assert_matches,
    assert_no_partial_requests,
    auth,
    chat,
    config_with_keys,
    read_ledger,
    running,
    tierroute_of,
)
from tests.support.ledger import _V2_REQUESTS, attempt, entry


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = SQLiteStore(tmp_path / "ledger.sqlite3")
    s.open()
    yield s
    s.close()


def test_round_trip_is_exact(store: SQLiteStore) -> None:
    e = entry("r1", 1_700_000_000.123456)
    store.write(e)
    assert list(store.entries()) == [e]
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_failed_write_leaves_nothing_behind(store: SQLiteStore) -> None:
    store.write(entry("ok", 1.0))
    broken = entry("broken", 2.0, attempts=(attempt(0, "small"), attempt(0, "large")))  # duplicate idx
    with pytest.raises(sqlite3.IntegrityError):
        store.write(broken)
    assert [e.request_id for e in store.entries()] == ["ok"]
    assert store.conn.execute("SELECT COUNT(*) FROM attempts WHERE request_id = 'broken'").fetchone()[0] == 0
    store.write(entry("after", 3.0))  # the connection is usable again
    assert [e.request_id for e in store.entries()] == ["ok", "after"]


def test_windows_and_spend(store: SQLiteStore) -> None:
    for i, (key, ts) in enumerate([("a", 10.0), ("a", 20.0), ("b", 20.0), ("a", 30.0)]):
        store.write(entry(f"r{i}", ts, key))
    assert [e.request_id for e in store.entries(since=20.0, until=30.0)] == ["r1", "r2"]
    each = entry("x", 0).cost_usd
    assert store.spend_by_key(20.0) == {"a": pytest.approx(2 * each), "b": pytest.approx(each)}


def test_reopening_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.sqlite3"
    s = SQLiteStore(path)
    s.open()
    s.write(entry("r1", 1.0))
    s.close()
    s = SQLiteStore(path)
    s.open()
    s.write(entry("r2", 2.0))
    assert [e.request_id for e in s.entries()] == ["r1", "r2"]
    s.close()


def test_unusable_path_names_the_key(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="ledger.path"):
        SQLiteStore(blocker / "ledger.sqlite3").open()
    with pytest.raises(ConfigError, match="ledger.url must not carry a password"):
        open_store("postgresql://me:secret@db/ledger")


def test_a_pending_row_counts_at_its_reservation_until_its_entry_replaces_it(store: SQLiteStore) -> None:
    store.begin(PendingEntry("r1", 10.0, "alice", "auto", 0.5))
    store.begin(PendingEntry("r2", 10.0, "bob", "large", 0.25))
    assert [p.request_id for p in store.pending()] == ["r1", "r2"]
    assert store.spend_by_key(0.0) == {"alice": 0.5, "bob": 0.25}
    assert store.spend_by_key(11.0) == {}  # a pending row belongs to its admission time's period
    e = entry("r1", 12.0)
    store.write(e)  # the settled entry and the pending row's removal are one transaction
    assert [p.request_id for p in store.pending()] == ["r2"]
    assert store.spend_by_key(0.0) == {"alice": pytest.approx(e.cost_usd), "bob": 0.25}
    assert list(store.entries()) == [e]


def test_a_version_1_ledger_gains_the_pending_table(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);INSERT INTO meta VALUES ('schema_version', '1');"
    )
    conn.close()
    s = SQLiteStore(path)
    s.open()
    try:
        s.begin(PendingEntry("r", 1.0, "k", "auto", 0.1))
        assert s.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(
            SCHEMA_VERSION
        )
    finally:
        s.close()


def test_labels_written_before_givers_were_recorded_read_as_unrecorded_and_the_file_gains_the_columns(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    s = SQLiteStore(path)
    s.open()
    s.write(entry("r1", 1.0))
    s.close()
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:  # the file as the version before it
        conn.execute("ALTER TABLE feedback DROP COLUMN role")
        conn.execute("ALTER TABLE feedback DROP COLUMN team")
        conn.execute(
            "INSERT INTO feedback (feedback_id, request_id, ts, key_id, score) VALUES ('fb-old', 'r1', 2, 'k', 1)"
        )
    old = Feedback("fb-old", "r1", 2.0, "k", 1.0)
    ro = SQLiteStore(path, read_only=True)  # a report or an import reads it as it is
    ro.open()
    try:
        assert list(ro.feedback()) == [old]
    finally:
        ro.close()
    s = SQLiteStore(path)
    s.open()
    try:
        new = Feedback("fb-new", "r1", 3.0, "root", 0.0, role="admin", team="ops")
        assert s.write_feedback(new) == LabelCount(request=1, giver=0)
        assert list(s.feedback()) == [old, new]
    finally:
        s.close()


def test_a_version_2_ledger_gains_the_task_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(_V2_REQUESTS)
    conn.close()
    # a report reads the old file as it is, read-only: old rows have no task
    ro = SQLiteStore(path, read_only=True)
    ro.open()
    try:
        assert [(e.request_id, e.task, e.task_why) for e in ro.entries()] == [("old", None, None)]
    finally:
        ro.close()
    s = SQLiteStore(path)
    s.open()
    try:
        new = replace(entry("new", 6.0), task="choice", task_why="option list A-D")
        s.write(new)
        assert [(e.request_id, e.task, e.task_why, e.cost_usd) for e in s.entries()] == [
            ("old", None, None, 0.001),
            ("new", "choice", "option list A-D", new.cost_usd),
        ]
        assert s.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(
            SCHEMA_VERSION
        )
    finally:
        s.close()
    again = SQLiteStore(path)  # opening a migrated file again changes nothing
    again.open()
    try:
        assert [e.task for e in again.entries()] == [None, "choice"]
    finally:
        again.close()


class FlakyStore(SQLiteStore):
    """Writes fail while `failing` is set, as they would on a full disk (the real disk failure is
    in test_ledger_disk.py)."""

    failing = False

    def write(self, e: LedgerEntry) -> None:
        if self.failing:
            raise sqlite3.OperationalError("database or disk is full")
        super().write(e)

    def begin(self, p: PendingEntry) -> None:
        if self.failing:
            raise sqlite3.OperationalError("database or disk is full")
        super().begin(p)


async def test_an_entry_whose_write_failed_is_written_by_the_next_write(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "ledger.sqlite3")
    ledger = Ledger(store)
    await ledger.open()
    await ledger.begin(PendingEntry("r1", 1.0, "alice", "auto", 0.5))
    store.failing = True
    with pytest.raises(sqlite3.OperationalError):
        await ledger.record(entry("r1", 2.0))
    assert not ledger.healthy and ledger.unsettled == 1
    with pytest.raises(sqlite3.OperationalError):
        await ledger.begin(PendingEntry("r2", 3.0, "alice", "auto", 0.5))
    assert ledger.unsettled == 1
    assert [p.request_id for p in await ledger.pending()] == ["r1"]  # r1 is on record meanwhile
    store.failing = False
    await ledger.begin(PendingEntry("r3", 4.0, "alice", "auto", 0.5))
    assert ledger.healthy and ledger.unsettled == 0
    assert [e.request_id for e in await ledger.entries()] == ["r1"]
    assert [p.request_id for p in await ledger.pending()] == ["r3"]
    store.failing = True
    with pytest.raises(sqlite3.OperationalError):
        await ledger.record(entry("r3", 5.0))
    store.failing = False
    await ledger.close()  # shutting down writes what is still kept
    reopened = SQLiteStore(tmp_path / "ledger.sqlite3", read_only=True)
    reopened.open()
    assert [e.request_id for e in reopened.entries()] == ["r1", "r3"] and not list(reopened.pending())
    reopened.close()


class SlowStore(SQLiteStore):
    """Every write takes a while, and says which thread ran it."""

    threads: set[str]

    def write(self, e: LedgerEntry) -> None:
        self.threads.add(threading.current_thread().name)
        time.sleep(0.2)
        super().write(e)


@pytest.mark.slow
async def test_writes_run_on_the_ledger_thread_and_never_block_the_loop(tmp_path: Path) -> None:
    store = SlowStore(tmp_path / "ledger.sqlite3")
    store.threads = set()
    ledger = Ledger(store)
    await ledger.open()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.gather(*(ledger.record(entry(f"r{i}", float(i))) for i in range(4)))
    task.cancel()
    assert ticks > 30  # 0.8 s of writes; the loop kept running throughout
    assert store.threads and all(name.startswith("tierroute-ledger") for name in store.threads)
    assert len(await ledger.entries()) == 4
    await ledger.close()
    await ledger.close()  # idempotent


@pytest.mark.timeout(300)
async def test_concurrent_burst_reconciles_exactly(tmp_path: Path, smol_path: Path) -> None:
    cfg, keys = config_with_keys(tmp_path, {"alice": {}, "bob": {}}, threshold=0.5, verifiers=ESCALATE_ON_MARK)
    plan = [  # (key, model, prompt, stream)
        ("alice", "auto", "Name a color.", False),
        ("alice", "auto", f"Name a fruit. {MARK}", False),
        ("bob", "auto", "Name a planet.", True),
        ("bob", "auto", f"Name an animal. {MARK}", True),
        ("alice", "large", "Say yes.", False),
        ("bob", "small", f"Say no. {MARK}", False),  # one tier named: accepted as the last tier
        ("alice", "auto", "Count to three.", True),
        ("bob", "auto", f"Name a city. {MARK}", False),
        ("alice", "auto", "Name a month.", False),
        ("bob", "large", "Name a day.", True),
    ]
    async with running(cfg) as client:
        responses = await asyncio.gather(
            *(
                client.post("/v1/chat/completions", json=chat(p, model=m, stream=s), headers=auth(keys[k]))
                for k, m, p, s in plan
            )
        )
        assert [r.status_code for r in responses] == [200] * len(plan)
        exts = [tierroute_of(r.text, s) for r, (_, _, _, s) in zip(responses, plan, strict=False)]
    # the lifespan has closed the ledger: read it as a report would
    path = tmp_path / "ledger.sqlite3"
    ledger = read_ledger(path)
    assert len(ledger) == len(plan)
    for ext, (key, model, prompt, _) in zip(exts, plan, strict=False):
        assert ext is not None
        got = ledger[ext["request_id"]]
        assert_matches(got, ext, key_id=key)
        assert got.model == model
        if model == "auto":
            assert got.escalated == (MARK in prompt)
            assert [a.tier for a in got.attempts] == (["small", "large"] if MARK in prompt else ["small"])
    escalated = [e for e in ledger.values() if e.escalated]
    assert len(escalated) == 3
    assert all(e.attempts[0].decision == "rejected" and e.attempts[0].verifier_cost_usd > 0 for e in escalated)
    assert all(e.latency_ms > 0 for e in ledger.values())
    assert_no_partial_requests(path)
    for raw in keys.values():  # the ledger knows keys by name only
        assert raw.encode() not in path.read_bytes()


@pytest.mark.timeout(300)
async def test_ledger_can_be_turned_off(tmp_path: Path, smol_path: Path) -> None:
    cfg, keys = config_with_keys(tmp_path, {"kim": {"usd_per_day": 1.0}, "lee": {"usd_per_day": 1e-9}}, large="none")
    cfg.write_text(cfg.read_text().replace("[ledger]\n", "[ledger]\nenabled = false\n"))
    async with running(cfg) as client:
        assert (
            await client.post("/v1/chat/completions", json=chat("Hi."), headers=auth(keys["kim"]))
        ).status_code == 200
        # budgets still hold within the process: a request whose worst case does not fit is refused
        assert (
            await client.post("/v1/chat/completions", json=chat("Hi."), headers=auth(keys["lee"]))
        ).status_code == 429
    assert not list(tmp_path.glob("ledger.sqlite3*"))
