"""Hostile bodies on /v1/responses and /v1/messages: each gets a 4xx in its surface's error shape
naming what is wrong (OpenAI's `param`; Anthropic's message), never a 5xx or a hang; a client that
drops a stream midway still leaves its ledger row; and afterwards the service answers and its
ledger has no partial or pending request."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.support.accounting import assert_no_partial_requests, read_ledger
from tests.support.servers import UvicornThread
from tests.support.surfaces import (
    ANTHROPIC_WEATHER,
    QUESTION,
    RESPONSES_WEATHER,
    anthropic_error,
    assert_no_pending,
    ledger_of,
    named_events,
    openai_error,
)

DEEP_JSON = b'{"model": "auto", "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
BAD_UTF8 = (
    b'{"model": "auto", "input": "caf\xe9", "max_tokens": 8, "messages": [{"role": "user", "content": "caf\xe9"}]}'
)
COSTLY = {"type": "object", "properties": {"x": {"enum": [f"ab{i}" for i in range(300)]}}, "required": ["x"]}


def nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def raw_nest(depth: int) -> str:
    """A JSON object nested `depth` levels deep, as text: deeper than the JSON encoder can walk."""
    return '{"a":' * depth + "1" + "}" * depth


def calls(n: int) -> list[dict[str, Any]]:
    """One assistant turn of `n` function calls and their outputs, as Responses items."""
    made = [{"type": "function_call", "call_id": f"c{i}", "name": "get_weather", "arguments": "{}"} for i in range(n)]
    return made + [{"type": "function_call_output", "call_id": f"c{i}", "output": "21 C"} for i in range(n)]


def tool_uses(n: int) -> list[dict[str, Any]]:
    """A Messages conversation whose assistant turn makes `n` tool_use blocks, and their results."""
    uses = [{"type": "tool_use", "id": f"c{i}", "name": "get_weather", "input": {}} for i in range(n)]
    results = [{"type": "tool_result", "tool_use_id": f"c{i}", "content": "21 C"} for i in range(n)]
    return [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": uses}, user(*results)]


def resp(**extra: Any) -> dict[str, Any]:
    return {"model": "auto", "input": QUESTION, "max_output_tokens": 16, **extra}


def msg(**extra: Any) -> dict[str, Any]:
    return {"model": "auto", "max_tokens": 16, "messages": [{"role": "user", "content": QUESTION}], **extra}


def user(*blocks: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


# (body, the param named); a body given as bytes is sent as it is
RESPONSES: list[tuple[Any, str | None]] = [
    (resp(input=5), "input"),
    (resp(max_output_tokens="10"), "max_output_tokens"),
    (resp(stream="yes"), "stream"),
    (resp(input=[{"role": "user", "content": 5}]), "input.0.content"),
    (resp(input=[{"role": "narrator", "content": "hi"}]), "input.0.role"),
    (resp(input=["hi"]), "input.0"),
    (resp(input=[{"type": "reasoning", "summary": []}]), "input.0.type"),
    (resp(input=[{"type": "item_reference", "id": "msg_1"}]), "input.0.type"),
    (
        resp(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]),
        "input.0.content.0.type",
    ),
    (resp(input=[{"role": "user", "content": [[[[["deep"]]]]]}]), "input.0.content.0"),
    (resp(input=[{"role": "user", "content": "hi"}] * 3000), "input"),
    (resp(input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}]), "input.0.call_id"),
    (resp(input=[{"type": "function_call", "call_id": "c", "name": "bad name!", "arguments": "{}"}]), "input.0.name"),
    (resp(tools=[{"type": "web_search"}]), "tools.0.type"),
    (resp(tools=[{**RESPONSES_WEATHER, "parameters": "x"}]), "tools.0.parameters"),
    (resp(tools=[{**RESPONSES_WEATHER, "parameters": nested_schema(40)}]), "tools.0.parameters"),
    (resp(tools=[{**RESPONSES_WEATHER, "parameters": COSTLY}]), "tools.0.parameters"),
    (resp(tools=[RESPONSES_WEATHER] * 200), "tools"),
    (resp(tools=[RESPONSES_WEATHER], tool_choice={"type": "allowed_tools", "tools": []}), "tool_choice"),
    (resp(tools=[RESPONSES_WEATHER], tool_choice={"type": "function", "name": "other"}), "tool_choice"),
    (resp(text={"format": {"type": "json_schema", "schema": {"type": "object"}}}), "text.format.name"),
    (resp(text={"format": {"type": "json_schema", "name": "x"}}), "text.format.schema"),  # OpenAI requires it
    (resp(text={"format": {"type": "json_schema", "name": "x", "schema": nested_schema(40)}}), "text.format.schema"),
    (resp(input=[{"role": "user", "content": QUESTION}, *calls(129)]), "input.129"),  # chat's 128 calls a message
    (resp(input=[{"role": "user", "content": [{"type": "input_text", "text": "a"}] * 257}]), "input.0.content"),
    (resp(store=True), "store"),
    (resp(previous_response_id="resp_1"), "previous_response_id"),
    (resp(background=True), "background"),
    (resp(include=["reasoning.encrypted_content"]), "include"),
    (resp(reasoning={"effort": "high"}), "reasoning"),
    (resp(model="nope"), "model"),
    (DEEP_JSON, None),
    (BAD_UTF8, None),
]
MESSAGES: list[tuple[Any, str | None]] = [
    ({"model": "auto", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    (msg(max_tokens="10"), "max_tokens"),
    (msg(messages="hi"), "messages"),
    (msg(system=5), "system"),
    (msg(messages=[{"role": "system", "content": "hi"}]), "messages.0.role"),
    (
        msg(messages=[user({"type": "image", "source": {"type": "base64", "data": "AA=="}})]),
        "messages.0.content.0.type",
    ),
    (msg(messages=[user({"type": "document", "source": {}})]), "messages.0.content.0.type"),
    (msg(messages=[user({"type": "hologram"})]), "messages.0.content.0.type"),
    (msg(messages=[user([[[["deep"]]]])]), "messages.0.content.0"),
    (
        msg(messages=[user({"type": "tool_result", "tool_use_id": "nope", "content": "x"})]),
        "messages.0.content.0.tool_use_id",
    ),
    (
        msg(messages=[user({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]})]),
        "messages.0.content.0.content.0.type",
    ),
    (
        msg(messages=[{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]),
        "messages.0.content.0.type",
    ),
    (msg(messages=[{"role": "user", "content": "hi"}] * 3000), "messages"),
    (msg(messages=tool_uses(129)), "messages.1.content"),
    (msg(messages=[user(*[{"type": "text", "text": "a"}] * 257)]), "messages.0.content"),
    (
        msg(output_config={"format": {"type": "json_schema", "schema": nested_schema(40)}}),
        "output_config.format.schema",
    ),
    (msg(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools.0.type"),
    (msg(tools=[{**ANTHROPIC_WEATHER, "input_schema": nested_schema(40)}]), "tools.0.input_schema"),
    (msg(tools=[{**ANTHROPIC_WEATHER, "input_schema": COSTLY, "strict": True}]), "tools.0.input_schema"),
    (msg(tools=[ANTHROPIC_WEATHER], tool_choice={"type": "tool"}), "tool_choice.name"),
    (msg(stop_sequences=["a"] * 5), "stop_sequences"),
    (msg(thinking={"type": "enabled", "budget_tokens": 1024}), "thinking"),
    (msg(top_k=5), "top_k"),
    (msg(temperature=1.5), "temperature"),
    (msg(model="nope"), "model"),
    (DEEP_JSON, None),
    (BAD_UTF8, None),
]


def post(srv: UvicornThread, path: str, body: Any, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else None
    data = None if isinstance(body, bytes) else body
    h = {"content-type": "application/json", **headers}
    return httpx.post(f"{srv.url}{path}", content=content, json=data, headers=h, timeout=30)


@pytest.mark.parametrize(("body", "param"), RESPONSES, ids=[f"responses-{i}" for i in range(len(RESPONSES))])
def test_responses_refuses_in_openai_shape(tools: UvicornThread, body: Any, param: str | None) -> None:
    r = post(tools, "/v1/responses", body)
    assert 400 <= r.status_code < 500, r.text
    assert openai_error(r)["param"] == param, r.text


@pytest.mark.parametrize(("body", "param"), MESSAGES, ids=[f"messages-{i}" for i in range(len(MESSAGES))])
def test_messages_refuses_in_anthropic_shape(tools: UvicornThread, body: Any, param: str | None) -> None:
    r = post(tools, "/v1/messages", body)
    assert 400 <= r.status_code < 500, r.text
    error = anthropic_error(r)
    assert error["type"] in ("invalid_request_error", "not_found_error")
    assert param is None or param in error["message"], r.text


def test_two_different_keys_are_refused(tools: UvicornThread) -> None:
    r = post(tools, "/v1/messages", msg(), authorization="Bearer one", **{"x-api-key": "two"})
    assert r.status_code == 401 and anthropic_error(r)["type"] == "authentication_error"


def test_dropped_streams_keep_their_ledger_rows(tools: UvicornThread) -> None:
    """The client reads the stream's first event and hangs up; each request still settles into
    one whole ledger row, and nothing is left pending."""
    ids = []
    for path, body in (("/v1/responses", resp(stream=True)), ("/v1/messages", msg(stream=True))):
        with httpx.stream("POST", f"{tools.url}{path}", json=body, timeout=30) as r:
            assert r.status_code == 200
            first = next(r.iter_text())
        (_, data), *_ = named_events(first)
        ids.append(data["response"]["id"] if path == "/v1/responses" else data["message"]["id"])
    ledger = ledger_of(tools)
    deadline = time.monotonic() + 20
    while not set(ids) <= set(read_ledger(ledger)) and time.monotonic() < deadline:
        time.sleep(0.1)
    rows = read_ledger(ledger)
    assert {rows[i].surface for i in ids} == {"responses", "messages"}
    assert_no_partial_requests(ledger)
    assert_no_pending(ledger)
    assert httpx.get(f"{tools.url}/healthz", timeout=5).status_code == 200


def test_the_openapi_schema_has_both_routes_and_their_errors(tools: UvicornThread) -> None:
    paths = httpx.get(f"{tools.url}/openapi.json", timeout=10).json()["paths"]
    for path, error in (("/v1/responses", "OpenAIError"), ("/v1/messages", "AnthropicError")):
        responses = paths[path]["post"]["responses"]
        assert {"200", "400", "401", "429"} <= set(responses)
        assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith(error)
    assert "/v1/messages/count_tokens" in paths


def test_one_turn_of_128_calls_is_served_and_129_refused_on_count_tokens_too(tools: UvicornThread) -> None:
    """Chat's bound on an assistant message's calls holds on each surface's own words for them,
    count_tokens included: 128 are read, 129 are a 400 naming the turn's content (not a 500)."""
    body = {"model": "auto", "messages": tool_uses(128)}
    assert post(tools, "/v1/messages/count_tokens", body).status_code == 200
    r = post(tools, "/v1/messages/count_tokens", {**body, "messages": tool_uses(129)})
    assert r.status_code == 400 and "messages.1.content" in anthropic_error(r)["message"], r.text
    assert "at most 128 tool_use blocks" in anthropic_error(r)["message"]
    r = post(tools, "/v1/responses", resp(input=[{"role": "user", "content": QUESTION}, *calls(128)]))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        (
            "/v1/chat/completions",
            {"model": "auto", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 257}]},
            "at most 256 content parts",
        ),
        (
            "/v1/responses",
            resp(input=[{"role": "user", "content": [{"type": "input_text", "text": "a"}] * 257}]),
            "at most 256 content parts",
        ),
        ("/v1/messages", msg(messages=[user(*[{"type": "text", "text": "a"}] * 257)]), "at most 256 content blocks"),
        ("/v1/messages", msg(system=[{"type": "text", "text": "a"}] * 257), "at most 256 system blocks"),
    ],
    ids=["chat", "responses", "messages", "messages-system"],
)
def test_too_many_content_parts_are_refused_by_their_bound(
    tools: UvicornThread, path: str, body: dict[str, Any], named: str
) -> None:
    """A string-or-list content field over its bound says the bound, not that it is no string."""
    r = post(tools, path, body)
    assert r.status_code == 400 and named in r.text and "valid string" not in r.text, r.text


