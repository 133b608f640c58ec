"""Suites: the pinned data, prompt formats, sampling and graders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.grading import extract_choice, grade_exact, grade_numeric, grade_regex
from evals.suites import get_suite
from evals.suites.gsm8k import reference_of
from router.errors import ConfigError


@pytest.mark.slow
def test_builtin_suites_load_the_pinned_data() -> None:
    sizes = {"gsm8k": 1319, "humaneval": 164, "mmlu": 14042}
    for name, size in sizes.items():
        suite = get_suite(name)
        items = suite.load()
        assert len(items) == size, name
        assert len({i.id for i in items}) == size
    with pytest.raises(ConfigError, match="unknown suite"):
        get_suite("nope")


def test_sampling_is_seeded_and_prefix_stable() -> None:
    suite = get_suite("gsm8k")
    items = suite.load()
    a, b = suite.select(items, 10, 0), suite.select(items, 20, 0)
    assert [i.id for i in b[:10]] == [i.id for i in a]
    assert [i.id for i in suite.select(items, 10, 1)] != [i.id for i in a]


@pytest.mark.slow
def test_mmlu_is_sampled_across_subjects() -> None:
    suite = get_suite("mmlu")
    picked = suite.select(suite.load(), 114, 0)
    groups = {i.group for i in picked}
    assert len(groups) == 57
    assert all(sum(i.group == g for i in picked) == 2 for g in groups)


@pytest.mark.slow
async def test_humaneval_grader_runs_the_hidden_tests() -> None:
    suite = get_suite("humaneval")
    item = suite.load()[2]  # truncate_number
    right = "```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```"
    wrong = "```python\ndef truncate_number(number: float) -> float:\n    return number\n```"
    body_only = "    return number % 1.0\n"
    assert (await suite.grade(item, right)).correct
    assert not (await suite.grade(item, wrong)).correct
    assert (await suite.grade(item, body_only)).correct


@pytest.mark.slow
async def test_gsm8k_and_mmlu_graders() -> None:
    assert reference_of("so 3 + 4 = 7\n#### 1,234") == "1234"
    gsm = get_suite("gsm8k")
    item = gsm.load()[0]  # Janet's ducks: 18
    assert (await gsm.grade(item, "She makes $18 a day. \\boxed{18}")).correct
    assert (await gsm.grade(item, "The answer is $18.00.")).correct
    assert not (await gsm.grade(item, "\\boxed{16}")).correct
    mmlu = get_suite("mmlu")
    item = mmlu.load()[0]  # correct D
    assert (await mmlu.grade(item, "D")).correct
    assert not (await mmlu.grade(item, "B. Wrong, Not wrong")).correct


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("B", "B"),
        ("(C)", "C"),
        ("**D**", "D"),
        ("The answer is A.", "A"),
        ("Answer: C", "C"),
        ("I think B is right", "B"),
        ("I am not sure", None),
        ("A. Paris", "A"),
        ("The answer is a bit unclear", None),
        ("Let's look at each option:\n\nA. Natural", None),
        ("Options:\nA. one\nB. two\nSo B", "B"),
        ("Either A or B", None),
        ("The correct answer is A. naturalness arguments", "A"),
    ],
)
def test_extract_choice(text: str, letter: str | None) -> None:
    assert extract_choice(text) == letter


def test_simple_graders() -> None:
    assert grade_exact("  Paris \n", ["paris", "Lyon"]).correct
    assert not grade_exact("Paris, France", "Paris").correct
    assert grade_numeric("it is 1,000 dollars", 1000).correct
    assert grade_regex("colour: red", r"(?i)RED").correct


def test_jsonl_suite(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    rows = [
        {"prompt": "2+2?", "reference": "4", "grader": "numeric"},
        {"id": "cap", "system": "Be brief.", "prompt": "Capital of France?", "reference": "Paris", "grader": "exact"},
        {"messages": [{"role": "user", "content": "pick"}], "reference": "B", "grader": "choice", "group": "g"},
        {"prompt": "Write f() returning 1", "reference": "assert f() == 1", "grader": "code_tests"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    suite = get_suite(str(path))
    items = suite.load()
    assert [i.id for i in items] == ["mine/1", "cap", "mine/3", "mine/4"]
    assert [m.role for m in items[1].messages] == ["system", "user"]
    assert items[2].group == "g"
    for bad, why in [
        ({"prompt": "x", "reference": "1", "grader": "fuzzy"}, "grader must be"),
        ({"prompt": "x", "grader": "exact"}, "missing 'reference'"),
        ({"reference": "1", "grader": "exact"}, "needs 'prompt'"),
        ({"prompt": "x", "reference": "seven", "grader": "numeric"}, "not a number"),
        ({"prompt": "x", "reference": "E", "grader": "choice"}, "choice reference"),
    ]:
        path.write_text(json.dumps(bad) + "\n")
        with pytest.raises(ConfigError, match=why):
            get_suite(str(path)).load()


@pytest.mark.slow
async def test_jsonl_code_tests_grader(tmp_path: Path) -> None:
    path = tmp_path / "code.jsonl"
    path.write_text(
        json.dumps({"prompt": "Write f() returning 1", "reference": "assert f() == 1", "grader": "code_tests"}) + "\n"
    )
    suite = get_suite(f"jsonl:{path}")
    item = suite.load()[0]
    assert (await suite.grade(item, "```python\ndef f():\n    return 1\n```")).correct
    assert not (await suite.grade(item, "```python\ndef f():\n    return 2\n```")).correct
