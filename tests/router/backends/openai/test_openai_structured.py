"""A remote tier is sent `response_format`, `logit_bias` and the penalties as the client gave
them (the scripted upstream records each body it received), on chat and completions, streamed or
not; and its answer is marked as asked-for, not as constrained by us."""

from __future__ import annotations

from router.generation import GenerationRequest, Message, ResponseFormat
from tests.support.fault_upstream import FaultUpstream, ok
from tests.support.openai_backend import backend_for, collect

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer", "minimum": 0}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
SHAPED = {
    "response_format": ResponseFormat("json_schema", SCHEMA, "city", True),
    "logit_bias": ((15, -100.0), (2000, 5.5)),
    "presence_penalty": 0.5,
    "frequency_penalty": -1.25,
}
WIRE = {
    "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}},
    "logit_bias": {"15": -100.0, "2000": 5.5},
    "presence_penalty": 0.5,
    "frequency_penalty": -1.25,
}


async def test_chat_passes_the_parameters_through(upstream: FaultUpstream) -> None:
    upstream.script(ok(), ok())
    request = GenerationRequest(messages=(Message("user", "Largest city?"),), **SHAPED)  # type: ignore[arg-type]
    async with backend_for(upstream) as backend:
        g = await backend.generate(request)
        _, streamed = await collect(backend, request)
    assert len(upstream.requests) == 2
    for received in upstream.requests:
        assert {k: received.body.get(k) for k in WIRE} == WIRE
    assert g.constrained is None and streamed.constrained is None  # the upstream's to enforce


async def test_json_object_and_completions(upstream: FaultUpstream) -> None:
    upstream.script(ok(), ok())
    async with backend_for(upstream) as backend:
        await backend.generate(
            GenerationRequest(messages=(Message("user", "JSON please"),), response_format=ResponseFormat("json_object"))
        )
        await backend.generate(GenerationRequest(prompt="Largest city?", **SHAPED))  # type: ignore[arg-type]
    chat, completion = upstream.requests
    assert chat.body["response_format"] == {"type": "json_object"}
    assert completion.path.endswith("/completions") and not completion.is_chat
    assert {k: completion.body.get(k) for k in WIRE} == WIRE


async def test_free_text_sends_none_of_them(upstream: FaultUpstream) -> None:
    upstream.script(ok())
    async with backend_for(upstream) as backend:
        g = await backend.generate(GenerationRequest(messages=(Message("user", "Hi"),)))
    body = upstream.requests[0].body
    assert not {"response_format", "logit_bias", "presence_penalty", "frequency_penalty"} & body.keys()
    assert g.constrained is False
