"""Three `tierroute serve` processes on one PostgreSQL ledger, as behind a load balancer.

A few hundred requests go round-robin from several keys. What must hold: every answered request
has exactly one ledger row, with the cost its client was sent; `report costs` on the database
adds up to what the clients were sent; a key's daily budget holds across the three (its spend
never passes it: every request here costs at most its reservation, so the stated overshoot bound
is zero); a key's rate limit is one window for all three. Then one replica is killed with
`kill -9` mid-burst: the other two keep serving, the ledger still reconciles with the clients,
and the dead replica's reservations all expire within the hold lifetime.

The only tier is a scripted OpenAI-compatible upstream (tests/support/fault_upstream.py), so
the test measures the router and its ledger, not a model, on a loaded machine.
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
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from router.ledger.postgres import PostgresStore
from tests.support.accounting import auth, chat, keys_section
from tests.support.config import write_config
from tests.support.fault_upstream import FaultUpstream, delayed, ok
from tests.support.servers import TIERROUTE, serve_process

TIMEOUT_S = 5  # the tier's timeout: a reservation lives TIMEOUT_S + 60 s (router.admission.accounting)
BUDGET = 3e-4  # "capped"'s daily budget, about 20 requests' cost
PER_MINUTE = 25  # "paced"'s rate limit

TIER = """
[[tiers]]
name = "large"
backend = "openai"
max_tokens = 8
timeout_s = {timeout}
[tiers.openai]
base_url = "{base_url}"
model = "scripted"
max_attempts = 1
hosted_prompt_tokens = 0  # the scripted server adds no system prompt: reservations near the real cost
[tiers.price]
usd_per_1m_input_tokens = 0.60
usd_per_1m_output_tokens = 2.40
"""

KEYS: dict[str, dict[str, Any]] = {
    "ana": {},
    "ben": {},
    "capped": {"usd_per_day": BUDGET},
    "paced": {"requests_per_minute": PER_MINUTE},
    "roomy": {"usd_per_day": 1.0},  # limited, never reached: its requests hold reservations
}


@dataclass
class Outcome:
    key: str
    replica: int
    status: int | None  # None: no response (the connection broke)
    body: dict[str, Any] | None


def config(tmp: Path, url: str, upstream: str) -> tuple[Path, dict[str, str]]:
    body, raw = keys_section(KEYS)
    text = f'[server]\n{body}\n[ledger]\nurl = "{url}"\n' + TIER.format(timeout=TIMEOUT_S, base_url=upstream)
    return write_config(tmp / "config.toml", text), raw


@contextlib.contextmanager
def replicas(cfg: Path, tmp: Path, n: int) -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(serve_process(cfg, log_path=tmp / f"serve{i}.log"))[:2] for i in range(n)]


# the key of each request: mostly the unlimited two, a share for the capped and the paced
FIRST = ("ana", "capped", "ben", "paced", "ana", "ben", "capped", "paced")
# after the kill: half for a limited key with room, so the dead replica leaves reservations behind
SECOND = ("ana", "roomy", "ben", "roomy")


async def burst(
    urls: list[str],
    raw: dict[str, str],
    n: int,
    cycle: tuple[str, ...],
    *,
    kill: subprocess.Popen[bytes] | None = None,
    kill_at: int = 0,
) -> list[Outcome]:
    """n requests, 12 at a time, round-robin over the replicas still alive; with `kill`, that
    replica (the first) is killed with SIGKILL once kill_at responses have come back."""
    alive = list(range(len(urls)))
    gate = asyncio.Semaphore(12)
    done = 0
    outcomes: list[Outcome] = []
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int, key: str) -> None:
            nonlocal done
            async with gate:
                replica = alive[i % len(alive)]
                body = chat(f"Say hello to number {i}.", max_tokens=8)
                try:
                    r = await client.post(f"{urls[replica]}/v1/chat/completions", json=body, headers=auth(raw[key]))
                    outcomes.append(Outcome(key, replica, r.status_code, r.json()))
                except httpx.HTTPError:
                    outcomes.append(Outcome(key, replica, None, None))
                done += 1
                if kill is not None and done == kill_at:
                    os.kill(kill.pid, signal.SIGKILL)
                    alive.remove(0)  # the balancer takes it out of rotation

        await asyncio.gather(*(one(i, cycle[i % len(cycle)]) for i in range(n)))
    return outcomes


def ledger_rows(url: str) -> dict[str, tuple[str, float]]:
    """request_id -> (key, cost), checking that no id appears twice."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT request_id, key_id, cost_usd FROM requests").fetchall()
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids))
    return {r[0]: (r[1], r[2]) for r in rows}


