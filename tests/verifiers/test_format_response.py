"""The format verifier and the request's own response_format: checked whenever a request carries
one (the whole answer must be JSON of that shape), abstaining when there is none; a cut-off answer
fails, and what the grammar cannot enforce (numeric bounds) fails here."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from router.generation import GenerationRequest, ResponseFormat
from tests.support.scripted import gen
from verifiers.format import FormatVerifier
from verifiers.jsonschema_check import PATTERN_TIMEOUT_S

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
FREE = GenerationRequest(prompt="Say hi")
WITH_SCHEMA = GenerationRequest(prompt="A person", response_format=ResponseFormat("json_schema", SCHEMA, "person"))
JSON_MODE = GenerationRequest(prompt="A person", response_format=ResponseFormat("json_object"))


async def test_abstains_without_a_response_format() -> None:
    s = await FormatVerifier().score(FREE, gen("Hello there"))
    assert s.abstained
    assert s.details["check"] == "response_format"


async def test_checks_the_request_schema() -> None:
    v = FormatVerifier()
    ok = await v.score(WITH_SCHEMA, gen('{"name": "Ada", "age": 36}'))
    assert ok.value == 1.0 and ok.details["check"] == "response_format"
    below = await v.score(WITH_SCHEMA, gen('{"name": "Ada", "age": -1}'))  # `minimum`: not in the grammar
    assert below.value == 0.0 and below.details["failed"] == "schema"
    assert "age" in below.reason
    extra = await v.score(WITH_SCHEMA, gen('{"name": "Ada", "age": 3, "x": 1}'))
    assert extra.value == 0.0


async def test_the_whole_answer_must_be_json() -> None:
    # the client parses the message content as it is: a fenced block is not what it asked for
    fenced = await FormatVerifier().score(WITH_SCHEMA, gen('```json\n{"name": "Ada", "age": 36}\n```'))
    assert fenced.value == 0.0 and fenced.details["failed"] == "json"


async def test_a_cut_off_answer_fails_and_says_why() -> None:
    cut = await FormatVerifier().score(WITH_SCHEMA, gen('{"name": "Ad', finish_reason="length"))
    assert cut.value == 0.0
    assert "cut off at max_tokens" in cut.reason


async def test_json_mode_wants_an_object() -> None:
    v = FormatVerifier()
    assert (await v.score(JSON_MODE, gen('{"a": [1, 2]}'))).value == 1.0
    array = await v.score(JSON_MODE, gen("[1, 2]"))
    assert array.value == 0.0 and array.details["failed"] == "object"


async def test_configured_checks_still_run_beside_the_request_format() -> None:
    v = FormatVerifier(regex=r'"name"')
    assert (await v.score(JSON_MODE, gen('{"age": 1}'))).value == 0.0  # the regex fails
    assert (await v.score(JSON_MODE, gen("not json"))).value == 0.0  # the request's format fails
    both = await v.score(JSON_MODE, gen('{"name": "x"}'))
    assert both.value == 1.0 and "response_format" in both.details["passed"]
    assert (await v.score(FREE, gen('"name"'))).value == 1.0  # no format asked: the config's alone


@pytest.mark.timeout(30)
async def test_a_catastrophic_client_pattern_fails_the_answer_instead_of_hanging() -> None:
    # ^(a|aa)+$ against 40 a's and a '!': exponentially many ways to split the a's, each tried by
    # a backtracking matcher before it gives up, while holding the event loop (and every other
    # request). An upstream, not a grammar, wrote the answer.
    evil = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|aa)+$"}}, "required": ["s"]}
    request = GenerationRequest(prompt="x", response_format=ResponseFormat("json_schema", evil, "evil"))
    bad = await FormatVerifier().score(request, gen(json.dumps({"s": "a" * 40 + "!"})))
    assert bad.value == 0.0 and "took too long" in bad.reason
    # the same pattern still passes and fails ordinary answers
    assert (await FormatVerifier().score(request, gen('{"s": "aaa"}'))).value == 1.0
    assert (await FormatVerifier().score(request, gen('{"s": "ab"}'))).value == 0.0


@pytest.mark.slow
@pytest.mark.timeout(30)
async def test_many_slow_strings_cost_a_bounded_time_off_the_event_loop() -> None:
    # 200 strings that each run the pattern to its time limit: only the first few are read
    evil = {"type": "array", "items": {"type": "string", "pattern": "^(a|aa)+$"}}
    request = GenerationRequest(prompt="x", response_format=ResponseFormat("json_schema", evil, "evil"))
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    bad = await FormatVerifier().score(request, gen(json.dumps(["a" * 40 + "!"] * 200)))
    took = time.monotonic() - started
    ticker.cancel()
    assert bad.value == 0.0 and "took too long" in bad.reason
    assert took < 0.2 * 200 * PATTERN_TIMEOUT_S  # far less than every string run to its limit
    assert ticks >= took / 0.01 / 4  # the loop kept turning while the patterns ran


@pytest.mark.parametrize("fmt", [ResponseFormat("json_object"), None])
async def test_json_nested_past_the_reader_fails_instead_of_raising(fmt: ResponseFormat | None) -> None:
    # a model can be asked to write a few thousand brackets; json.loads raised RecursionError out
    # of the verifier (a 500) for the request's format and for the config's `json` check alike
    deep = "[" * 5000 + "]" * 5000
    verifier = FormatVerifier(json=fmt is None)
    s = await verifier.score(GenerationRequest(prompt="brackets", response_format=fmt), gen(deep))
    assert s.value == 0.0 and "nested deeper" in s.reason
