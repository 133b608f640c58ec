"""Tool calls through the HTTP app, as the official `openai` client sends and reads them.

The protocol (a call, the client's `tool` message, the answer; streamed and not; a bad call
escalated) runs against scripted backends that answer as a local model using tools does, because
the 135M test model does not call functions on its own; the real test model runs the same path
where it must fail the tool check (tool_choice `required`) and escalate. Hostile tool fields get
a 400 in OpenAI's error shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from router.api.app import create_app
from router.backends.base import Backend
from router.config import load_settings
from tests.support.config import smol_config
from tests.support.servers import UvicornThread
from tests.support.tool_script import BAD_CALL, GOOD_CALL, TOOL_CALL_VERIFIER, WEATHER, ToolScript


def serve(tmp: Path, small: Backend | None, large: Backend | None) -> UvicornThread:
    cfg = smol_config(tmp, threshold=0.5, verifiers=TOOL_CALL_VERIFIER)
    backends = {name: b for name, b in (("small", small), ("large", large)) if b is not None}
    return UvicornThread(create_app(load_settings(cfg), backends=backends))


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[UvicornThread]:
    # the small tier calls a function that does not exist; the large one calls it right
    tmp = tmp_path_factory.mktemp("tools")
    with serve(tmp, ToolScript("small", BAD_CALL), ToolScript("large", GOOD_CALL)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(scripted: UvicornThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{scripted.url}/v1", api_key="unused", max_retries=0)


def first_turn() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "What is the weather in Paris?"}]


def test_round_trip(client: openai.OpenAI) -> None:
    messages = first_turn()
    r = client.chat.completions.create(model="auto", messages=messages, tools=[WEATHER])  # type: ignore[arg-type]
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    ext = r.model_extra["tierroute"]  # type: ignore[index]
    small, large = ext["attempts"]
    assert (small["tool_check"], small["accepted"]) == (False, False) and "get_wether" in small["reason"]
    assert (ext["tier"], ext["escalated"]) == ("large", True)
    # the client runs the function and sends the result back
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "21 C"})
    r = client.chat.completions.create(model="auto", messages=messages, tools=[WEATHER])  # type: ignore[arg-type]
    assert r.choices[0].message.content == "It is 21 C in Paris."
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    # text, as tool_choice auto allows: the tool check abstains (the tier's other verifiers judge
    # text; here there are none, so the cascade has no evidence and escalates)
    assert all(a["tool_check"] is None for a in r.model_extra["tierroute"]["attempts"])  # type: ignore[index]


def test_streamed_round_trip(client: openai.OpenAI) -> None:
    messages = first_turn()
    chunks = list(client.chat.completions.create(model="auto", messages=messages, tools=[WEATHER], stream=True))  # type: ignore[arg-type]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)  # no tags leak as text
    calls: dict[int, dict[str, str]] = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += d.id or ""
            entry["name"] += (d.function.name if d.function else None) or ""
            entry["arguments"] += (d.function.arguments if d.function else None) or ""
    assert list(calls) == [0] and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"} and calls[0]["id"].startswith("call_")
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert chunks[-1].model_extra["tierroute"]["attempts"][0]["tool_check"] is False  # type: ignore[index]
    call = calls[0]
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "21 C"})
    chunks = list(client.chat.completions.create(model="auto", messages=messages, tools=[WEATHER], stream=True))  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "It is 21 C in Paris."
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_tool_choice_none_shows_no_calls(client: openai.OpenAI) -> None:
    # the scripted tiers write a call whatever they are told; with tool_choice none it is text
    r = client.chat.completions.create(model="large", messages=first_turn(), tools=[WEATHER], tool_choice="none")  # type: ignore[arg-type]
    assert r.choices[0].message.content == GOOD_CALL and r.choices[0].finish_reason == "stop"


def test_parallel_calls_and_their_limit(tmp_path: Path, smol_path: Path) -> None:
    two = GOOD_CALL + "\n" + GOOD_CALL.replace("Paris", "Oslo")
    with serve(tmp_path, ToolScript("small", two), None) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model="small", messages=first_turn(), tools=[WEATHER])  # type: ignore[arg-type]
        calls = r.choices[0].message.tool_calls or []
        assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Oslo"]
        assert len({c.id for c in calls}) == 2
        r = client.chat.completions.create(
            model="small",
            messages=first_turn(),
            tools=[WEATHER],
            parallel_tool_calls=False,  # type: ignore[arg-type]
        )
        assert len(r.choices[0].message.tool_calls or []) == 1


def test_the_test_model_fails_required_and_escalates(tmp_path: Path, smol_path: Path) -> None:
    """The real SmolLM2 with tools rendered by the fallback prompt: it answers in prose, so with
    tool_choice `required` the tool check fails at the small tier, and the last tier's answer is
    returned as what it is (text, finish_reason stop)."""
    with serve(tmp_path, None, None) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
        for stream in (False, True):
            kwargs: dict[str, Any] = {"tools": [WEATHER], "tool_choice": "required", "max_tokens": 16}
            if stream:
                chunks = list(
                    client.chat.completions.create(model="auto", messages=first_turn(), stream=True, **kwargs)
                )  # type: ignore[call-overload]
                ext = chunks[-1].model_extra["tierroute"]
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
                assert len(finish) == 1
            else:
                r = client.chat.completions.create(model="auto", messages=first_turn(), **kwargs)  # type: ignore[call-overload]
                ext, text = r.model_extra["tierroute"], r.choices[0].message.content or ""
                finish = [r.choices[0].finish_reason]
                tool_calls = r.choices[0].message.tool_calls
                assert (finish == ["tool_calls"]) == bool(tool_calls)
            small = ext["attempts"][0]
            if small["tool_check"] is False:  # what this model does: no call
                assert ext["escalated"] and "tool_choice requires" in small["scores"]["tool_call"]["reason"]
            assert text or finish == ["tool_calls"]


# ---- hostile tool fields --------------------------------------------------------------------------


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "large", "messages": first_turn(), "max_tokens": 4, **extra}


def function(name: str = "f", **extra: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **extra}}


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}
HOSTILE = {
    "name with a space": (chat(tools=[function("get weather")]), "tools.0.function.name"),
    "name with a dot": (chat(tools=[function("a.b")]), "tools.0.function.name"),
    "name of 65 characters": (chat(tools=[function("f" * 65)]), "tools.0.function.name"),
    "empty name": (chat(tools=[function("")]), "tools.0.function.name"),
    "no function": (chat(tools=[{"type": "function"}]), "tools.0.function"),
    "tool type custom": (chat(tools=[{"type": "custom", "function": {"name": "f"}}]), "tools.0.type"),
    "parameters not an object": (chat(tools=[function(parameters=[1, 2])]), "tools.0.function.parameters"),
    "schema 33 levels deep": (chat(tools=[function(parameters=nested(33))]), "tools.0.function.parameters"),
    "schema of 70 kB": (
        chat(tools=[function(parameters={"type": "object", "description": "x" * 70_000})]),
        "tools.0.function.parameters",
    ),
    "tools of 600 kB together": (
        chat(tools=[function(f"f{i}", parameters={"description": "x" * 60_000}) for i in range(10)]),
        "tools",
    ),
    "description of 20 kB": (chat(tools=[function(description="x" * 20_000)]), "tools.0.function.description"),
    "129 tools": (chat(tools=[function(f"f{i}") for i in range(129)]), "tools"),
    "strict a string": (chat(tools=[function(strict="yes")]), "tools.0.function.strict"),
    "unknown tool_choice": (chat(tools=[function()], tool_choice="any"), "tool_choice"),
    "tool_choice an unknown function": (
        chat(tools=[function()], tool_choice={"type": "function", "function": {"name": "g"}}),
        "tool_choice",
    ),
    "tool_choice required without tools": (chat(tool_choice="required"), "tool_choice"),
    "parallel_tool_calls a string": (chat(tools=[function()], parallel_tool_calls="no"), "parallel_tool_calls"),
    "tool message without id": (
        chat(messages=[*first_turn(), CALLED, {"role": "tool", "content": "3"}]),
        "messages.2.tool_call_id",
    ),
    "tool message answering no call": (
        chat(messages=[*first_turn(), {"role": "tool", "tool_call_id": "c9", "content": "3"}]),
        "messages.1.tool_call_id",
    ),
    "tool_calls on a user message": (
        chat(messages=[{"role": "user", "content": "x", "tool_calls": CALLED["tool_calls"]}]),
        "messages.0.tool_calls",
    ),
    "call arguments not a string": (
        chat(
            messages=[
                *first_turn(),
                {
                    **CALLED,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}],
                },
            ]
        ),
        "messages.1.tool_calls.0.function.arguments",
    ),
    "call id of 300 characters": (
        chat(
            messages=[
                *first_turn(),
                {
                    **CALLED,
                    "tool_calls": [{"id": "c" * 300, "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
            ]
        ),
        "messages.1.tool_calls.0.id",
    ),
    "tools on /v1/completions": ({"model": "large", "prompt": "x", "tools": [function()]}, "tools"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_tool_fields_get_a_400(scripted: UvicornThread, case: str) -> None:
    body, param = HOSTILE[case]
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    resp = httpx.post(f"{scripted.url}{path}", json=body, timeout=30)
    assert resp.status_code == 400, resp.text[:300]
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def test_a_valid_history_with_tool_turns_is_served(scripted: UvicornThread) -> None:
    body = chat(
        tools=[function()], messages=[*first_turn(), CALLED, {"role": "tool", "tool_call_id": "c1", "content": "3"}]
    )
    assert httpx.post(f"{scripted.url}/v1/chat/completions", json=body, timeout=30).status_code == 200


def test_a_tools_parameters_are_encoded_once_canonical(monkeypatch: pytest.MonkeyPatch) -> None:
    # the size check's compact JSON is the spec's: a request's tools are read on the event loop,
    # and encoding each schema twice was a third of that reading
    from router.api import request_parts

    encoded: list[Any] = []
    real = request_parts.compact_json
    monkeypatch.setattr(request_parts, "compact_json", lambda v: encoded.append(v) or real(v))
    schema = {"type": "object", "required": ["zeta"], "properties": {"zeta": {"type": "string"}, "alpha": {}}}
    tool = request_parts.Tool.model_validate(function(parameters=schema))
    spec = tool.spec()
    assert len(encoded) == 1
    assert spec.parameters_json == json.dumps(schema, separators=(",", ":"), sort_keys=True)
    assert spec.parameters == schema and tool.function.parameters == schema


def test_a_non_strict_tools_schema_is_loosened_once_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    # new_schemas (on the loop, for every request) and the typed request share one loosening
    from router.api import request_parts
    from router.api.requests import ChatCompletionRequest
    from router.structured import grammars

    loosened: list[Any] = []
    real = request_parts.loosened_form
    monkeypatch.setattr(request_parts, "loosened_form", lambda s, p: loosened.append(s) or real(s, p))
    schema = {"type": "object", "properties": {"zeta": {"not": {"type": "null"}}, "alpha": {"type": "integer"}}}
    body = ChatCompletionRequest.model_validate(chat(tools=[function(parameters=schema)]))
    new = body.new_schemas()
    with grammars.pinned([(s, grammars.schema_verdict(s)) for s in new]):
        spec = body.to_generation(64).tools[0]
    assert len(loosened) == 1
    loose = {"type": "object", "properties": {"zeta": {}, "alpha": {"type": "integer"}}}
    assert spec.checked_json == json.dumps(loose, separators=(",", ":"), sort_keys=True)
    assert spec.checked == loose and spec.parameters == schema


def test_the_tools_size_is_counted_as_their_whole_compact_json() -> None:
    # tools_chars counts without encoding the schemas again; it must count what encoding would
    from router.api.request_parts import Tool, compact_json
    from router.api.requests import tools_chars

    odd = {"type": "object", "description": 'é "q" \\ \n \u2028 ☃', "minimum": 1.5e-7, "enum": [1e300, -0.0, 10**30]}
    tools = [
        Tool.model_validate(t).spec()
        for t in (
            function("a"),
            function("b", description="d", strict=True, parameters={"z": 1, "a": {"b": [1, 2]}}),
            function("c", parameters=odd),
        )
    ]
    for specs in ([], tools[:1], tools[1:2], tools):
        assert tools_chars(specs) == len(compact_json([t.to_openai() for t in specs]))
