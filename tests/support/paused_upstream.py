"""A served router whose only tier is a scripted upstream that can hold a
stream open mid-answer, so a test can look at the service while a request is in flight."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx

from tests.support.accounting import auth, keys_section
from tests.support.config import write_config
from tests.support.fault_upstream import _SSE_HEADERS, TOKENS, Received, _chunks, _Conn, _event, _send_chunked


def paused_stream(gate: threading.Event) -> Any:
    """A correct streamed answer that stops after two tokens until `gate` is set."""

    async def act(conn: _Conn, req: Received) -> bool:
        await conn.head(200, {**_SSE_HEADERS, "Transfer-Encoding": "chunked"})
        chunks = _chunks(req, TOKENS, logprobs=True, usage=True, finish="stop", model="fake-large")
        for chunk in chunks[:3]:  # the role chunk and two tokens
            await _send_chunked(conn, _event(chunk))
        while not gate.is_set():
            await asyncio.sleep(0.02)
        for chunk in chunks[3:]:
            await _send_chunked(conn, _event(chunk))
        await _send_chunked(conn, _event("[DONE]"))
        await conn.send(b"0\r\n\r\n")
        return True

    return act


def config(tmp: Path, base_url: str, budget: float) -> tuple[Path, dict[str, str]]:
    # 'metrics' too: the tests read its in-flight gauge from /metrics with it
    keys, raw = keys_section({"k": {"usd_per_day": budget, "roles": ["client", "metrics"]}})
    body = f"""[server]
{keys}
[ledger]
path = "{tmp / "ledger.sqlite3"}"

[[tiers]]
name = "large"
backend = "openai"
max_tokens = 64
timeout_s = 30
[tiers.openai]
base_url = "{base_url}"
model = "fake-large"
max_attempts = 1
[tiers.price]
usd_per_1m_input_tokens = 0.60
usd_per_1m_output_tokens = 2.40
"""
    return write_config(tmp / "config.toml", body), raw


def chat_body(stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "large", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}
    if stream:
        body["stream"] = True
    return body


def in_flight(url: str, key: str) -> float:
    for line in httpx.get(f"{url}/metrics", headers=auth(key)).text.splitlines():
        if line.startswith("tierroute_requests_in_flight "):
            return float(line.split()[1])
    raise AssertionError("no in-flight gauge")
