"""Examples stated in prose (``f(x) == y``, ``f(x) ➞ y``, "should return", Input/Output tables).

Every form is read from real HumanEval prompts, as the eval runner sends them; the wording each
case relies on is quoted verbatim (and checked to be in the prompt). Hostile or non-literal forms are
refused whoever the caller is; committed model answers are scored against the examples.
"""

from __future__ import annotations

import json
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from evals.data import HUMANEVAL, fetch, read_jsonl
from evals.grading import build_program
from evals.suites import get_suite
from router.generation import Generation, GenerationRequest, Message
from verifiers.code_tests import CodeTestsVerifier
from verifiers.code_tests.stated import MAX_PROMPT_CHARS, StatedExample, stated_examples, stated_steps
from verifiers.code_tests.verifier import assemble_program
from verifiers.extract import compiles, extract_code

pytestmark = pytest.mark.timeout(120)

GENERATIONS = Path(__file__).resolve().parents[2] / "evals" / "results" / "humaneval" / "generations.jsonl"


@cache
def prompts() -> dict[str, str]:
    """HumanEval's prompts (never its tests): the text a verifier may read."""
    return {r["task_id"]: r["prompt"] for r in read_jsonl(fetch(HUMANEVAL))}


@cache
def requests() -> dict[str, GenerationRequest]:
    """Each item's request as `eval run` sends it."""
    return {
        item.id: GenerationRequest(messages=item.messages, metadata={"task": "code", "client_code": True})
        for item in get_suite("humaneval").load()
    }


def answer(text: str) -> Generation:
    return Generation(
        text=text, finish_reason="stop", prompt_tokens=1, completion_tokens=1, token_logprobs=None, latency_s=0.1
    )


def committed(key: str) -> dict[str, Any]:
    for line in GENERATIONS.read_text(encoding="utf-8").splitlines():
        record: dict[str, Any] = json.loads(line)
        if record["key"] == key:
            return record
    raise KeyError(key)


# (item, a line of its prompt quoted verbatim, the example read from it)
FORMS = [
    ("HumanEval/69", "search([4, 1, 2, 2, 3, 1]) == 2", StatedExample("search([4, 1, 2, 2, 3, 1])", 2, "call", "==")),
    ("HumanEval/72", "will_it_fly([3], 5) ➞ True", StatedExample("will_it_fly([3], 5)", True, "call", "➞")),
    ("HumanEval/159", "* eat(5, 6, 10) -> [11, 4]", StatedExample("eat(5, 6, 10)", [11, 4], "call", "->")),
    (
        "HumanEval/67",
        'fruit_distribution("5 apples and 6 oranges", 19) ->19 - 5 - 6 = 8',
        StatedExample("fruit_distribution('5 apples and 6 oranges', 19)", 8, "call", "->"),
    ),
    ("HumanEval/76", "is_simple_power(3, 2) => false", StatedExample("is_simple_power(3, 2)", False, "call", "=>")),
    ("HumanEval/77", "iscube(-1) ==> True", StatedExample("iscube(-1)", True, "call", "==>")),
    ("HumanEval/102", "choose_num(13, 12) = -1", StatedExample("choose_num(13, 12)", -1, "call", "=")),
    (
        "HumanEval/97",
        "multiply(14,-15) should return 20.",
        StatedExample("multiply(14, -15)", 20, "call", "should return"),
    ),
    (
        "HumanEval/86",
        "anti_shuffle('hello') returns 'ehllo'",
        StatedExample("anti_shuffle('hello')", "ehllo", "call", "returns"),
    ),
    (
        "HumanEval/79",
        'decimal_to_binary(15)   # returns "db1111db"',
        StatedExample("decimal_to_binary(15)", "db1111db", "call", "returns"),
    ),
    (
        "HumanEval/141",
        "file_name_check(\"1example.dll\") # => 'No' (the name should start with a latin alphapet letter)",
        StatedExample("file_name_check('1example.dll')", "No", "call", "=>"),
    ),
    ("HumanEval/150", "for x_or_y(7, 34, 12) == 34", StatedExample("x_or_y(7, 34, 12)", 34, "call", "==")),
    (
        "HumanEval/151",
        "double_the_difference([1, 3, 2, 0]) == 1 + 9 + 0 + 0 = 10",
        StatedExample("double_the_difference([1, 3, 2, 0])", 10, "call", "=="),
    ),
    (
        "HumanEval/87",
        "get_row([\n      [1,2,3,4,5,6],\n      [1,2,3,4,1,6],\n      [1,2,3,4,5,1]\n    ], 1) == [(0, 0), (1, 4), (1, 0), (2, 5), (2, 0)]",
        StatedExample(
            "get_row([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 1, 6], [1, 2, 3, 4, 5, 1]], 1)",
            [(0, 0), (1, 4), (1, 0), (2, 5), (2, 0)],
            "call",
            "==",
        ),
    ),
    ("HumanEval/78", 'For num = "AB" the output should be 1.', StatedExample("hex_key('AB')", 1, "for")),
    (
        "HumanEval/84",
        'For N = 147, the sum of digits will be 12 the output should be "1100".',
        StatedExample("solve(147)", "1100", "for"),
    ),
    (
        "HumanEval/112",
        'For s = "abcde", c = "ae", the result should be (\'bcd\',False)',
        StatedExample("reverse_delete('abcde', 'ae')", ("bcd", False), "for"),
    ),
    (
        "HumanEval/68",
        "Input: [4,2,3]\n        Output: [2, 1]",
        StatedExample("pluck([4, 2, 3])", [2, 1], "input_output"),
    ),
    (
        "HumanEval/120",
        "Input: arr = [4, -4, 4], k = 2\n        Output: [4, 4]",
        StatedExample("maximum([4, -4, 4], 2)", [4, 4], "input_output"),
    ),
    (
        "HumanEval/122",
        "Input: arr = [111,21,3,4000,5,6,7,8,9], k = 4\n        Output: 24 # sum of 21 + 3",
        StatedExample("add_elements([111, 21, 3, 4000, 5, 6, 7, 8, 9], 4)", 24, "input_output"),
    ),
    (
        # the parameter is `capacity`: arguments stated under other names are taken in order
        "HumanEval/115",
        "Input: \n            grid : [[0,0,1,0], [0,1,0,0], [1,1,1,1]]\n            bucket_capacity : 1\n        Output: 6",
        StatedExample("max_fill([[0, 0, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1]], 1)", 6, "input_output"),
    ),
]


