"""kill -9 in the middle of a burst: the real `tierroute serve` process, real clients, the real file.

What must hold: every request whose client was sent its cost is in the ledger with exactly that
cost, those tokens and that tier; the ledger holds no half request; the only rows clients did not
see are requests that were in flight at the kill. After a restart on the same file the service
answers again, and its ledger and `tierroute report costs` reconcile exactly with the clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import math
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.ledger.entries import LedgerEntry, PendingEntry
from router.ledger.store import SQLiteStore
from tests.support.accounting import (
    assert_matches,
    assert_no_partial_requests,
    auth,
    chat,
    config_with_keys,
    tierroute_of,
)
from tests.support.servers import TIERROUTE, serve_process

# the small tier's answers never pass: 'auto' requests escalate, so rows have two attempts
REJECT_ALL = '[[tiers.verifiers]]\nname = "format"\nparams = { regex = "^NEVER-MATCHES$" }\n'


@contextlib.contextmanager
def serve(cfg: Path, log_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    with serve_process(cfg, log_path=log_path) as (proc, url, _):
        yield proc, url


@dataclass
class Outcome:
    key: str
    status: int | None
    ext: dict[str, Any] | None  # the tierroute object the client was sent, if it was
    complete: bool  # the whole response arrived ([DONE] for a stream)


def plan(n: int) -> list[tuple[str, str, bool]]:
    """(key, model, stream) for n requests: mostly auto (escalated: two attempts), some sent straight
    to one tier; half streamed; two keys."""
    models = ("auto", "auto", "small", "auto", "auto", "large")
    return [("ivy" if i % 2 == 0 else "jon", models[i % len(models)], i % 4 >= 2) for i in range(n)]


async def one(client: httpx.AsyncClient, key: str, raw_key: str, model: str, stream: bool, i: int) -> Outcome:
    body = chat(f"Write one short sentence about the number {i}.", model=model, max_tokens=16, stream=stream)
    text: list[str] = []
    status = None
    try:
        if stream:
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=auth(raw_key)) as r:
                status = r.status_code
                async for piece in r.aiter_text():
                    text.append(piece)
            ext = tierroute_of("".join(text), stream=True)
            return Outcome(key, status, ext, ext is not None)
        r = await client.post("/v1/chat/completions", json=body, headers=auth(raw_key))
        return Outcome(key, r.status_code, tierroute_of(r.text, False) if r.status_code == 200 else None, True)
    except httpx.HTTPError:
        # cut off: did the final chunk, which carries the cost, arrive before the cut?
        ext = None
        for line in "".join(text).splitlines():
            if line.startswith("data: {") and '"tierroute"' in line:
                ext = tierroute_of(line + "\ndata: [DONE]\n", stream=True)
        return Outcome(key, status, ext, False)


async def burst(
    url: str,
    keys: dict[str, str],
    n: int,
    *,
    kill: subprocess.Popen[bytes] | None = None,
    kill_after_escalated: int = 0,
) -> list[Outcome]:
    """Fire n requests at once; with `kill`, kill -9 the server as soon as that many escalated
    (two-attempt) requests have been answered, while the rest are in flight."""
    escalated = 0
    enough = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def counted(i: int, key: str, model: str, stream: bool) -> Outcome:
            nonlocal escalated
            out = await one(client, key, keys[key], model, stream, i)
            escalated += bool(out.complete and out.ext and out.ext["escalated"])
            if kill is not None and escalated >= kill_after_escalated:
                enough.set()
            return out

        tasks = [asyncio.create_task(counted(i, k, m, s)) for i, (k, m, s) in enumerate(plan(n))]
        if kill is not None:
            await enough.wait()
            os.kill(kill.pid, signal.SIGKILL)
        return list(await asyncio.gather(*tasks))


def open_pending(path: Path) -> dict[str, PendingEntry]:
    store = SQLiteStore(path, read_only=True)
    store.open()
    try:
        return {p.request_id: p for p in store.pending()}
    finally:
        store.close()


def open_ledger(path: Path) -> dict[str, LedgerEntry]:
    """Open it read-write, as a restarted service would (recovering the WAL if it must)."""
    store = SQLiteStore(path)
    store.open()
    try:
        return {e.request_id: e for e in store.entries()}
    finally:
        store.close()


def report(cfg: Path, *args: str) -> dict[str, dict[str, str]]:
    out = subprocess.run(
        [TIERROUTE, "--config", str(cfg), "report", "costs", "--format", "csv", *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    reader = csv.DictReader(io.StringIO(out))
    group = reader.fieldnames[0]  # type: ignore[index]
    return {row[group]: row for row in reader}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_9_mid_burst_then_restart_reconciles(tmp_path: Path, smol_path: Path) -> None:
    cfg, keys = config_with_keys(tmp_path, {"ivy": {}, "jon": {}}, threshold=0.5, verifiers=REJECT_ALL)
    path = tmp_path / "ledger.sqlite3"
    log = tmp_path / "serve.log"

    # ---- a burst of 12, killed once two escalated requests have been answered -------------------------------------------
    with serve(cfg, log) as (proc, url):
        first = asyncio.run(burst(url, keys, 12, kill=proc, kill_after_escalated=2))
        assert proc.wait(timeout=30) == -signal.SIGKILL
    seen = [o for o in first if o.ext is not None]
    unseen = [o for o in first if o.ext is None]
    assert len(seen) >= 2
    assert unseen, "the kill came after the whole burst: nothing was in flight"

    ledger = open_ledger(path)
    for o in seen:  # a client that was sent its cost implies a committed row with exactly that cost
        assert_matches(ledger[o.ext["request_id"]], o.ext, key_id=o.key)  # type: ignore[index]
    extra = set(ledger) - {o.ext["request_id"] for o in seen}  # type: ignore[index]
    assert len(extra) <= len(unseen)  # committed, but the client was cut off: in flight at the kill
    # the others in flight are on record as pending rows (written ahead at admission), at their
    # reservation, and never alongside a settled row
    pending = open_pending(path)
    assert len(extra) + len(pending) <= len(unseen)
    assert not set(pending) & set(ledger)
    assert all(p.key_id in ("ivy", "jon") and p.reserved_usd > 0 for p in pending.values())
    assert_no_partial_requests(path)
    assert {e.key_id for e in ledger.values()} <= {"ivy", "jon"}
    assert any(o.ext["escalated"] and len(o.ext["attempts"]) == 2 for o in seen)  # type: ignore[index]
    after_crash = len(ledger)

    # ---- restart on the same file: it serves, records, and reports exactly -----------------------
    t_restart = time.time()
    with serve(cfg, log) as (proc, url):
        second = asyncio.run(burst(url, keys, 8))
        assert all(o.status == 200 and o.complete and o.ext is not None for o in second)
        # the report reads the ledger while the service is still writing it (WAL: no blocking)
        since = datetime.fromtimestamp(t_restart, tz=UTC).isoformat()  # after every pre-crash row
        by_key = report(cfg, "--by", "key", "--since", since)
        by_tier = report(cfg, "--by", "tier", "--since", since)
        by_day = report(cfg, "--by", "day", "--since", since)
    # a graceful stop (uvicorn re-raises the SIGTERM it handled) closes the ledger: WAL folded in
    assert proc.returncode in (0, -signal.SIGTERM)
    assert log.read_text().count("Application shutdown complete") == 1
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0

    exts = [o.ext for o in second if o.ext is not None]
    for key in ("ivy", "jon"):
        mine = [o.ext for o in second if o.key == key and o.ext is not None]
        assert int(by_key[key]["requests"]) == len(mine)
        assert float(by_key[key]["cost_usd"]) == math.fsum(e["cost_usd"] for e in mine)
    assert float(by_key["TOTAL"]["cost_usd"]) == math.fsum(e["cost_usd"] for e in exts)
    assert float(by_key["TOTAL"]["top_tier_usd"]) == math.fsum(e["counterfactual_top_tier_usd"] for e in exts)
    for tier in ("small", "large"):
        assert int(by_tier[tier]["answered"]) == sum(e["tier"] == tier for e in exts)
        tokens = sum(
            a["prompt_tokens"] + a["completion_tokens"] for e in exts for a in e["attempts"] if a["tier"] == tier
        )
        assert int(by_tier[tier]["prompt_tokens"]) + int(by_tier[tier]["completion_tokens"]) == tokens
    assert int(by_day["TOTAL"]["requests"]) == 8
    assert float(by_day["TOTAL"]["cost_usd"]) == math.fsum(e["cost_usd"] for e in exts)

    ledger = open_ledger(path)
    assert len(ledger) == after_crash + 8
    for o in second:
        assert_matches(ledger[o.ext["request_id"]], o.ext, key_id=o.key)  # type: ignore[index]
    for o in seen:  # what survived the crash is still there, unchanged
        assert_matches(ledger[o.ext["request_id"]], o.ext, key_id=o.key)  # type: ignore[index]
    assert_no_partial_requests(path)

    # keys are never written: not in the server's log, not in the ledger
    written = log.read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("ledger.sqlite3*"))
    assert b"POST /v1/chat/completions" in written  # the access log is there, and holds no key
    for raw in keys.values():
        assert raw.encode() not in written and raw[4:20].encode() not in written
