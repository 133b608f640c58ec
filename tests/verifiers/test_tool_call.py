"""The tool_call verifier on good and bad calls, and the JSON Schema checker it shares with `format`."""

from __future__ import annotations

import json
import time

import pytest

from router.generation import Generation, GenerationRequest, Message, NamedTool, ToolCall, ToolChoice, ToolSpec
from verifiers.jsonschema_check import PATTERN_TIMEOUT_S, first_error
from verifiers.tool_call import ToolCallVerifier

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "unit": {"enum": ["C", "F"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = ToolSpec("get_weather", None, json.dumps(SCHEMA))
PING = ToolSpec("ping")


def req(choice: ToolChoice = "auto") -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", "Weather?"),), tools=(WEATHER, PING), tool_choice=choice)


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


async def score(text: str, choice: ToolChoice = "auto", calls: tuple[ToolCall, ...] | None = None) -> float | None:
    s = await ToolCallVerifier().score(req(choice), Generation(text, "stop", 1, 1, None, 0.0, tool_calls=calls))
    assert ("tool_call" in s.details) == (s.value is not None)
    return s.value


async def test_valid_calls_pass() -> None:
    assert await score(call("get_weather", '{"city": "Paris", "unit": "C", "days": 3}')) == 1.0
    assert await score(call("get_weather", '{"city": "Oslo"}') + call("ping", "{}")) == 1.0
    assert await score(call("get_weather", '{"city": "Oslo"}'), NamedTool("get_weather")) == 1.0
    assert await score("", calls=(ToolCall("c", "ping", "{}"),)) == 1.0  # an upstream's structured calls


@pytest.mark.parametrize(
    "text",
    [
        call("get_wether", '{"city": "Paris"}'),  # no such function
        call("get_weather", '{"unit": "C"}'),  # a required argument missing
        call("get_weather", '{"city": 7}'),  # wrong type
        call("get_weather", '{"city": "Paris", "unit": "K"}'),  # not in the enum
        call("get_weather", '{"city": "Paris", "days": 9}'),  # over the maximum
        call("get_weather", '{"city": "Paris", "wind": true}'),  # additionalProperties false
        call("get_weather", '{"city": "Paris", "tags": ["a", "b", "c", "d"]}'),  # too many items
        call("get_weather", '"city=Paris"'),  # arguments a string that is not an object
        "<tool_call>{get_weather(city='Paris')}</tool_call>",  # not JSON
    ],
)
async def test_bad_calls_fail(text: str) -> None:
    assert await score(text) == 0.0


async def test_tool_choice_is_respected() -> None:
    assert await score("It is sunny.", "required") == 0.0
    assert await score("It is sunny.", NamedTool("ping")) == 0.0
    assert await score(call("get_weather", '{"city": "Oslo"}'), NamedTool("ping")) == 0.0
    assert await score("It is sunny.") is None  # auto: text is allowed, and judged by other verifiers


async def test_looping_calls_fail() -> None:
    one = call("get_weather", '{"city": "Oslo"}')
    assert await score(one + one) == 0.0
    history = (
        Message("user", "Weather in Oslo?"),
        Message("assistant", "", (ToolCall("c1", "get_weather", '{"city":"Oslo"}'),)),
        Message("tool", "3 C", tool_call_id="c1"),
    )
    request = GenerationRequest(messages=history, tools=(WEATHER, PING))
    again = await ToolCallVerifier().score(request, Generation(one, "stop", 1, 1, None, 0.0))
    assert again.value == 0.0 and "already" in again.reason
    other = call("get_weather", '{"city": "Rome"}')
    assert (await ToolCallVerifier().score(request, Generation(other, "stop", 1, 1, None, 0.0))).value == 1.0


async def test_it_abstains_without_tools() -> None:
    plain = GenerationRequest(messages=(Message("user", "Hi"),))
    assert (await ToolCallVerifier().score(plain, Generation(call("ping", "{}"), "stop", 1, 1, None, 0.0))).abstained
    assert await score(call("ping", "{}"), "none") is None


def test_arguments_are_checked_as_response_format_answers_are() -> None:
    # one checker for both: full JSON Schema (refs, patterns, bounds), JSON's own equality
    schema = {
        "$defs": {"Unit": {"enum": ["C", "F"]}},
        "type": "object",
        "properties": {"unit": {"$ref": "#/$defs/Unit"}, "code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
    }
    assert first_error(schema, {"unit": "C", "code": "OSL"}) is None
    assert "'K' is not one of" in (first_error(schema, {"unit": "K"}) or "")
    assert "does not match" in (first_error(schema, {"code": "oslo"}) or "")
    assert first_error({"type": ["string", "null"]}, None) is None
    assert first_error({"type": "integer"}, True) is not None  # a boolean is no number in JSON
    assert first_error({"const": 1}, True) is not None
    assert first_error({"anyOf": [{"type": "string"}, {"type": "integer"}]}, 1.5) is not None


@pytest.mark.slow
def test_a_hostile_pattern_fails_in_bounded_time_and_a_schema_made_in_code_never_crashes() -> None:
    started = time.monotonic()
    error = first_error({"type": "array", "items": {"pattern": "^(a|aa)+$"}}, ["a" * 40 + "!"] * 200)
    assert error is not None and "took too long" in error
    assert time.monotonic() - started < 0.2 * 200 * PATTERN_TIMEOUT_S
    # the API refuses such schemas (router.structured.grammars.check_schema); one built in code fails the answer
    assert "cannot be applied" in (first_error({"$ref": "#/nowhere"}, "x") or "")


@pytest.mark.parametrize("depth", [65, 5000])
async def test_an_upstreams_call_nested_past_the_bound_fails_without_raising(depth: int) -> None:
    # an upstream's `tool_calls` arrive as text the router did not check; a few thousand brackets
    # raised RecursionError out of json.loads here (a 500 for the client)
    deep = '{"city": ' + "[" * depth + "]" * depth + "}"
    s = await ToolCallVerifier().score(
        req(), Generation("", "stop", 1, 1, None, 0.0, tool_calls=(ToolCall("c1", "get_weather", deep),))
    )
    assert s.value == 0.0 and "nested more than 64 deep" in s.reason