@pytest.mark.parametrize(
    ("item", "quoted", "example"), FORMS, ids=[f"{f[0]} {f[2].form} {f[2].separator}" for f in FORMS]
)
def test_each_form_is_read_from_a_real_prompt(item: str, quoted: str, example: StatedExample) -> None:
    assert quoted in prompts()[item]
    assert example in stated_examples(requests()[item].last_user_text())


@pytest.mark.parametrize(
    ("item", "quoted", "why"),
    [
        # the sequence's recurrence uses "=", and the prompt's "tri(4) = 3" is a term of it, not
        # what tri(4) returns (a list)
        ("HumanEval/130", "tri(n) = 1 + n / 2, if n is even.\n    tri(n) =  tri(n - 1)", "equations"),
        ("HumanEval/80", "is_happy(abcd) => True", "a bare word is not a literal"),
        ("HumanEval/81", "grade_equation([4.0, 3, 1.7, 2, 3.5]) ==> ['A+', 'B', 'C-', 'C', 'A-']", "not the function"),
        ("HumanEval/149", 'assert list_sort(["aa", "a", "aaa"]) => ["aa"]', "not the function"),
    ],
)
def test_prompts_whose_examples_cannot_be_trusted_give_none(item: str, quoted: str, why: str) -> None:
    assert quoted in prompts()[item]
    assert stated_examples(requests()[item].last_user_text()) == [], why


def test_a_value_in_redundant_parentheses_is_left_out() -> None:
    """("Venus") may be a tuple of one or a string: that example is dropped, the others kept."""
    quoted = 'bf("Earth", "Mercury") ==> ("Venus")'
    assert quoted in prompts()["HumanEval/148"]
    found = stated_examples(requests()["HumanEval/148"].last_user_text())
    assert [e.source for e in found] == ["bf('Jupiter', 'Neptune')", "bf('Mercury', 'Uranus')"]


def test_doctest_lines_are_not_read_twice() -> None:
    """A ``>>>`` line is the doctest reader's; prose examples in a doctest prompt still count."""
    text = requests()["HumanEval/0"].last_user_text()
    assert ">>> has_close_elements([1.0, 2.0, 3.0], 0.5)" in text
    assert stated_examples(text) == []
    fib4 = requests()["HumanEval/46"].last_user_text()
    assert "fib4(3) -> 0" in fib4 and ">>> fib4(5)" in fib4
    assert StatedExample("fib4(3)", 0, "call", "->") in stated_examples(fib4)


