"""The BFCL suite's grader on answers whose verdict is known: the suite's own items, answered right,
wrong in each way BFCL's AST checker tells apart, and with hostile text (a huge or deeply nested
argument, a function that was not offered); the whole ground truth, written as Qwen writes calls,
graded right by its own grader; and each item asked with its own tools."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from evals.bfcl_checks import as_qwen_answer, canonical_calls, grade_calls, standardize
from evals.grading import Grade
from evals.runner import EvalPlan, run_eval
from evals.store import RunStore
from evals.suites import get_suite
from evals.suites.base import Item
from evals.suites.bfcl import BFCL, CATEGORIES, DATA
from evals.sweep import load_table
from router.config import load_settings
from router.errors import ConfigError
from tests.support.evals import ScriptedBackend, write_config
from verifiers.base import Registry
from verifiers.tool_call import make_tool_call


@pytest.fixture(scope="module")
def items() -> dict[str, Item]:
    return {it.id: it for it in BFCL(categories=tuple(CATEGORIES)).load()}


def call(name: str, **arguments: Any) -> str:
    return as_qwen_answer([(name, arguments)])


SUITE = get_suite("bfcl")


def grade(item: Item, text: str, *, cut_off: bool = False) -> Grade:
    """Through the suite, as the runner grades a stored answer."""
    return asyncio.run(SUITE.grade_answer(item, text, cut_off=cut_off))


def test_the_default_suite_is_the_800_items_of_simple_multiple_and_parallel() -> None:
    loaded = get_suite("bfcl").load()
    assert len(loaded) == 800
    assert {g: sum(it.group == g for it in loaded) for g in ("simple", "multiple", "parallel")} == {
        "simple": 400,
        "multiple": 200,
        "parallel": 200,
    }


def test_every_items_ground_truth_written_as_a_qwen_answer_grades_right(items: dict[str, Item]) -> None:
    # every argument at its first accepted value ("" first: left out, unless required), in the
    # wanted order and reversed; 800 of the default suite, and the 200 parallel_multiple too
    wrong = []
    for item in items.values():
        calls = canonical_calls(item.answer_key.reference)
        for answer in (as_qwen_answer(calls), as_qwen_answer(calls[::-1])):
            g = grade(item, answer)
            if not g.correct:
                wrong.append((item.id, g.detail))
    assert wrong == []
    default = [it for it in items.values() if it.group != "parallel_multiple"]
    assert len(default) == 800 and len(items) == 1000


def test_a_right_call_and_bfcls_tolerances(items: dict[str, Item]) -> None:
    simple = items["bfcl/simple_0"]  # calculate_triangle_area(base=10, height=5, unit in ["units", ""])
    assert grade(simple, call("calculate_triangle_area", base=10, height=5)).correct
    assert grade(simple, call("calculate_triangle_area", base=10, height=5, unit="Units")).correct
    # an integer where a float is declared, inside an array too (JSON has no other way to write 1.0)
    area = items["bfcl/simple_13"]  # interval: array of float, accepted [[1.0, 3.0]]
    assert grade(area, call("calculate_area_under_curve", function="x**2", interval=[1, 3])).correct
    # strings standardised as BFCL does: case, spaces and ,./-_*^ ignored
    assert standardize("Bluebird High-School, Inc.") == standardize("bluebird highschool inc")
    assert grade(area, call("calculate_area_under_curve", function="X ** 2", interval=[1.0, 3.0])).correct
    # a dict argument: its keys' values compared one by one, strings standardised
    db = items["bfcl/simple_89"]
    conditions = {"department": "science", "school": "Bluebird HS"}
    answer = call("db_fetch_records", database_name="StudentDB", table_name="Students", conditions=conditions)
    assert grade(db, answer).correct
    # a list of dicts, in order
    query = items["bfcl/simple_96"]
    conds = [{"field": "age", "operation": ">", "value": "25"}, {"field": "job", "operation": "=", "value": "engineer"}]
    assert grade(query, call("database_query", table="user", conditions=conds)).correct
    assert not grade(query, call("database_query", table="user", conditions=conds[::-1])).correct


def test_a_wrong_value_a_wrong_type_and_a_missing_argument_fail_saying_which(items: dict[str, Item]) -> None:
    simple = items["bfcl/simple_0"]
    g = grade(simple, call("calculate_triangle_area", base=10, height=6))
    assert not g.correct and g.detail == "argument 'height' is 6, accepted: 5"
    g = grade(simple, call("calculate_triangle_area", base="10", height=5))
    assert not g.correct and g.detail.startswith("argument 'base' should be integer, got string")
    g = grade(items["bfcl/multiple_function_0"], call("triangle_properties_get", side1=5, side2=4, side3=True))
    assert not g.correct and "side3" in g.detail  # True is not 3, nor any integer
    g = grade(simple, call("calculate_triangle_area", base=10))
    assert not g.correct and g.detail == "missing required argument 'height'"
    g = grade(simple, call("calculate_triangle_area", base=10, height=5, unit="cm"))
    assert not g.correct and "argument 'unit' is \"cm\"" in g.detail


def test_an_extra_argument_fails_whether_or_not_the_schema_has_it(items: dict[str, Item]) -> None:
    simple = items["bfcl/simple_1"]  # math.factorial(number=5), sent as math_factorial
    g = grade(simple, call("math_factorial", number=5, precision=2))
    assert not g.correct and g.detail == "argument 'precision' is not a parameter of math_factorial"
    # declared by the function but not wanted by the item: BFCL fails it too (a made-up value)
    reference = {
        "functions": [
            {
                "name": "f",
                "parameters": {"type": "dict", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
            }
        ],
        "ground_truth": [{"f": {"a": [1]}}],
    }
    assert grade_calls(call("f", a=1), reference).correct
    g = grade_calls(call("f", a=1, b=0), reference)
    assert not g.correct and g.detail == "argument 'b' is not among the arguments the item wants"


def test_the_wrong_function_and_a_function_not_offered(items: dict[str, Item]) -> None:
    multiple = items["bfcl/multiple_function_0"]  # triangle_properties.get among circle_properties.get, ...
    g = grade(multiple, call("circle_properties_get", radius=5.0))
    assert not g.correct and g.detail == "called circle_properties_get, wanted triangle_properties_get"
    simple = items["bfcl/simple_1"]
    for name in ("math.factorial", "math_factorial_v2", "os_system", "MATH_FACTORIAL"):
        g = grade(simple, call(name, number=5))
        assert not g.correct and g.detail == f"call 1 names {name!r}, which is not an offered function", name


def test_parallel_calls_in_any_order_but_none_short_and_none_twice(items: dict[str, Item]) -> None:
    par = items["bfcl/parallel_function_0"]  # spotify.play: Taylor Swift for 20, Maroon 5 for 15
    swift, maroon = (
        ("spotify_play", {"artist": "Taylor Swift", "duration": 20}),
        (
            "spotify_play",
            {"artist": "Maroon 5", "duration": 15},
        ),
    )
    assert grade(par, as_qwen_answer([swift, maroon])).correct
    assert grade(par, as_qwen_answer([maroon, swift])).correct
    g = grade(par, as_qwen_answer([swift]))
    assert not g.correct and g.detail == "1 call, wanted 2"
    g = grade(par, as_qwen_answer([swift, swift]))
    assert not g.correct and g.detail.startswith("no call matches wanted call 2 of 2 (spotify_play)")
    g = grade(par, as_qwen_answer([swift, maroon, maroon]))
    assert not g.correct and g.detail == "3 calls, wanted 2"
    # a full matching, not a greedy one: the first call fits both wanted calls, the second only the first
    reference = {
        "functions": [{"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "integer"}}}}],
        "ground_truth": [{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}],
    }
    assert grade_calls(as_qwen_answer([("f", {"x": 1}), ("f", {"x": 2})]), reference).correct


def test_json_with_trailing_text_is_read_as_the_service_reads_it(items: dict[str, Item]) -> None:
    simple = items["bfcl/simple_1"]
    bare = '{"name": "math_factorial", "arguments": {"number": 5}}'
    assert grade(simple, bare).correct  # untagged, as Qwen2.5's calls arrive
    assert grade(simple, f"```json\n{bare}\n```").correct
    # untagged JSON then prose is not a call (the service would return it as text)
    g = grade(simple, f"{bare} This computes 5!.")
    assert not g.correct and g.detail == "no function call"
    # a tagged call with prose around it is a call and some content
    assert grade(simple, f"Sure.\n{call('math_factorial', number=5)}\nThat is 120.").correct
    # prose inside the tags breaks the block: unreadable, so wrong
    g = grade(simple, f"<tool_call>\n{bare} and that is all\n</tool_call>")
    assert not g.correct and g.detail.startswith("unreadable call: tool call 1: not JSON")


@pytest.mark.parametrize("text", ["", "  \n", "I cannot help with that."])
def test_an_empty_or_callless_answer_is_wrong(items: dict[str, Item], text: str) -> None:
    g = grade(items["bfcl/simple_1"], text)
    assert not g.correct and g.detail == ("no function call" if text.strip() else "empty answer")


def test_a_truncated_answer_is_wrong(items: dict[str, Item]) -> None:
    simple, par = items["bfcl/simple_1"], items["bfcl/parallel_function_0"]
    full = call("math_factorial", number=5)
    for cut in (len(full) - 20, len(full) // 2, 12):
        g = grade(simple, full[:cut], cut_off=True)
        assert not g.correct and g.detail.startswith("unreadable call"), full[:cut]
    # cut off after the first of two calls: one call short
    first = call("spotify_play", artist="Taylor Swift", duration=20)
    assert grade(par, first + "\n<tool_call>\n").detail.startswith("unreadable call")
    assert grade(par, first).detail == "1 call, wanted 2"


def test_hostile_arguments_are_graded_wrong_quickly_and_quoted_short(items: dict[str, Item]) -> None:
    simple = items["bfcl/simple_0"]
    huge = "x" * 2_000_000
    t0 = time.monotonic()
    g = grade(simple, call("calculate_triangle_area", base=10, height=5, unit=huge))
    assert not g.correct and "2,000,002 characters" in g.detail and len(g.detail) < 400
    assert g.extracted is not None and len(g.extracted) <= 400
    g = grade(simple, call("calculate_triangle_area", base=10, height=5, **{huge[:100_000]: 1}))
    assert not g.correct and len(g.detail) < 400
    # nested thousands deep: Python's JSON decoder raised RecursionError out of the service's reader
    deep = '{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5, "unit": '
    deep += "[" * 50_000 + "]" * 50_000 + "}}"
    for text in (f"<tool_call>\n{deep}\n</tool_call>", deep):
        g = grade(simple, text)
        assert not g.correct
    assert grade(simple, f"<tool_call>{deep}</tool_call>").detail.endswith("nested more than 64 deep")
    # nested within the reader's bound but not what the schema wants
    nested = call("calculate_triangle_area", base=10, height=5, unit=[[[["units"]]]])
    assert grade(simple, nested).detail.startswith("argument 'unit' should be string, got array")
    # a thousand calls: the reader stops at its bound and the answer is unreadable
    many = "\n".join([call("calculate_triangle_area", base=10, height=5)] * 1000)
    assert grade(simple, many).detail.startswith("unreadable call: more than 128 tool calls")
    assert time.monotonic() - t0 < 10


def test_the_loader_reads_the_v1_ground_truth_as_wanted_calls(items: dict[str, Item]) -> None:
    ref = items["bfcl/parallel_function_0"].answer_key.reference
    assert ref["category"] == "parallel"
    assert ref["ground_truth"] == [
        {"spotify.play": {"artist": ["Taylor Swift"], "duration": [20]}},
        {"spotify.play": {"artist": ["Maroon 5"], "duration": [15]}},
    ]
    bmi = items["bfcl/parallel_function_4"].answer_key.reference  # "calculate_bmi 1", "calculate_bmi 2"
    assert [next(iter(c)) for c in bmi["ground_truth"]] == ["calculate_bmi", "calculate_bmi"]
    # a name the function is suffixed with in its own data, and one the ground truth cut short
    circle = items["bfcl/parallel_multiple_function_2"].answer_key.reference["ground_truth"]
    assert [next(iter(c)) for c in circle] == ["circle.calculate_area", "circle.calculate_circumference"]
    closest = items["bfcl/simple_363"].answer_key.reference["ground_truth"]
    assert [next(iter(c)) for c in closest] == ["restaurant_search.find_closest"]
    # a parameter written beside the calls goes into the one call whose function declares it
    cards = items["bfcl/parallel_multiple_function_179"].answer_key.reference["ground_truth"]
    assert len(cards) == 4 and cards[3] == {
        "find_card_in_deck": {"rank": ["Ace"], "suit": ["Spades"], "deck": [[], ""]}
    }
    assert items["bfcl/simple_0"].answer_key.reference["ground_truth"] == [
        {"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}
    ]


def test_a_ground_truth_name_that_is_no_offered_function_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "bfcl"
    shutil.copytree(DATA, root)
    path = root / "possible_answer" / CATEGORIES["simple"]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[3]["ground_truth"] = {"no_such_function": {"a": [1]}}
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ConfigError, match=r"bfcl simple_3: ground truth names 'no_such_function'"):
        BFCL(root, ("simple",)).load()


def test_an_item_is_asked_with_its_own_tools_and_never_served_anothers_answer(tmp_path: Path) -> None:
    # multiple_function_96 asks simple_4's question among more functions (100 multiple items do so):
    # keyed by the messages alone, the runner served it simple_4's stored answer (one function offered)
    suite = get_suite("bfcl")
    loaded = {it.id: it for it in suite.load()}
    assert len({it.prompt_sha for it in loaded.values()}) == 800
    pair = [loaded["bfcl/simple_4"], loaded["bfcl/multiple_function_96"]]
    assert pair[0].messages == pair[1].messages and len(pair[0].tools) == 1 < len(pair[1].tools)
    settings = load_settings(write_config(tmp_path, verifier='name = "tool_call"'))
    plan = EvalPlan(suite=suite, items=pair, settings=settings, tiers=["small"])
    backend = ScriptedBackend("small", lambda request: f"{len(request.tools)} tools offered")
    reg = Registry()
    reg.register("tool_call", make_tool_call)
    with RunStore(tmp_path / "run") as store:
        asyncio.run(run_eval(plan, store, registry=reg, backends={"small": backend}))
    table = load_table(RunStore(tmp_path / "run"))
    assert {it.id: it.tiers[0].text for it in table.items} == {
        "bfcl/simple_4": "1 tools offered",
        "bfcl/multiple_function_96": f"{len(pair[1].tools)} tools offered",
    }
    # an item that offers no tools keeps the identity of its messages, as every stored run has it
    gsm8k = {it.id: it.prompt_sha for it in get_suite("gsm8k").load()}
    committed = json.loads((Path(__file__).resolve().parents[2] / "evals/results/gsm8k/manifest.json").read_text())
    assert all(gsm8k[e["id"]] == e["prompt_sha"] for e in committed["items"])
