"""The body guard (router.api.app.BodyLimit) reads a key as the routes read it, and a key it
cannot check for load is a 503, never a request that loses its body.

Found by the outside review of issue 38's fixes: the guard, which parses a body only for a caller
with a valid key, read only `Authorization`, so an Anthropic client's `x-api-key` had its body
withheld on a server with keys; and when the key scan had no slot, a valid key's request reached
the route with no body (a 400 "no body") instead of the 503 the route would have given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from router.api.app import BodyLimit
from router.errors import OverloadedError
from tests.support.accounting import keys_section, running
from tests.support.cache import Counting
from tests.support.config import write_config
from tests.support.model import SMOL


def keyed_config(tmp: Path) -> tuple[Path, dict[str, str]]:
    body, raw = keys_section({"ana": {}})
    text = (
        f'[server]\n{body}\n[ledger]\npath = "{tmp / "ledger.sqlite3"}"\n'
        '[[tiers]]\nname = "small"\nbackend = "llamacpp"\nmax_tokens = 64\n'
        f'[tiers.llamacpp]\nmodel = "{SMOL}"\n'
        "[tiers.price]\nusd_per_1m_input_tokens = 0.60\nusd_per_1m_output_tokens = 2.40\n"
    )
    return write_config(tmp / "config.toml", text), raw


async def test_an_x_api_key_request_keeps_its_body_on_a_server_with_keys(tmp_path: Path) -> None:
    cfg, raw = keyed_config(tmp_path)
    message = {"model": "small", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}
    async with running(cfg, backends={"small": Counting("small")}) as client:
        anthropic_style = await client.post("/v1/messages", json=message, headers={"x-api-key": raw["ana"]})
        wrong = await client.post("/v1/messages", json=message, headers={"x-api-key": "trk-not-a-key"})
        chat = {k: v for k, v in message.items()}
        bearer = await client.post("/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {raw['ana']}"})
    assert anthropic_style.status_code == 200, anthropic_style.text
    assert anthropic_style.json()["content"][0]["text"] == "answer 1 here"
    assert wrong.status_code == 401 and wrong.json()["type"] == "error"  # Anthropic's shape on its surface
    assert bearer.status_code == 200, bearer.text


async def test_a_key_the_guard_cannot_check_for_load_is_a_503_not_a_request_without_its_body() -> None:
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:  # what a route would get
        seen.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def overloaded(_: str | None) -> None:
        raise OverloadedError("every key-scan slot is busy", retry_after=1.0)

    guard = BodyLimit(app, max_bytes=1_000_000, authenticate=overloaded)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guard), base_url="http://localhost") as client:
        r = await client.post("/v1/chat/completions", json={"model": "auto"}, headers={"Authorization": "Bearer k"})
    assert r.status_code == 503 and r.headers.get("retry-after") == "1", r.text
    assert r.json()["error"]["type"] != "invalid_request_error" and seen == []
