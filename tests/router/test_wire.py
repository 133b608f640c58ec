"""What admission prices is what the openai backend sends: one serialiser (`router.wire`) for
both, held to each other here on every message shape a chat history can hold. Before, the
reservation wrote an answer of calls alone with `"content": ""` while the backend sent `null`,
so the bytes priced were not the bytes sent."""

from __future__ import annotations

import json

from router.backends.openai.call import Call, request_params
from router.generation import GenerationRequest, Message, ToolCall, ToolSpec
from router.wire import sent_bytes, sent_json

CALL = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
SHAPES = [
    Message("system", "Be brief."),
    Message("user", "What is the weather in Paris? ü 雨 🌧"),
    Message("assistant", "", (CALL,)),  # calls alone: content null, as OpenAI sends it
    Message("assistant", "Let me look.", (CALL, ToolCall("call_2", "get_time", "{}"))),
    Message("tool", '{"temp": 21}', tool_call_id="call_1"),
    Message("tool", "", tool_call_id="call_2"),
    Message("assistant", "It is 21 C."),
]
TOOL = ToolSpec(
    "get_weather", "The weather.", json.dumps({"type": "object", "properties": {"city": {"type": "string"}}})
)


def test_the_messages_priced_are_the_messages_sent() -> None:
    request = GenerationRequest(messages=tuple(SHAPES), tools=(TOOL,), max_tokens=16)
    call = Call(request=request, deadline=1e12, started=0.0, max_tokens=16, hosted_prompt_tokens=0)
    sent = request_params(call, model="m", refused=set(), stream=False)
    priced = json.loads(sent_json(request))
    assert priced["messages"] == sent["messages"]
    assert [m["content"] for m in sent["messages"]][2] is None
    assert priced["tools"] == sent["tools"]
    # and the bound covers every byte of them, as the server receives them
    assert sent_bytes(request) >= len(json.dumps(sent["messages"], ensure_ascii=False).encode())


def test_each_shape_alone_too() -> None:
    for m in SHAPES:
        request = GenerationRequest(messages=(m,), max_tokens=4)
        call = Call(request=request, deadline=1e12, started=0.0, max_tokens=4, hosted_prompt_tokens=0)
        assert (
            json.loads(sent_json(request))["messages"]
            == request_params(call, model="m", refused=set(), stream=True)["messages"]
        ), m
