"""Structured output through the service, with the official `openai` client against a real server
on the real SmolLM2 model: `beta.chat.completions.parse` with a pydantic model, JSON mode on 50
varied prompts, a schema streamed, a cut-off answer escalated, the `tierroute` object's report
per attempt; and every malformed or hostile format, bias or penalty refused with a 400 naming it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from router.api.app import create_app
from router.config import load_settings
from tests.support.config import smol_config
from tests.support.servers import UvicornThread

STRUCTURED = """
[[tiers.verifiers]]
name = "confidence"
[tiers.tasks.structured]
threshold = 0.5
[[tiers.tasks.structured.verifiers]]
name = "format"
"""
PROMPTS = (Path(__file__).parent / "data" / "json_mode_prompts.txt").read_text().splitlines()
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "country": {"type": "string", "maxLength": 40}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


class Person(BaseModel):
    name: str
    age: int
    role: Literal["engineer", "teacher", "doctor"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[UvicornThread]:
    cfg = smol_config(tmp_path_factory.mktemp("structured"), threshold=1.0, verifiers=STRUCTURED)
    settings = load_settings(cfg)
    for tier in settings.tiers:
        tier.max_tokens = 200  # room for a whole JSON answer
    with UvicornThread(create_app(settings)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: UvicornThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_parse_returns_the_pydantic_object(client: openai.OpenAI) -> None:
    completion = client.beta.chat.completions.parse(
        model="auto",
        messages=[{"role": "user", "content": "Invent a person: a name, an age and a role."}],
        response_format=Person,
    )
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person)
    first = completion.model_extra["tierroute"]["attempts"][0]  # type: ignore[index]
    assert first["constrained"] is True
    assert first["format_ok"] is True and first["accepted"] is True


def test_json_mode_on_20_varied_prompts(client: openai.OpenAI) -> None:
    """SmolLM2-135M often writes one string on and on until max_tokens, grammar or not; so what is
    asserted is what the service controls: an answer that ended by itself is a JSON object and
    passes the format check, and one cut off fails it (and would escalate). All 50 prompts, on
    the default tiers: scripts/json_mode_check.py."""
    assert len(PROMPTS) == 50

    def ask(prompt: str) -> tuple[str, dict[str, Any]]:
        r = client.chat.completions.create(
            model="small",
            messages=[{"role": "user", "content": prompt}],
            response_format={"type": "json_object"},
            max_tokens=96,
        )
        return r.choices[0].message.content or "", r.model_extra["tierroute"]["attempts"][0]  # type: ignore[index]

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, PROMPTS[::5] + PROMPTS[1::5]))
    finished = 0
    for text, attempt in answers:
        assert attempt["constrained"] is True
        if attempt["finish_reason"] == "stop":
            finished += 1
            assert _is_object(text), text
            assert attempt["format_ok"] is True
        else:
            assert attempt["finish_reason"] == "length" and attempt["format_ok"] is False
    assert finished >= 5, answers


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def test_a_schema_streams(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": "Where is the Eiffel Tower? Answer with city and country."}],
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": CITY, "strict": True}},
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), CITY)


def test_completions_take_a_response_format(server: UvicornThread) -> None:
    r = httpx.post(
        f"{server.url}/v1/completions",
        json={
            "model": "small",
            "prompt": "A city and its country:",
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}},
        },
        timeout=300,
    )
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), CITY)


def test_a_cut_off_answer_escalates(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": "Where is the Eiffel Tower?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": CITY}},
        max_tokens=5,
    )
    small, large = r.model_extra["tierroute"]["attempts"]  # type: ignore[index]
    assert small["finish_reason"] == "length" and small["accepted"] is False
    assert small["constrained"] is True and small["format_ok"] is False
    assert "cut off at max_tokens" in small["reason"]
    assert large["tier"] == "large"


def test_free_text_is_not_constrained(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="small", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    attempt = r.model_extra["tierroute"]["attempts"][0]  # type: ignore[index]
    assert attempt["constrained"] is False and attempt["format_ok"] is None


def _deep(n: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(n):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _fmt(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


BAD: dict[str, tuple[dict[str, Any], str, str]] = {
    # name: (extra body, param, words the message must hold)
    "deep nesting": ({"response_format": _fmt(_deep(40))}, "response_format", "deeper"),
    "huge enum": ({"response_format": _fmt({"enum": list(range(20_000))})}, "response_format", "bytes"),
    "pure $ref cycle": (
        {
            "response_format": _fmt(
                {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
            )
        },
        "response_format",
        "refers back",
    ),
    "left recursion": (
        {
            "response_format": _fmt(
                {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"}
            )
        },
        "response_format",
        "left recursion",
    ),
    "remote $ref": ({"response_format": _fmt({"$ref": "https://example.com/s.json"})}, "response_format", "local"),
    "not": ({"response_format": _fmt({"not": {"type": "string"}})}, "response_format", "'not'"),
    "if/then": ({"response_format": _fmt({"if": {}, "then": {}})}, "response_format", "'if'"),
    "unknown keyword": (
        {"response_format": _fmt({"type": "object", "frobnicate": 1})},
        "response_format",
        "frobnicate",
    ),
    "unknown type": ({"response_format": _fmt({"type": "thing"})}, "response_format", "type"),
    "non-dict schema": ({"response_format": _fmt([1, 2])}, "response_format", ""),
    "invalid schema": ({"response_format": _fmt({"type": "integer", "minimum": "x"})}, "response_format", "minimum"),
    "unsupported pattern": (
        {"response_format": _fmt({"type": "string", "pattern": "(?<=a)b"})},
        "response_format",
        "Pattern",
    ),
    "json_schema without one": ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    "schema name too long": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "n" * 65, "schema": {}}}},
        "response_format",
        "",
    ),
    "bias key not a token id": ({"logit_bias": {"hello": 1}}, "logit_bias", "token ids"),
    "bias out of range": ({"logit_bias": {"15": 101}}, "logit_bias", "-100"),
    "too many biases": ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", "300"),
    "bias beyond the vocabulary": ({"logit_bias": {"999999": 1}}, "logit_bias", "vocabulary"),
    "presence penalty too high": ({"presence_penalty": 2.5}, "presence_penalty", ""),
    "frequency penalty not a number": ({"frequency_penalty": "high"}, "frequency_penalty", ""),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_shapes_are_refused_by_name(server: UvicornThread, case: str) -> None:
    extra, param, words = BAD[case]
    body = {"model": "auto", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **extra}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] is not None and error["param"].startswith(param), error
    assert words in error["message"], error


def test_the_service_still_answers_after_them(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="small", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert r.choices[0].message.content is not None
