"""POST /v1/responses as the clients that default to it use it: the official `openai` package's
`responses.create`, `responses.stream` and `responses.parse`, a function tool round trip, and the
OpenAI Agents SDK with its default (Responses) model, each through `auto` against a served router
(SmolLM2 for text, scripted tool-calling tiers for tools: tests/support/surfaces.py)."""

from __future__ import annotations

import json

import openai
import pydantic
import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.models.openai_provider import OpenAIProvider

from tests.support.accounting import MARK, read_ledger
from tests.support.servers import UvicornThread
from tests.support.surfaces import CAPITAL, QUESTION, RESPONSES_WEATHER, assert_no_pending, ledger_of


def client(srv: UvicornThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def test_create_escalates_and_is_recorded_as_a_responses_request(smol: UvicornThread) -> None:
    raw = client(smol).responses.with_raw_response.create(
        model="auto", input=f"{MARK} Say hello.", instructions="Answer in one short sentence."
    )
    r = raw.parse()
    assert raw.headers["x-tierroute-escalated"] == "true" and raw.headers["x-tierroute-tier"] == "large"
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "large"
    assert r.status in ("completed", "incomplete") and r.output_text and r.output[0].type == "message"
    assert r.usage is not None and r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.instructions == "Answer in one short sentence." and r.store is False
    ext = r.model_extra["tierroute"]  # type: ignore[index]
    assert ext["request_id"] == r.id and ext["escalated"] and [a["tier"] for a in ext["attempts"]] == ["small", "large"]
    entry = read_ledger(ledger_of(smol))[r.id]
    assert entry.surface == "responses" and entry.escalated and entry.cost_usd == ext["cost_usd"]
    assert r.usage.input_tokens == entry.attempts[-1].prompt_tokens


def test_stream_final_response_is_the_streamed_text(smol: UvicornThread) -> None:
    with client(smol).responses.stream(model="auto", input=CAPITAL) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert deltas and final.output_text == "".join(deltas)
    assert final.usage is not None and final.usage.output_tokens > 0
    assert final.model_extra["tierroute"]["tier"] == "small"  # type: ignore[index]


class Sum(pydantic.BaseModel):
    answer: int


def test_parse_with_a_pydantic_model(smol: UvicornThread) -> None:
    r = client(smol).responses.parse(model="auto", input="What is 2 + 3? Reply in JSON.", text_format=Sum)
    assert isinstance(r.output_parsed, Sum)
    attempt = r.model_extra["tierroute"]["attempts"][-1]  # type: ignore[index]
    assert attempt["constrained"] is True  # decoded under the schema's grammar


def test_function_tool_round_trip(tools: UvicornThread) -> None:
    c = client(tools)
    first = c.responses.create(model="auto", input=QUESTION, tools=[RESPONSES_WEATHER])  # type: ignore[list-item]
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    ext = first.model_extra["tierroute"]  # type: ignore[index]
    assert ext["escalated"] and ext["attempts"][0]["tool_check"] is False  # the small tier called get_wether
    history = [
        {"role": "user", "content": QUESTION},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"},
    ]
    second = c.responses.create(model="auto", input=history, tools=[RESPONSES_WEATHER])  # type: ignore[arg-type, list-item]
    assert second.output_text == "It is 21 C in Paris." and second.status == "completed"
    # streamed, the calls arrive as the helper reads them
    with c.responses.stream(model="auto", input=QUESTION, tools=[RESPONSES_WEATHER]) as stream:  # type: ignore[list-item]
        arguments = "".join(e.delta for e in stream if e.type == "response.function_call_arguments.delta")
        final = stream.get_final_response()
    assert json.loads(arguments) == {"city": "Paris"} and final.output[0].type == "function_call"


def test_agents_sdk_default_model_with_a_function_tool(tools: UvicornThread) -> None:
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return "21 C"

    agent = Agent(name="weather", instructions="Answer with the weather.", model="auto", tools=[get_weather])
    provider = OpenAIProvider(openai_client=openai.AsyncOpenAI(base_url=f"{tools.url}/v1", api_key="unused"))
    result = Runner.run_sync(agent, QUESTION, run_config=RunConfig(model_provider=provider, tracing_disabled=True))
    assert asked == ["Paris"] and result.final_output == "It is 21 C in Paris."


def test_a_stream_a_tier_refuses_leaves_no_pending_row(smol: UvicornThread) -> None:
    """A prompt over the small tier's context is refused (400) once the stream's account is open:
    its pending row, written ahead of the stream, is dropped again rather than left to count its
    reservation against the key for the rest of the day."""
    c = client(smol)
    with pytest.raises(openai.BadRequestError) as refused:
        c.responses.create(model="small", input="word " * 3000, stream=True)
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "input"
    assert_no_pending(ledger_of(smol))
