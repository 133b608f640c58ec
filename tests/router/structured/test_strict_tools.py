"""A forced tool call decoded under the grammar of one call, through the service with the official
`openai` client on the real SmolLM2 model (which on its own answers in prose): the call parses,
its arguments validate against the function's schema, and the attempt says it was constrained.
Function schemas get the check response_format schemas get: in a strict function, a construct
constrained decoding cannot honour is a 400 naming it and the function; in a non-strict one it is
taken out of the schema the service enforces (remote references and the like are refused in both)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from router.api.app import create_app
from router.config import load_settings
from router.generation import GenerationRequest, Message, NamedTool, ToolSpec
from router.structured import tools
from router.structured.grammars import request_grammar
from tests.support.config import smol_config
from tests.support.servers import UvicornThread

UNIT = {"enum": ["celsius", "fahrenheit"]}
PARAMS = {
    "$defs": {"Unit": UNIT},
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"$ref": "#/$defs/Unit"}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather in a city", "parameters": PARAMS, "strict": True},
}
PING = {"type": "function", "function": {"name": "ping", "description": "Check the network"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
VERIFIERS = '[[tiers.verifiers]]\nname = "tool_call"\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[UvicornThread]:
    cfg = smol_config(tmp_path_factory.mktemp("strict"), threshold=0.5, verifiers=VERIFIERS)
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: UvicornThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_a_forced_strict_call_parses_and_validates(client: openai.OpenAI, choice: Any) -> None:
    r = client.chat.completions.create(
        model="small",
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER, PING],  # type: ignore[list-item]
        tool_choice=choice,
        max_tokens=80,
    )
    calls = r.choices[0].message.tool_calls or []
    assert len(calls) == 1 and r.choices[0].finish_reason == "tool_calls"
    call = calls[0]
    if call.function.name == "get_weather":  # `required` may call either function
        jsonschema.validate(json.loads(call.function.arguments), PARAMS)
    else:
        assert json.loads(call.function.arguments) == {}  # ping takes no arguments
    attempt = r.model_extra["tierroute"]["attempts"][0]  # type: ignore[index]
    assert attempt["constrained"] is True and attempt["tool_check"] is True


def test_a_forced_call_streams_as_openai_streams_calls(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="small",
            messages=ASK,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=80,
            stream=True,
        )
    )
    arguments = "".join(
        tc.function.arguments or "" for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()
    )
    jsonschema.validate(json.loads(arguments), PARAMS)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_the_forced_call_schema_is_one_document_with_each_function_s_definitions() -> None:
    plain = ToolSpec("ping")
    strict = ToolSpec("get_weather", None, json.dumps(PARAMS), strict=True)
    loose = ToolSpec("loose", None, json.dumps({"type": "object", "properties": {"x": {"type": "integer"}}}))
    request = GenerationRequest(messages=(Message("user", "x"),), tools=(strict, plain, loose), tool_choice="required")
    schema = tools.forced_call_schema(request)
    assert schema is not None
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid({"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}})
    assert not validator.is_valid({"name": "get_weather", "arguments": {"city": "Oslo", "unit": "kelvin"}})
    assert validator.is_valid({"name": "loose", "arguments": {"x": 1}})  # strict or not: its schema
    assert not validator.is_valid({"name": "loose", "arguments": {"x": "one"}})
    assert not validator.is_valid({"name": "ping", "arguments": {"x": 1}})  # no parameters: {}
    assert not validator.is_valid({"name": "nope", "arguments": {}})
    assert tools.forced_call_schema(request.with_(tool_choice="auto")) is None
    named = request.with_(tool_choice=NamedTool("ping"))
    assert request_grammar(named) is not None and "get" not in (request_grammar(named) or "")


@pytest.mark.parametrize(
    ("parameters", "words", "strict_only"),
    [
        ({"type": "object", "properties": {"a": {"not": {}}}}, "keyword 'not'", True),
        ({"type": "object", "nullable": True}, "keyword 'nullable'", True),
        (
            {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
            "only local references",
            False,
        ),
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "type must be one of", False),
        ({"type": "object", "properties": {"a": {"pattern": "a" * 600}}}, "at most 500 characters", False),
    ],
)
@pytest.mark.parametrize("strict", [True, False])
def test_function_schemas_get_the_response_format_check(
    server: UvicornThread, parameters: dict[str, Any], words: str, strict_only: bool, strict: bool
) -> None:
    # a strict function's schema must be one the grammar honours; a non-strict one is a hint (as at
    # OpenAI), so what the grammar cannot honour is accepted, but never a remote reference, an
    # invalid type or an oversized pattern
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters, "strict": strict}}
    body = {"model": "small", "messages": ASK, "tools": [PING, tool], "max_tokens": 4}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    if strict_only and not strict:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools.1.function.parameters" and words in error["message"]


NOT_STRICT = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20, "not": {"$ref": "https://example.com/evil.json"}},
        "unit": {"type": "string", "nullable": True, "enum": ["celsius", "fahrenheit"]},
    },
    "patternProperties": {"^(a+)+$": {"type": "string"}},
    "required": ["city", "unit"],
    "if": {"properties": {"unit": {"const": "celsius"}}},
    "then": {"required": ["city"]},
}


def test_a_non_strict_schema_is_loosened_only_where_the_grammar_cannot_follow() -> None:
    from router.structured.grammars import loosened_tool_schema

    loose, dropped = loosened_tool_schema(NOT_STRICT, "tools.0.function.parameters")
    assert sorted(dropped) == [
        "#/if",
        "#/patternProperties",
        "#/properties/city/not",
        "#/properties/unit/nullable",
        "#/then",
    ]
    # nothing the grammar honours is lost, and nothing dropped (the remote $ref in `not`, the
    # catastrophic pattern of patternProperties) is kept for the validator to run
    assert loose == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
    }
    assert "https" not in json.dumps(loose)


def test_a_forced_call_to_a_non_strict_function_decodes_under_its_loosened_schema(client: openai.OpenAI) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": NOT_STRICT}}
    r = client.chat.completions.create(
        model="small",
        messages=ASK,  # type: ignore[arg-type]
        tools=[tool, PING],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
        temperature=0,
    )
    calls = r.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]  # type: ignore[union-attr]
    arguments = json.loads(calls[0].function.arguments)  # type: ignore[union-attr]
    assert set(arguments) >= {"city", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")
    attempt = r.model_extra["tierroute"]["attempts"][0]  # type: ignore[index]
    assert attempt["constrained"] is True


def test_the_model_and_a_remote_tier_see_the_clients_schema_not_the_loosened_one() -> None:
    spec = ToolSpec("f", None, json.dumps(NOT_STRICT), checked_json=json.dumps({"type": "object"}))
    assert spec.to_openai()["function"]["parameters"] == NOT_STRICT
    assert spec.checked == {"type": "object"}
    assert ToolSpec("g", None, json.dumps(PARAMS)).checked == PARAMS
