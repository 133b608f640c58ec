"""A Responses or Messages request is priced as its chat twin: the same worst case reserved, so a
key's budget refuses it before generation exactly when it refuses the chat request, with the same
words, for plain requests, requests with tools and long tool histories alike.

Each request is written three ways by hand (chat, Responses, Messages), not derived from one
another. The worst cases are compared in process; then a served router in front of an upstream
that bills what a request's shape lets it bill (tests/support/budget.py) is given keys whose
budget is just under, or just over, that worst case: under it all three are refused with 429
before the upstream hears of them; over it each is served."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.admission.accounting import worst_case_usd
from router.api.app import create_app
from router.api.requests import ChatCompletionRequest
from router.api.surfaces.messages_protocol import MessagesRequest
from router.api.surfaces.responses_protocol import ResponsesRequest
from router.config import load_settings
from tests.support.accounting import auth
from tests.support.budget import billing, budget_config, remote_tier
from tests.support.fault_upstream import FaultUpstream
from tests.support.servers import UvicornThread
from tests.support.surfaces import ANTHROPIC_WEATHER, PARAMETERS, QUESTION, RESPONSES_WEATHER

SYSTEM = "You answer questions about the weather."
ARGS = '{"city":"Paris"}'
TURNS = 40  # calls and results in the long history
CHAT_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": RESPONSES_WEATHER["description"], "parameters": PARAMETERS},
}
STRICT_CHAT_TOOL = {"type": "function", "function": {**CHAT_TOOL["function"], "strict": True}}


def shapes() -> dict[str, dict[str, dict[str, Any]]]:
    """Per shape, the request as chat, Responses and Messages write it."""
    chat_history: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    items: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    turns: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for i in range(TURNS):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}
        chat_history += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "21 C"},
        ]
        items += [
            {"type": "function_call", "call_id": f"call_{i}", "name": "get_weather", "arguments": ARGS},
            {"type": "function_call_output", "call_id": f"call_{i}", "output": "21 C"},
        ]
        use = {"type": "tool_use", "id": f"call_{i}", "name": "get_weather", "input": {"city": "Paris"}}
        turns += [
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"call_{i}", "content": "21 C"}]},
        ]
    system = [{"role": "system", "content": SYSTEM}]
    base = {"model": "large"}
    chat = {**base, "max_tokens": 64}
    responses = {**base, "instructions": SYSTEM, "max_output_tokens": 64}
    messages = {**base, "system": SYSTEM, "max_tokens": 64}
    strict_anthropic = {**ANTHROPIC_WEATHER, "strict": True}
    return {
        "plain": {
            "chat": {**chat, "messages": [*system, {"role": "user", "content": QUESTION}]},
            "responses": {**responses, "input": QUESTION},
            "messages": {**messages, "messages": [{"role": "user", "content": QUESTION}]},
        },
        "tools": {
            "chat": {**chat, "messages": [*system, {"role": "user", "content": QUESTION}], "tools": [STRICT_CHAT_TOOL]},
            "responses": {**responses, "input": QUESTION, "tools": [RESPONSES_WEATHER]},
            "messages": {**messages, "messages": [{"role": "user", "content": QUESTION}], "tools": [strict_anthropic]},
        },
        "history": {
            "chat": {**chat, "messages": [*system, *chat_history], "tools": [STRICT_CHAT_TOOL]},
            "responses": {**responses, "input": items, "tools": [RESPONSES_WEATHER]},
            "messages": {**messages, "messages": turns, "tools": [strict_anthropic]},
        },
    }


PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
READERS = {"chat": ChatCompletionRequest, "responses": ResponsesRequest, "messages": MessagesRequest}


def worst_cases(tmp: Path, upstream: FaultUpstream) -> dict[str, dict[str, float]]:
    """Each request's reservation, as admission prices it (the surfaces through their twin)."""
    tmp.mkdir()
    cfg, _ = budget_config(tmp, {"probe": {}}, remote_tier("large", upstream.base_url))
    services = create_app(load_settings(cfg)).state.services
    plan = services.engine.cascade.plan("large")
    default_max = max(t.settings.max_tokens for t in plan)
    found: dict[str, dict[str, float]] = {}
    for shape, bodies in shapes().items():
        for surface, body in bodies.items():
            read = READERS[surface].model_validate(body)
            chat = read if isinstance(read, ChatCompletionRequest) else read.to_chat()[0]
            request = chat.to_generation(default_max)
            found.setdefault(shape, {})[surface] = worst_case_usd(plan, request, tiers=services.accounting.tiers)
    return found


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    with FaultUpstream() as server:
        server.default = billing("realistic", delay_s=0.0)
        yield server


@pytest.mark.slow  # a served router and a dozen requests through it: seconds, not the fast loop's
def test_each_surface_is_reserved_and_refused_as_its_chat_twin(tmp_path: Path, upstream: FaultUpstream) -> None:
    worst = worst_cases(tmp_path / "probe", upstream)
    for shape, by_surface in worst.items():
        assert by_surface["responses"] == by_surface["chat"] == by_surface["messages"], (shape, by_surface)
    keys: dict[str, dict[str, Any]] = {}
    for shape, by_surface in worst.items():
        keys[f"under-{shape}"] = {"usd_per_day": by_surface["chat"] * (1 - 1e-9)}
        for surface in PATHS:
            keys[f"over-{shape}-{surface}"] = {"usd_per_day": by_surface["chat"] * (1 + 1e-6)}
    tmp_path.joinpath("served").mkdir()
    cfg, raw = budget_config(tmp_path / "served", keys, remote_tier("large", upstream.base_url))
    with UvicornThread(create_app(load_settings(cfg))) as srv:

        async def send(key: str, surface: str, body: dict[str, Any]) -> httpx.Response:
            async with httpx.AsyncClient(base_url=srv.url, headers=auth(raw[key]), timeout=60) as c:
                return await c.post(PATHS[surface], json=body)

        async def run() -> None:
            for shape, bodies in shapes().items():
                heard = len(upstream.requests)
                refused = {s: await send(f"under-{shape}", s, b) for s, b in bodies.items()}
                assert len(upstream.requests) == heard, "a refused request reached the upstream"
                assert {s: r.status_code for s, r in refused.items()} == dict.fromkeys(PATHS, 429), shape
                chat, responses = refused["chat"].json()["error"], refused["responses"].json()["error"]
                anthropic = refused["messages"].json()
                assert responses == chat and chat["code"] == "insufficient_quota"
                assert anthropic == {"type": "error", "error": {"type": "rate_limit_error", "message": chat["message"]}}
                assert len({r.headers.get("x-tierroute-limit") for r in refused.values()}) == 1
                for surface, body in bodies.items():
                    served = await send(f"over-{shape}-{surface}", surface, body)
                    assert served.status_code == 200, (shape, surface, served.text)

        asyncio.run(run())
