"""Tool calls through the `openai` backend: tools, tool_choice, parallel_tool_calls and the
history's tool turns passed through as OpenAI's API spells them; the upstream's `tool_calls` read
back, streamed and not, as hostile input (wrong types refused as malformed, ids and counts clamped).
The scripted upstream proves the shapes; llama-cpp-python's own server proves a real one agrees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from router.backends.openai import OpenAIBackend
from router.config import OpenAIBackendSettings
from router.errors import UpstreamError
from router.generation import GenerationRequest, Message, NamedTool, ToolCall, ToolSpec
from router.structured.tools import MAX_CALLS
from tests.support.fault_upstream import FaultUpstream, chat_chunk, raw, sse
from tests.support.openai_backend import backend_for, collect
from tests.support.servers import llama_cpp_server

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = ToolSpec("get_weather", "The weather in a city", json.dumps(SCHEMA))
HISTORY = (
    Message("user", "Weather in Paris?"),
    Message("assistant", "", (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
    Message("tool", "21 C", tool_call_id="call_1"),
    Message("user", "And in Oslo?"),
)
REQUEST = GenerationRequest(messages=HISTORY, tools=(WEATHER,), max_tokens=32)


def body(message: dict[str, Any], finish: str = "tool_calls") -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    return json.dumps(
        {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}
    ).encode()


def upstream_call(
    call_id: Any = "call_up", name: Any = "get_weather", arguments: Any = '{"city": "Oslo"}'
) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


async def test_tools_and_tool_turns_are_passed_through(upstream: FaultUpstream) -> None:
    upstream.script(raw(200, body({"content": None, "tool_calls": [upstream_call()]})))
    request = REQUEST.with_(tool_choice=NamedTool("get_weather"), parallel_tool_calls=False)
    async with backend_for(upstream) as backend:
        gen = await backend.generate(request)
    sent = upstream.requests[0].body
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "The weather in a city", "parameters": SCHEMA},
        }
    ]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["parallel_tool_calls"] is False
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    }
    assert sent["messages"][2] == {"role": "tool", "content": "21 C", "tool_call_id": "call_1"}
    assert gen.tool_calls == (ToolCall("call_up", "get_weather", '{"city": "Oslo"}'),) and gen.text == ""


async def test_plain_requests_send_no_tool_parameters(upstream: FaultUpstream) -> None:
    upstream.script(raw(200, body({"content": "hi", "tool_calls": [upstream_call()]}, "stop")))
    async with backend_for(upstream) as backend:
        gen = await backend.generate(GenerationRequest(messages=(Message("user", "hi"),)))
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(upstream.requests[0].body)
    assert gen.tool_calls is None and gen.text == "hi"  # calls nobody offered are not read


async def test_streamed_calls_are_assembled_by_index(upstream: FaultUpstream) -> None:
    def piece(**tool_call: Any) -> dict[str, Any]:
        return chat_chunk(None, delta={"tool_calls": [tool_call]})

    upstream.script(
        sse(
            chat_chunk(None, delta={"role": "assistant", "content": None}),
            piece(index=0, id="call_a", type="function", function={"name": "get_weather", "arguments": ""}),
            piece(index=0, function={"arguments": '{"ci'}),
            piece(index=0, function={"arguments": 'ty": "Oslo"}'}),
            piece(
                index=1, id="call_b", type="function", function={"name": "get_weather", "arguments": '{"city": "Rome"}'}
            ),
            chat_chunk(None, finish="tool_calls"),
        )
    )
    async with backend_for(upstream) as backend:
        pieces, gen = await collect(backend, REQUEST)
    assert pieces == [] and gen.text == ""
    assert gen.tool_calls == (
        ToolCall("call_a", "get_weather", '{"city": "Oslo"}'),
        ToolCall("call_b", "get_weather", '{"city": "Rome"}'),
    )


async def test_upstream_calls_are_clamped(upstream: FaultUpstream) -> None:
    calls = [upstream_call(call_id=f"c{i}") for i in range(MAX_CALLS + 50)]
    calls[0] = upstream_call(call_id="x" * 1000, name="n" * 5000, arguments={"city": "Oslo"})
    calls[1] = upstream_call(call_id=None)
    upstream.script(raw(200, body({"content": None, "tool_calls": calls})))
    async with backend_for(upstream) as backend:
        gen = await backend.generate(REQUEST)
    assert gen.tool_calls is not None and len(gen.tool_calls) == MAX_CALLS
    first, second = gen.tool_calls[:2]
    assert first.id.startswith("call_") and len(first.id) < 64 and len(first.name) == 256
    assert json.loads(first.arguments) == {"city": "Oslo"}  # an object, as some servers send: made JSON text
    assert second.id.startswith("call_")


@pytest.mark.parametrize(
    "tool_calls",
    [
        "get_weather",
        [1],
        [{"id": "c", "type": "function"}],
        [upstream_call(name=7)],
        [upstream_call(arguments=[1, 2])],
    ],
    ids=["a string", "a number", "no function", "name a number", "arguments a list"],
)
async def test_malformed_calls_are_an_upstream_failure(upstream: FaultUpstream, tool_calls: Any) -> None:
    bad = raw(200, body({"content": None, "tool_calls": tool_calls}))
    upstream.script(bad, bad, bad)
    async with backend_for(upstream) as backend:
        with pytest.raises(UpstreamError):
            await backend.generate(REQUEST)
    assert len(upstream.requests) == 3  # retried like any malformed answer


async def test_a_stream_of_endless_call_fragments_is_stopped(upstream: FaultUpstream) -> None:
    fragment = chat_chunk(None, delta={"tool_calls": [{"index": 0, "function": {"arguments": "x"}}]})
    upstream.script(sse(*([fragment] * 500), chat_chunk(None, finish="tool_calls")))
    async with backend_for(upstream, max_attempts=1) as backend:
        with pytest.raises(UpstreamError):
            await collect(backend, REQUEST.with_(max_tokens=8))


@pytest.mark.slow
async def test_a_real_server_answers_a_named_tool_choice_with_a_call(smol_path: Path) -> None:
    """llama-cpp-python's server constrains a named tool_choice with a grammar and returns
    `tool_calls`: what it sends is read into calls that parse and name the function."""
    with llama_cpp_server(smol_path) as url:
        backend = OpenAIBackend(
            "large", OpenAIBackendSettings(base_url=url, model="smol", max_attempts=1), timeout_s=120
        )
        await backend.start()
        try:
            request = GenerationRequest(
                messages=(Message("user", "What is the weather in Paris?"),),
                tools=(WEATHER,),
                tool_choice=NamedTool("get_weather"),
                max_tokens=48,
            )
            gen = await backend.generate(request)
            _, streamed = await collect(backend, request)
        finally:
            await backend.close()
    for g in (gen, streamed):
        assert g.tool_calls, g
        assert g.tool_calls[0].name == "get_weather"
        assert isinstance(json.loads(g.tool_calls[0].arguments), dict)
