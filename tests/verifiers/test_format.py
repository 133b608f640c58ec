from __future__ import annotations

import pytest

from router.generation import GenerationRequest
from tests.support.scripted import gen
from verifiers.format import FormatVerifier, parse_json_answer

REQ = GenerationRequest(prompt="Reply in JSON")
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


async def test_regex_must_match_somewhere() -> None:
    v = FormatVerifier(regex=r"^Answer: [A-D]$|\bAnswer: [A-D]\b")
    assert (await v.score(REQ, gen("Thinking...\nAnswer: C"))).value == 1.0
    miss = await v.score(REQ, gen("Thinking... it is C"))
    assert miss.value == 0.0
    assert "regex" in miss.reason


async def test_json_bare_or_fenced() -> None:
    v = FormatVerifier(json=True)
    assert (await v.score(REQ, gen('  {"a": [1, 2]}\n'))).value == 1.0
    assert (await v.score(REQ, gen('Sure! Here it is:\n```json\n{"a": 1}\n```\nAnything else?'))).value == 1.0
    assert (await v.score(REQ, gen("```\n[1, 2, 3]\n```"))).value == 1.0
    bad = await v.score(REQ, gen('{"a": 1,}'))
    assert bad.value == 0.0
    assert bad.reason.startswith("not JSON")
    assert (await v.score(REQ, gen('```python\n{"a": 1}\n```'))).value == 0.0


async def test_json_schema() -> None:
    v = FormatVerifier(json_schema=SCHEMA)
    ok = await v.score(REQ, gen('```json\n{"name": "Ada", "age": 36}\n```'))
    assert ok.value == 1.0
    assert ok.details["passed"] == ["json", "json_schema"]
    wrong = await v.score(REQ, gen('{"name": "Ada", "age": -1}'))
    assert wrong.value == 0.0
    assert "schema" in wrong.reason and "/age" in wrong.reason
    missing = await v.score(REQ, gen('{"name": "Ada"}'))
    assert missing.value == 0.0 and "age" in missing.reason
    assert (await v.score(REQ, gen("not json"))).details["failed"] == "json"


async def test_checks_run_in_order_and_the_first_failure_is_the_reason() -> None:
    v = FormatVerifier(regex="name", json=True, json_schema=SCHEMA)
    assert (await v.score(REQ, gen('{"age": 3}'))).details["failed"] == "regex"
    assert (await v.score(REQ, gen('{"name": 3'))).details["failed"] == "json"
    assert (await v.score(REQ, gen('{"name": 3, "age": 3}'))).details["failed"] == "json_schema"


def test_parse_json_answer_raises_on_no_json() -> None:
    assert parse_json_answer('```json\nnot\n```\n```json\n{"b": 2}\n```') == {"b": 2}
    with pytest.raises(ValueError):
        parse_json_answer("no json here")


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"regex": "("}, ValueError),
        ({"regex": 5}, TypeError),
        ({"json": "yes"}, TypeError),
        ({"json_schema": {"type": "no-such-type"}}, ValueError),
        ({"json_schema": "object"}, TypeError),
        ({"json": True, "strict": True}, TypeError),
    ],
)
def test_bad_params(params: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        FormatVerifier(**params)