DEEP_SCHEMAS = {  # a surface's structured-output schema, as raw JSON nested `depth` levels
    "/v1/chat/completions": (
        '{"model":"auto","max_tokens":4,"messages":[{"role":"user","content":"q"}],'
        '"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":%s}}}',
        "response_format.json_schema.schema",
    ),
    "/v1/responses": (
        '{"model":"auto","max_output_tokens":4,"input":"q","text":{"format":{"type":"json_schema","name":"x","schema":%s}}}',
        "text.format.schema",
    ),
    "/v1/messages": (
        '{"model":"auto","max_tokens":4,"messages":[{"role":"user","content":"q"}],'
        '"output_config":{"format":{"type":"json_schema","schema":%s}}}',
        "output_config.format.schema",
    ),
}


@pytest.mark.parametrize("path", list(DEEP_SCHEMAS))
def test_deeply_nested_schemas_are_refused_never_a_500(tools: UvicornThread, path: str) -> None:
    """A schema nested past the depth bound is refused as it is read, at any depth: the review
    found a 500 (RecursionError in the schema's encoding) at 956-963 levels, before the bound."""
    template, param = DEEP_SCHEMAS[path]
    for depth in (25, 33, 500, *range(950, 971), 2000, 5000):
        r = post(tools, path, (template % raw_nest(depth)).encode())
        assert r.status_code == 400, (depth, r.text[:300])
        # the grammar's tighter bound speaks first at 25; past what the JSON parser reads (~960 levels
        # in a thread of this process, more in a served one), the body is refused as unparseable
        named = param in r.text or "nest" in r.text or "parsing the body" in r.text
        assert named, (depth, r.text[:300])