def report(cfg: Path, *args: str) -> dict[str, dict[str, str]]:
    out = subprocess.run(
        [TIERROUTE, "--config", str(cfg), "report", "costs", "--format", "csv", "--by", "key", *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return {row["key"]: row for row in csv.DictReader(io.StringIO(out))}


def check_reconciles(outcomes: list[Outcome], url: str, cfg: Path, *, in_flight_at_kill: int = 0) -> None:
    answered = [o for o in outcomes if o.status == 200]
    assert answered
    rows = ledger_rows(url)
    sent = {o.body["id"]: o for o in answered if o.body is not None}
    assert len(sent) == len(answered)
    for rid, o in sent.items():  # exactly one row per answered request, at the cost the client saw
        assert o.body is not None
        assert rows[rid] == (o.key, o.body["tierroute"]["cost_usd"])
    unseen = set(rows) - set(sent)  # committed, but the client never got the answer: only at a kill
    assert len(unseen) <= in_flight_at_kill
    by_key = report(cfg)
    for key in KEYS:
        costs = [rows[rid][1] for rid in rows if rows[rid][0] == key]
        if costs:
            assert float(by_key[key]["cost_usd"]) == math.fsum(costs)
    seen_total = math.fsum(o.body["tierroute"]["cost_usd"] for o in answered if o.body is not None)
    unseen_total = math.fsum(rows[rid][1] for rid in unseen)
    assert round(float(by_key["TOTAL"]["cost_usd"]), 2) == round(seen_total + unseen_total, 2)
    assert float(by_key["TOTAL"]["cost_usd"]) == pytest.approx(seen_total + unseen_total, abs=1e-12)
    # the budget across every replica: the capped key's recorded spend never passes it
    capped = math.fsum(cost for key, cost in rows.values() if key == "capped")
    assert capped <= BUDGET
    assert any(o.key == "capped" and o.status == 429 for o in outcomes)  # it was reached
    assert any(o.key == "capped" and o.status == 200 for o in outcomes)  # after some were served


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_three_replicas_share_one_ledger_budget_and_rate_then_survive_a_kill_9(tmp_path: Path, db: str) -> None:
    url = db
    # each answer takes 50 ms upstream, so a dozen requests are in flight when the kill comes
    with FaultUpstream(default=delayed(0.05, ok())) as upstream:
        cfg, raw = config(tmp_path, url, upstream.base_url)
        with replicas(cfg, tmp_path, 3) as procs:
            urls = [u for _, u in procs]
            started = time.monotonic()
            first = asyncio.run(burst(urls, raw, 240, FIRST))
            took = time.monotonic() - started
            assert {o.status for o in first} <= {200, 429}
            assert {o.replica for o in first if o.status == 200} == {0, 1, 2}
            check_reconciles(first, url, cfg)
            paced = [o for o in first if o.key == "paced"]
            if took < 55:  # all in one window: exactly the limit got through, whichever replica served it
                assert sum(o.status == 200 for o in paced) == PER_MINUTE
                assert all(o.body["error"]["code"] == "rate_limit_exceeded" for o in paced if o.status == 429)  # type: ignore[index]

            # ---- kill -9 one replica mid-burst: the other two keep serving ----------------------
            victim = procs[0][0]
            second = asyncio.run(burst(urls, raw, 120, SECOND, kill=victim, kill_at=30))
            killed_at = time.time()
            assert victim.wait(timeout=30) == -signal.SIGKILL
        after = [o for o in second[30:] if o.replica != 0]
        assert after and all(o.status in (200, 429) for o in after)  # the survivors served the rest
        broken = [o for o in second if o.status is None]
        assert all(o.replica == 0 for o in broken)
        check_reconciles(first + second, url, cfg, in_flight_at_kill=len(broken))
    # the dead replica's reservations: none outlives its expiry (the tier's timeout + 60 s)
    store = PostgresStore(url, read_only=True)
    store.open()
    try:
        with store.pool.connection() as conn:
            row = conn.execute("SELECT count(*), coalesce(max(expires_at), 0) FROM pending").fetchone()
        assert row is not None
        left, latest = row
        assert left <= len(broken)  # only requests that were in flight at the kill
        assert latest <= killed_at + TIMEOUT_S + 60 + 1
        ttl_later = killed_at + TIMEOUT_S + 60 + 1
        with store.pool.connection() as conn:
            live = conn.execute("SELECT count(*) FROM pending WHERE expires_at > %s", (ttl_later,)).fetchone()
        assert live == (0,)
    finally:
        store.close()
