"""The shadow budget holds for every request shape: its estimate is the function admission
reserves by, so `n` choices and a prompt full of tools are counted before the work is sent.

The small tier answers at once (an instant backend) and accepts; every answer is shadowed at the
large tier, an OpenAI-compatible upstream on loopback that bills what the request's shape lets it
bill (`budget_helpers.billing`). The operator key's spend in the ledger must stay within the lane's
`usd_per_day`, with shadow work done (the budget is not reserved away)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.api.app import create_app
from router.backends.instant import InstantBackend
from router.config import SHADOW_KEY, load_settings
from tests.support.accounting import read_ledger
from tests.support.budget import ANSWER, Mode, billed_usage, billing, remote_tier
from tests.support.config import write_config
from tests.support.fault_upstream import Action, FaultUpstream, Received, chat_chunk, sse
from tests.support.model import SMOL
from tests.support.servers import UvicornThread

BUDGET = 0.05


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    with FaultUpstream() as server:
        yield server


def config(tmp: Path, base_url: str) -> Path:
    return write_config(
        tmp / "config.toml",
        f"""
[server]
allow_unauthenticated = true
[ledger]
path = "{tmp / "ledger.sqlite3"}"
[[tiers]]
name = "small"
backend = "llamacpp"
max_tokens = 2048
[tiers.llamacpp]
model = "{SMOL}"
[tiers.price]
usd_per_hour = 0.01
[tiers.shadow]
rate = 1.0
usd_per_day = {BUDGET}
max_concurrency = 4
max_queue = 50
"""
        + remote_tier("large", base_url),
    )


def tools(count: int) -> list[dict[str, Any]]:
    params = {
        "type": "object",
        "properties": {f"p{j}": {"type": "string", "description": "d" * 900} for j in range(15)},
    }
    return [
        {"type": "function", "function": {"name": f"t{i}", "description": "t" * 16_000, "parameters": params}}
        for i in range(count)
    ]


def shadowed(base: str) -> float:
    """Shadow jobs finished one way or another: compared, or dropped for any reason."""
    done = 0.0
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(("tierroute_shadow_pairs_total{", "tierroute_shadow_dropped_total{")):
            done += float(line.rsplit(" ", 1)[1])
    return done


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["realistic", "greedy"])
@pytest.mark.parametrize("shape", ["n", "tools"])
def test_shadow_spend_stays_within_its_budget(tmp_path: Path, upstream: FaultUpstream, shape: str, mode: Mode) -> None:
    upstream.default = billing(mode, delay_s=0.2)
    ask: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "Tell me a story."}]}
    if shape == "n":
        ask.update(n=8, max_tokens=2048)
    else:
        ask.update(tools=tools(2), max_tokens=16)
    count = 12
    app = create_app(load_settings(config(tmp_path, upstream.base_url)), backends={"small": InstantBackend("small")})
    with UvicornThread(app) as srv:

        async def run() -> list[int]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
                out = await asyncio.gather(*(client.post("/v1/chat/completions", json=ask) for _ in range(count)))
                return [r.status_code for r in out]

        assert asyncio.run(run()) == [200] * count
        deadline = time.monotonic() + 60
        while shadowed(srv.url) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        assert shadowed(srv.url) == count
    rows = [e for e in read_ledger(tmp_path / "ledger.sqlite3").values() if e.key_id == SHADOW_KEY]
    total = math.fsum(e.cost_usd for e in rows)
    assert rows, "no shadow work was done: the budget was reserved away"
    assert total <= BUDGET * (1 + 1e-9), f"shadow spent ${total:.6f} of ${BUDGET}"


def _cut_stream(mode: Mode) -> Action:
    """Bills as `billing` does, streams the usage, then closes the connection before the end:
    the target did the work, and the service hears a failure."""

    async def act(conn: Any, req: Received) -> bool:
        await asyncio.sleep(0.2)
        if not req.streaming:
            return await billing(mode, delay_s=0.0)(conn, req)
        usage = billed_usage(req.body, mode)
        return await sse(chat_chunk(ANSWER), {"id": "b", "choices": [], "usage": usage}, done=False)(conn, req)

    return act


@pytest.mark.timeout(180)
def test_shadow_work_that_fails_mid_answer_is_charged(tmp_path: Path, upstream: FaultUpstream) -> None:
    """Before, a target that failed after streaming (a cut stream, its deadline) charged nothing:
    no ledger row, no spend against the lane's budget, however many such jobs ran."""
    upstream.default = _cut_stream("greedy")
    ask = {"model": "auto", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 2048}
    count = 12
    app = create_app(load_settings(config(tmp_path, upstream.base_url)), backends={"small": InstantBackend("small")})
    with UvicornThread(app) as srv:
        for _ in range(count):
            assert httpx.post(f"{srv.url}/v1/chat/completions", json=ask, timeout=60).status_code == 200
        deadline = time.monotonic() + 60
        while shadowed(srv.url) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        assert shadowed(srv.url) == count
    rows = [e for e in read_ledger(tmp_path / "ledger.sqlite3").values() if e.key_id == SHADOW_KEY]
    assert rows, "the failed shadow work was done upstream and charged nothing"
    total = math.fsum(e.cost_usd for e in rows)
    assert total > 0
    assert total <= BUDGET * (1 + 1e-9), f"shadow spent ${total:.6f} of ${BUDGET}"