@pytest.mark.slow
def test_every_prose_example_holds_for_the_reference_solution() -> None:
    """How the reader is checked against HumanEval: on every prompt, the examples it reads run
    against the reference solution (here only; a verifier never sees it) and all pass."""
    import asyncio

    rows = {r["task_id"]: r for r in read_jsonl(fetch(HUMANEVAL))}
    verifier = CodeTestsVerifier(doctest=False)

    async def run() -> list[str]:
        wrong = []
        for item, request in requests().items():
            if not stated_examples(request.last_user_text()):
                continue
            code = "```python\n" + rows[item]["prompt"] + rows[item]["canonical_solution"] + "```"
            score = await verifier.score(request, answer(code))
            if score.value != 1.0:
                wrong.append(item)
        return wrong

    assert asyncio.run(run()) == []


# ---- hostile or non-literal examples ------------------------------------------------------------------

STUB = 'def f(x):\n    """Say what f does.\n\n    Examples:\n    {line}\n    """\n'


@pytest.mark.parametrize(
    "line",
    [
        "f(g(1)) == 2",  # a call of another function in the arguments
        "g(1) == 2",  # a function the prompt does not define
        "os.system('id') == 0",  # attribute access
        "f(os.environ) == 1",
        "f('a'.upper()) == 'A'",
        "f([i for i in range(3)]) == 3",  # a comprehension
        "f(f\"{__import__('os').getpid()}\") == 1",  # an f-string with code in it
        "f(1) == __import__('os').getpid()",  # a value that is code
        "f(1) ➞ g(2)",
        "f(1) should return [i for i in range(2)]",
        "f(*[1]) == 1",
        "f(**{'x': 1}) == 1",
        "f(lambda: 0) == 0",
        "f(x := 1) == 1",
        "f(1) == f'{1+1}'",
        "print(f(1)) == None",
        "For x = __import__('os') the output should be 1",
        "For x = 1 the output should be open('/etc/passwd')",
    ],
)
def test_non_literal_examples_are_refused(line: str) -> None:
    prompt = STUB.format(line=line)
    assert stated_examples(prompt) == []
    assert stated_steps(prompt) == []


@pytest.mark.parametrize(
    "table",
    [
        "Input: x = __import__('os').getpid()\n    Output: 1",
        "Input: x = [i for i in range(3)]\n    Output: 3",
        "Input: 1\n    Output: exit()",
    ],
)
def test_non_literal_input_output_tables_are_refused(table: str) -> None:
    assert stated_examples(STUB.format(line=table)) == []


@pytest.mark.parametrize(
    "prompt",
    [
        "def f(x):\n" + ("f(" + "(" * 300 + "\n") * 600,  # calls that never close
        "def f(x):\n" + ("for a" + " " * 990 + "\n") * 190,  # "For ..." lines that never say "the output"
        "def f(x):\n" + ("Input: a" + " " * 990 + "\nOutput: 1\n") * 95,
        "".join(f"def f{i}(x):\n    pass\n" for i in range(8000)),  # more functions than are looked at
        "def f(x):\n" + ("f(1) == " + "1 (" * 600 + "\n") * 100,  # values with many places to end
    ],
    ids=["open calls", "for lines", "input lines", "many functions", "many cuts"],
)
def test_a_hostile_prompt_is_read_in_bounded_time(prompt: str) -> None:
    """The prompt is client text read while holding the GIL: nothing in the reader may grow with
    the square of a line (a lazy pattern did: 11 s on the second case before it was bounded)."""
    assert len(prompt) <= MAX_PROMPT_CHARS
    start = time.perf_counter()
    stated_examples(prompt)
    assert time.perf_counter() - start < 5.0


def test_for_example_on_the_same_line_as_the_call() -> None:
    """The lead may name the example; a call in the middle of a sentence is not one."""
    prompt = (
        'def f(x):\n    """Double x.\n    For example: f(2) returns 4. So f(3) == 6\n    E.g. f(5) == 10\n    """\n'
    )
    assert [(e.source, e.expected) for e in stated_examples(prompt)] == [("f(2)", 4), ("f(5)", 10)]


@pytest.mark.slow
async def test_only_the_literal_example_runs_even_for_a_caller_with_the_tests_permission() -> None:
    """A prose example is never code to run, whoever sends it: of a literal example and a hostile
    one, the verifier runs the literal one only (the hostile one would have failed it)."""
    prompt = STUB.format(line="f(2) == 4\n    f(__import__('os').getpid()) == 4\n    f(3) ➞ 6")
    good = answer("```python\ndef f(x):\n    return 2 * x\n```")
    for metadata in ({}, {"client_code": True}):
        request = GenerationRequest(messages=(Message("user", prompt),), metadata=metadata)
        score = await CodeTestsVerifier().score(request, good)
        assert score.value == 1.0
        assert (score.details["passed"], score.details["total"]) == (2, 2)
        assert score.details["in_process"] == 0


