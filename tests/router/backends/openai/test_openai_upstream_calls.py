"""An upstream's tool calls whose arguments no reader can walk, behind the whole service: an
upstream (a vLLM under no grammar, a hosted API, anything hostile) may send `tool_calls` whose
`arguments` text nests thousands of brackets deep. Python's JSON decoder raises RecursionError
on it, which the `tool_call` verifier and the Messages renderer let out as a 500 for every
surface. Now the verifier scores such a call 0 (nested past `MAX_NESTING`) and each surface
answers with the call as sent, the ledger recording every request."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.api.app import create_app
from router.config import load_settings
from tests.support.accounting import assert_no_partial_requests, read_ledger
from tests.support.fault_upstream import FaultUpstream, raw
from tests.support.servers import UvicornThread

DEEP = "[" * 5000 + "]" * 5000
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
SURFACES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "messages": ASK,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}],
    },
    "/v1/messages": {"max_tokens": 32, "messages": ASK, "tools": [{"name": "get_weather", "input_schema": PARAMETERS}]},
    "/v1/responses": {"input": ASK, "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMETERS}]},
}


def _answer(arguments: str) -> bytes:
    call = {"id": "call_up", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    return json.dumps(
        {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}
    ).encode()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FaultUpstream, Path]]:
    tmp = tmp_path_factory.mktemp("upstream-calls")
    ledger = tmp / "ledger.sqlite3"
    cfg = tmp / "config.toml"
    with FaultUpstream() as upstream:
        cfg.write_text(f"""
[server]
allow_unauthenticated = true
[ledger]
path = "{ledger}"
[[tiers]]
name = "large"
backend = "openai"
max_tokens = 32
timeout_s = 5
[tiers.openai]
base_url = "{upstream.base_url}"
model = "fake-large"
max_attempts = 1
[[tiers.verifiers]]
name = "tool_call"
[tiers.price]
usd_per_1m_input_tokens = 0.60
usd_per_1m_output_tokens = 2.40
""")
        with UvicornThread(create_app(load_settings(cfg))) as srv:
            yield srv.url, upstream, ledger


@pytest.mark.parametrize("path", list(SURFACES))
def test_arguments_nested_past_any_reader_are_answered_not_a_500(
    service: tuple[str, FaultUpstream, Path], path: str
) -> None:
    url, upstream, ledger = service
    upstream.default = raw(200, _answer(DEEP))
    before = len(read_ledger(ledger)) if ledger.exists() else 0
    r = httpx.post(url + path, json={"model": "large", **SURFACES[path]}, timeout=30)
    assert r.status_code == 200, r.text[:300]
    body = r.json()
    if path == "/v1/messages":
        (use,) = [b for b in body["content"] if b["type"] == "tool_use"]
        assert use["input"] == {"_arguments": DEEP}  # Anthropic's `input` is an object: kept whole
    elif path == "/v1/responses":
        (call,) = [o for o in body["output"] if o["type"] == "function_call"]
        assert call["arguments"] == DEEP
    else:
        assert body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == DEEP
        read = body["tierroute"]["attempts"][0]["scores"]["tool_call"]
        assert read["score"] == 0.0 and "nested more than 64 deep" in read["reason"]
    deadline = time.monotonic() + 10  # the ledger is written off the request's path
    while len(rows := read_ledger(ledger)) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(rows) == before + 1  # answered, and recorded
    assert [a.scores["tool_call"] for e in rows.values() for a in e.attempts] == [0.0] * len(rows)
    assert_no_partial_requests(ledger)
