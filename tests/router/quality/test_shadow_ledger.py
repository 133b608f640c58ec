"""Shadow pairs in the ledger: schema 4, written through the writer thread, readable by reports
and by `eval import`, and absent (not an error) in a ledger written before they existed."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from router.ledger import schema
from router.ledger.entries import ShadowPair
from router.ledger.store import SCHEMA_VERSION, SQLiteStore
from router.ledger.writer import Ledger
from tests.support.ledger import _V2_REQUESTS


def pair(rid: str, ts: float, *, agree: bool = True) -> ShadowPair:
    return ShadowPair(
        request_id=rid,
        shadow_request_id=f"shadow-{rid}",
        ts=ts,
        tier="small",
        target="large",
        task="maths",
        score=0.82,
        threshold=0.6,
        scores={"confidence": 0.82},
        agree=agree,
        rule="number",
        detail="42 == 42",
        answer_extracted="42",
        shadow_extracted="42" if agree else "41",
        prompt_sha256="a" * 64,
        answer_sha256="b" * 64,
        shadow_sha256="c" * 64,
        shadow_cost_usd=1.5e-5,
    )


async def test_pairs_round_trip_through_the_writer_thread(tmp_path: Path) -> None:
    ledger = Ledger(SQLiteStore(tmp_path / "ledger.sqlite3"))
    await ledger.open()
    try:
        stored = replace(pair("r2", 2.0, agree=False), prompt_json='{"prompt":"2+2"}', answer_text="4", shadow_text="4")
        await ledger.record_pair(pair("r1", 1.0))
        await ledger.record_pair(stored)
        assert await ledger.pairs() == [pair("r1", 1.0), stored]
        assert await ledger.pairs(since=1.5) == [stored]
        assert await ledger.pairs(until=1.5) == [pair("r1", 1.0)]
    finally:
        await ledger.close()
    ro = SQLiteStore(tmp_path / "ledger.sqlite3", read_only=True)
    ro.open()
    try:
        assert [p.request_id for p in ro.pairs()] == ["r1", "r2"]
    finally:
        ro.close()


def test_an_older_ledger_has_no_pairs_read_only_and_gains_the_table_on_open(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(_V2_REQUESTS)
    conn.close()
    ro = SQLiteStore(path, read_only=True)
    ro.open()
    try:
        assert list(ro.pairs()) == []
    finally:
        ro.close()
    s = SQLiteStore(path)
    s.open()
    try:
        s.write_pair(pair("r1", 1.0))
        assert [p.request_id for p in s.pairs()] == ["r1"]
        assert [e.request_id for e in s.entries()] == ["old"]
        version = s.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
        assert version == str(SCHEMA_VERSION) == str(schema.latest("sqlite"))
    finally:
        s.close()


async def test_a_pair_and_its_shadow_row_are_written_together(tmp_path: Path) -> None:
    from tests.support.ledger import entry

    ledger = Ledger(SQLiteStore(tmp_path / "ledger.sqlite3"))
    await ledger.open()
    try:
        row = replace(entry("shadow-r1", 1.0, key="_shadow"), model="large")
        await ledger.record_pair(pair("r1", 1.0), row)
        assert [(e.request_id, e.key_id) for e in await ledger.entries()] == [("shadow-r1", "_shadow")]
        assert [p.shadow_request_id for p in await ledger.pairs()] == ["shadow-r1"]
        # the same row again fails the whole write: no pair without its row, nor the reverse
        with pytest.raises(sqlite3.IntegrityError):
            await ledger.record_pair(pair("r2", 2.0), row)
        assert [p.request_id for p in await ledger.pairs()] == ["r1"]
    finally:
        await ledger.close()