@pytest.mark.slow
async def test_the_expected_value_is_judged_outside_the_sandbox() -> None:
    """An answer that returns an object claiming to equal everything fails: the value the worker
    reports is plain data or "an object", and the comparison happens in the checker."""
    prompt = STUB.format(line="f(1) == 2")
    forger = answer(
        "```python\nclass Any:\n    def __eq__(self, other):\n        return True\n\ndef f(x):\n    return Any()\n```"
    )
    score = await CodeTestsVerifier().score(GenerationRequest(messages=(Message("user", prompt),)), forger)
    assert score.value == 0.0
    assert score.details["failures"] == {"not_plain_data": 1}


@pytest.mark.slow
async def test_stated_examples_can_be_turned_off() -> None:
    request = requests()["HumanEval/72"]
    good = answer("```python\ndef will_it_fly(q, w):\n    return q == q[::-1] and sum(q) <= w\n```")
    on = await CodeTestsVerifier().score(request, good)
    off = await CodeTestsVerifier(stated=False).score(request, good)
    assert (on.value, on.details["total"]) == (1.0, 4)
    assert off.reason.startswith("no_tests")


# ---- committed model answers ------------------------------------------------------------------------------

# (generation key in evals/results/humaneval, item, tier, graded right, score, passed/total)
COMMITTED = [
    ("5fb8a155c1666adf008c370061145fb2", "HumanEval/68", "small", False, 0.5, (2, 4)),
    ("4ef76afb9b3d2a3a17e0f4c004191417", "HumanEval/68", "large", True, 1.0, (4, 4)),
    ("05221cfee00edcf52e40b136116c2f8d", "HumanEval/86", "large", False, 0.0, (0, 3)),
    ("03a3123cb04c50443fbf5f1139233cb4", "HumanEval/95", "small", False, 0.8, (4, 5)),
    ("f35fadb5cde478c3cc78592177f14ec7", "HumanEval/120", "small", False, 2 / 3, (2, 3)),
    ("ec6b3cdda6df598e8a739bade7f2efd9", "HumanEval/84", "small", True, 1.0, (3, 3)),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("key", "item", "tier", "right", "value", "counts"), COMMITTED, ids=[c[1] + " " + c[2] for c in COMMITTED]
)
async def test_committed_answers_are_scored_on_their_prompts_prose_examples(
    key: str, item: str, tier: str, right: bool, value: float, counts: tuple[int, int]
) -> None:
    record = committed(key)
    assert (record["item"], record["tier"]) == (item, tier)
    assert ">>>" not in prompts()[item]
    score = await CodeTestsVerifier().score(requests()[item], answer(record["text"]))
    assert score.value == pytest.approx(value)
    assert (score.details["passed"], score.details["total"]) == counts
    assert score.details["by_source"] == {"doctest": {"passed": counts[0], "total": counts[1]}}


@pytest.mark.slow
async def test_an_answer_cut_off_in_a_trailing_example_is_tested_like_the_grader_reads_it() -> None:
    """The small tier's HumanEval/94 answer ran into the token cap inside a ``print(...)`` after its
    complete function. The grader (version 2) keeps the parsing prefix; the verifier runs the same
    code and its six prose examples pass (the grader's hidden tests pass too)."""
    record = committed("54889dcac1a3753992e35e058b91195f")
    assert (record["item"], record["finish_reason"]) == ("HumanEval/94", "length")
    text = record["text"]
    assert text.rstrip().endswith("print(skjkasdkd([0, 3, 2, 1, 3, 5,")
    request = requests()["HumanEval/94"]
    program = assemble_program(request, text)
    code = extract_code(text)
    assert compiles(program) and code in program and "print(skjkasdkd" not in program
    assert compiles(build_program(prompts()["HumanEval/94"], code, "skjkasdkd"))
    score = await CodeTestsVerifier().score(request, answer(text))
    assert (score.value, score.details["total"]) == (1.0, 6)


@pytest.mark.slow
def test_the_verifier_runs_the_code_the_grader_grades_on_every_committed_answer() -> None:
    """Both read the answer with `extract_code` (a cut-off trailing line after a complete function
    dropped); on each of the 328 committed answers the verifier's program parses exactly when the
    grader's does, and holds the same extracted code."""
    rows = {r["task_id"]: r for r in read_jsonl(fetch(HUMANEVAL))}
    records = [json.loads(line) for line in GENERATIONS.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 328
    for record in records:
        row = rows[record["item"]]
        code = extract_code(record["text"])
        verifier_program = assemble_program(requests()[record["item"]], record["text"])
        grader_program = build_program(row["prompt"], code, row["entry_point"])
        assert compiles(verifier_program) == compiles(grader_program), record["key"]
        if compiles(code):
            assert code in verifier_program, record["key"]