LEFT_RECURSIVE = {  # llama.cpp refuses its grammar: the $ref loops back before any text
    "type": "object",
    "properties": {"a": {"$ref": "#/$defs/x"}},
    "required": ["a"],
    "$defs": {"x": {"anyOf": [{"$ref": "#/$defs/x"}, {"type": "string"}]}},
}
FORCED_CALLS = {  # a strict function of that schema, a call forced: the surface's name for its schema
    "/v1/chat/completions": (
        {
            "model": "auto",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "call f"}],
            "tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": LEFT_RECURSIVE}}],
            "tool_choice": "required",
        },
        "tools.0.function.parameters",
    ),
    "/v1/responses": (
        resp(tools=[{"type": "function", "name": "f", "parameters": LEFT_RECURSIVE}], tool_choice="required"),
        "tools.0.parameters",
    ),
    "/v1/messages": (
        msg(tools=[{"name": "f", "strict": True, "input_schema": LEFT_RECURSIVE}], tool_choice={"type": "any"}),
        "tools.0.input_schema",
    ),
}


@pytest.mark.parametrize("path", list(FORCED_CALLS))
def test_a_tool_schema_the_local_grammar_refuses_is_named_as_the_tool(smol: UvicornThread, path: str) -> None:
    """The refusal names the function's schema in the surface's words, not the response format
    the request never sent (the review found text.format / output_config.format named)."""
    body, named = FORCED_CALLS[path]
    r = post(smol, path, body)
    assert r.status_code == 400 and "left recursion" in r.text, r.text
    if path == "/v1/messages":
        assert anthropic_error(r)["message"].startswith(f"{named}:"), r.text
    else:
        assert openai_error(r)["param"] == named, r.text
