"""The structured-output suite: its items are sound, its requests carry the schema, and its grader
reads right, wrong, invalid and cut-off answers as the module docstring says."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from evals.runner import build_request
from evals.suites import get_suite
from evals.suites.structured import Structured, grade_structured
from router.config import load_settings
from router.tasks import rule_task, task_of_suite
from tests.support.evals import write_config

REF: dict[str, Any] = {
    "merchant": "Green Leaf Grocers",
    "currency": "USD",
    "items": [{"name": "Oat milk 1L", "quantity": 2, "unit_price": 2.49}],
    "total": 4.98,
}
FOLD = ["merchant", "items[].name"]


@pytest.mark.slow
def test_items_are_sound_and_the_fingerprint_stable() -> None:
    suite = get_suite("structured")
    assert isinstance(suite, Structured) and suite.task == "structured" and suite.fingerprint == "structured@2"
    items = suite.load()
    assert len(items) == 60 and len({i.id for i in items}) == 60
    assert len({i.group for i in items}) >= 10  # varied domains
    again = Structured().load()
    assert [i.prompt_sha for i in items] == [i.prompt_sha for i in again]
    rows = [json.loads(line) for line in suite.path.read_text(encoding="utf-8").splitlines()]
    for row in rows:  # every reference is an instance of its own schema
        jsonschema.Draft202012Validator.check_schema(row["schema"])
        jsonschema.validate(row["reference"], row["schema"])
        assert json.dumps(row["reference"], ensure_ascii=False) not in row["text"]
    kinds = {json.dumps(r["schema"]) for r in rows}
    assert any('"enum"' in k for k in kinds) and any('"array"' in k for k in kinds)
    assert any(set(r["schema"]["required"]) < set(r["schema"]["properties"]) for r in rows)  # optional fields


def test_the_request_asks_for_the_schema(tmp_path: Any) -> None:
    suite = get_suite("structured")
    item = suite.load()[0]
    settings = load_settings(write_config(tmp_path))
    request = build_request(suite, item, settings.tiers[0])
    fmt = request.response_format
    assert fmt is not None and fmt.kind == "json_schema" and fmt.strict is True
    assert fmt.schema is not None and fmt.schema["type"] == "object"
    assert rule_task(request) is not None and rule_task(request).task == "structured"  # type: ignore[union-attr]
    assert task_of_suite(suite.task) == "structured"


@pytest.mark.parametrize(
    ("answer", "right", "detail"),
    [
        (json.dumps(REF), True, "fields 4/4 right"),
        # key order, number forms, whitespace, a fence and case on folded fields do not matter
        (
            '```json\n{"total": 4.980, "items": [{"unit_price": 2.49, "quantity": 2.0, "name": "OAT  milk 1L "}],'
            ' "currency": "USD", "merchant": "GREEN LEAF GROCERS"}\n```',
            True,
            "fields 4/4 right",
        ),
        # a null or empty optional field is an absent one
        (json.dumps({**REF, "payment_method": None}), True, "fields 4/4 right"),
        (json.dumps({**REF, "payment_method": " ", "notes": [], "extra": {}}), True, "fields 4/4 right"),
        (json.dumps({**REF, "total": 4.99}), False, "fields 3/4 right; wrong: total"),
        (json.dumps({**REF, "currency": "usd"}), False, "wrong: currency"),  # an enum is not free text
        (json.dumps({**REF, "payment_method": "card"}), False, "fields 4/5 right; wrong: payment_method"),
        (json.dumps({k: v for k, v in REF.items() if k != "items"}), False, "wrong: items"),
        (json.dumps({**REF, "items": [{**REF["items"][0], "quantity": True}]}), False, "wrong: items"),
        ("The merchant is Green Leaf Grocers.", False, "not JSON"),
        (json.dumps(REF)[:40], False, "not JSON"),  # cut off by max_tokens
        ("```json\n" + json.dumps(REF), False, "unclosed code fence"),
        ("[1, 2]", False, "not a JSON object"),
        ('{"total": NaN}', False, "not JSON"),
    ],
)
def test_grader(answer: str, right: bool, detail: str) -> None:
    grade = grade_structured(answer, REF, FOLD)
    assert grade.correct is right
    assert detail in grade.detail


async def test_suite_grades_its_own_reference_right() -> None:
    suite = Structured()
    rows = {json.loads(line)["id"]: json.loads(line) for line in suite.path.read_text(encoding="utf-8").splitlines()}
    for item in suite.load():
        assert (await suite.grade(item, json.dumps(rows[item.id]["reference"]))).correct, item.id
        assert not (await suite.grade(item, "{}")).correct
