"""Every way a request ends releases it through one place: `tierroute_requests_in_flight` goes back
to 0 after answered, failed, cut and abandoned requests alike (it used to stay up after a failed
one), and each request that did work has its row. A real server, a scripted upstream, real HTTP."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest

from router.api.app import create_app
from router.config import load_settings
from tests.support.accounting import auth, read_ledger
from tests.support.fault_upstream import FaultUpstream, broken_stream, status
from tests.support.paused_upstream import chat_body, config, in_flight, paused_stream
from tests.support.servers import UvicornThread


def wait_for_zero(url: str, key: str, timeout: float = 10.0) -> float:
    deadline = time.monotonic() + timeout
    while (value := in_flight(url, key)) != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_the_in_flight_gauge_returns_to_zero_whatever_the_ending(tmp_path: Path) -> None:
    gate = threading.Event()
    with FaultUpstream() as upstream:
        cfg, keys = config(tmp_path, upstream.base_url, budget=100.0)
        key = keys["k"]
        with UvicornThread(create_app(load_settings(cfg))) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60, headers=auth(key)) as client:
                # the upstream fails before any output: 503, plain and streamed
                upstream.script(status(500), status(500))
                for stream in (False, True):
                    r = await client.post("/v1/chat/completions", json=chat_body(stream))
                    assert r.status_code == 503
                assert wait_for_zero(srv.url, key) == 0

                # the upstream breaks mid-stream: an error event after the text
                upstream.script(broken_stream(2, "cut"))
                r = await client.post("/v1/chat/completions", json=chat_body(True))
                assert r.status_code == 200 and '"error"' in r.text and "[DONE]" not in r.text
                assert wait_for_zero(srv.url, key) == 0

                # the client goes away mid-answer
                upstream.script(paused_stream(gate))
                async with client.stream("POST", "/v1/chat/completions", json=chat_body(True)) as r:
                    async for piece in r.aiter_text():
                        if '"Hello"' in piece:
                            break
                    assert in_flight(srv.url, key) == 1
                # the server sees the client gone while the upstream is still paused (it listens for
                # the disconnect), so the request is released before the upstream goes on; with the
                # gate opened first, the stream could finish and be recorded as answered, not
                # abandoned (a race seen once in CI)
                assert wait_for_zero(srv.url, key) == 0
                gate.set()

                # and answered requests, concurrently
                answered = await asyncio.gather(
                    *(client.post("/v1/chat/completions", json=chat_body(i % 2 == 0)) for i in range(6))
                )
                assert [r.status_code for r in answered] == [200] * 6
                assert wait_for_zero(srv.url, key) == 0
            services = srv.server.config.app.state.services  # type: ignore[attr-defined]
            assert services.accounting.limits.reserved("k") == 0.0
    rows = read_ledger(tmp_path / "ledger.sqlite3")
    decisions = sorted(e.attempts[-1].decision for e in rows.values())
    # the cut stream's and the abandoned stream's work is recorded; the 503s did none
    assert decisions.count("accepted") == 6
    assert "abandoned" in decisions and "error" in decisions
