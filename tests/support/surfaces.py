"""Served routers for the Responses and Messages surface tests, and the shapes their errors have.

Two services on loopback, as a client meets them: `smol` serves the real SmolLM2 as both tiers
with the `escalate_marked` verifier (a prompt carrying `MARK` is rejected at the small tier, so an
escalation is chosen by the prompt, not by luck); `tools` serves scripted tiers that call
functions as a local model writes calls (`ToolScript`: the small tier names a function that does
not exist, the large one calls it right), because the 135M model does not call functions.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from router.api.app import create_app
from router.config import load_settings
from router.ledger.store import SQLiteStore
from tests.support.accounting import ESCALATE_ON_MARK, registry
from tests.support.config import smol_config
from tests.support.servers import UvicornThread
from tests.support.tool_script import BAD_CALL, GOOD_CALL, TOOL_CALL_VERIFIER, WEATHER, ToolScript

PARAMETERS = WEATHER["function"]["parameters"]
# the same function in each surface's spelling
RESPONSES_WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": PARAMETERS,
    "strict": True,
}
ANTHROPIC_WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": PARAMETERS,
}
QUESTION = "What is the weather in Paris?"
CAPITAL = "What is the capital of France? One word."  # SmolLM2 ends its answer on its own, well within 48 tokens


def smol_server(tmp: Path) -> UvicornThread:
    cfg = smol_config(tmp, threshold=0.5, verifiers=ESCALATE_ON_MARK)
    return UvicornThread(create_app(load_settings(cfg), registry=registry()))


def tools_server(tmp: Path) -> UvicornThread:
    cfg = smol_config(tmp, threshold=0.5, verifiers=TOOL_CALL_VERIFIER)
    backends = {"small": ToolScript("small", BAD_CALL), "large": ToolScript("large", GOOD_CALL)}
    return UvicornThread(create_app(load_settings(cfg), backends=backends))


def ledger_of(srv: UvicornThread) -> Path:
    """The SQLite ledger a served router writes."""
    return Path(srv.server.config.app.state.services.settings.ledger.path)  # type: ignore[attr-defined]


def assert_no_pending(ledger: Path, wait_s: float = 10.0) -> None:
    """No request is left pending in the ledger (waiting up to `wait_s` for rows being settled)."""
    deadline = time.monotonic() + wait_s
    while True:
        store = SQLiteStore(ledger, read_only=True)
        store.open()
        try:
            left = [p.request_id for p in store.pending()]
        finally:
            store.close()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert left == [], f"requests left pending: {left}"


def openai_error(r: httpx.Response) -> dict[str, Any]:
    """The error of an OpenAI-shaped refusal (asserting its shape)."""
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    return body["error"]  # type: ignore[no-any-return]


def anthropic_error(r: httpx.Response) -> dict[str, Any]:
    """The error of an Anthropic-shaped refusal (asserting its shape)."""
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]  # type: ignore[no-any-return]


def named_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """A named-event SSE body as (event, data) pairs."""
    out = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out
