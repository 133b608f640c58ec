"""Load shedding from outside: a served router at its `max_in_flight` answers the next request 503
with Retry-After in the surface's error shape (OpenAI's, Anthropic's), keeps the connection, and
serves again once the load falls; every admitted request has its row and no shed one has.
A real `tierroute serve` process, a scripted upstream holding two streams open, real HTTP."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from tests.support.accounting import auth, read_ledger
from tests.support.fault_upstream import FaultUpstream
from tests.support.paused_upstream import chat_body, config, paused_stream
from tests.support.servers import serve_process

MESSAGES = {"model": "large", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_past_max_in_flight_503_with_retry_after_then_recovers(tmp_path: Path) -> None:
    gate = threading.Event()
    with FaultUpstream() as upstream:
        cfg, keys = config(tmp_path, upstream.base_url, budget=100.0)
        cfg.write_text(cfg.read_text().replace("[server]\n", "[server]\nmax_in_flight = 2\n", 1))
        headers = auth(keys["k"])
        with serve_process(cfg, log_path=tmp_path / "serve.log") as (_, url, _output):
            upstream.script(paused_stream(gate), paused_stream(gate))  # after start-up's own probes
            held = [httpx.Client(base_url=url, timeout=60, headers=headers) for _ in range(2)]
            streams = [c.stream("POST", "/v1/chat/completions", json=chat_body(True)) for c in held]
            opened: list[httpx.Response] = []
            readers = []  # kept: a dropped iterator closes its response, which the server sees as a client gone
            try:
                for s in streams:  # both in flight, held by the upstream after two tokens
                    r = s.__enter__()
                    opened.append(r)
                    assert r.status_code == 200
                    readers.append(r.iter_raw())
                    next(readers[-1])
                with httpx.Client(base_url=url, timeout=60, headers=headers) as client:
                    shed = [client.post("/v1/chat/completions", json=chat_body()) for _ in range(3)]
                    for r in shed:  # the same kept-alive connection each time: it stays usable
                        assert r.status_code == 503, r.text
                        assert r.headers["retry-after"] == "1"
                        assert r.json()["error"]["code"] == "service_unavailable"
                        assert "max_in_flight" in r.json()["error"]["message"]
                    anthropic = client.post("/v1/messages", json=MESSAGES)
                    assert anthropic.status_code == 503 and anthropic.headers["retry-after"] == "1"
                    assert anthropic.json()["type"] == "error"
                    assert anthropic.json()["error"]["type"] == "overloaded_error"
                    # outside the /v1/ surfaces nothing is shed: the service can still be watched
                    assert client.get("/healthz").status_code == 200
                    gate.set()  # the load falls
                    for reader in readers:  # the held answers complete
                        assert b"[DONE]" in b"".join(reader)
            finally:
                gate.set()
                for s in streams[: len(opened)]:
                    s.__exit__(None, None, None)
                for c in held:
                    c.close()
            with httpx.Client(base_url=url, timeout=60, headers=headers) as client:
                again = client.post("/v1/chat/completions", json=chat_body())
                assert again.status_code == 200, again.text
                admitted = [again.json()["id"]]
    rows = read_ledger(tmp_path / "ledger.sqlite3")
    assert len(rows) == 3  # the two streams and the request after: none of the four shed
    assert admitted[0] in rows
