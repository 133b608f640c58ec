"""Tests whose expectation sits inside the expression are judged outside the box (issue 26, item 7).

The attack: an answer that takes over the box's reply channel and answers every request itself.
Before, ``assert abs(f(1.33) - 0.33) < 1e-6`` went to the box whole, so the forger read the
expectation in the source and answered "true", and a wrong solution scored 7/8 with ``forged: 0``.
Now the box is asked only for the leaves (``f(1.33)``), so the forger can do no better than its
own wrong ``f``; the shapes that cannot be taken apart are counted ``forgeable``.
"""

from __future__ import annotations

import ast
import asyncio
from typing import Any

import pytest

from router.generation import GenerationRequest, Message
from tests.support.scripted import gen
from verifiers.code_tests import CodeTestsVerifier
from verifiers.code_tests.steps import caller_test_steps
from verifiers.outside_judge import Failed, Judge, Opaque
from verifiers.sandbox import available

pytestmark = pytest.mark.timeout(120)
needs_box = pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")

# the task: f(x) = x - 1. Each assert holds its expectation inside the expression.
SEALED = [
    "assert abs(f(1.33) - 0.33) < 1e-6",  # tolerance
    "assert math.isclose(f(2.5), 1.5)",  # isclose
    "assert f(1) == 0 and f(3) == 2",  # and-joined
    "assert -1.5 < f(0) < -0.5",  # chained comparison
    "assert abs(f(10) - 9) <= 1e-9",  # tolerance, the other way round
    "assert round(f(2), 3) == 1.0",  # a known function around the value
    "assert f(5) - 4 == 0",  # arithmetic, then a comparison
    "assert f(100) == 99",  # the plain shape, which the wrong solution gets right
]
# the expectation is computed in the box: these are reported, not sealed
FORGEABLE = [
    "assert f(3) == ref(3)",
    "assert check(f(2), 1)",
    "assert all(f(x) == x - 1 for x in range(3))",
]
SETUP = "import math\ndef ref(x):\n    return x - 1\ndef check(a, b):\n    return abs(a - b) < 1e-9\n"

WRONG = "def f(x):\n    return x - 1 if x == 100 else x + 1\n"
RIGHT = "def f(x):\n    return x - 1\n"

# The forger knows the protocol: it answers the load request, then every later one, in protocol.
# For a request whose source holds a comparison (or reads like a tolerance check) it says "true";
# for a pair it says two equal values; anything else it evaluates with its own (wrong) f.
FORGER = (
    WRONG
    + """
import ast, json, os, sys

def _enc(v):
    if isinstance(v, bool):
        return {"t": "B", "v": v}
    if isinstance(v, int):
        return {"t": "i", "v": str(v)}
    if isinstance(v, float):
        return {"t": "f", "v": repr(v)}
    if isinstance(v, (list, tuple)):
        return {"t": "l" if isinstance(v, list) else "t", "v": [_enc(x) for x in v]}
    return {"t": "n"}

def _answer(req):
    if req.get("op") != "eval":
        return None
    src = req["source"]
    tree = ast.parse(src, mode="eval").body
    wants_truth = any(isinstance(n, (ast.Compare, ast.BoolOp)) for n in ast.walk(tree)) or any(
        w in src for w in ("isclose", "abs(", "check(", "all(")
    )
    if wants_truth:
        return True
    if isinstance(tree, ast.Tuple) and len(tree.elts) == 2:
        return (0, 0)
    return eval(src, globals())

def _forge():
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            os._exit(0)
        req = json.loads(line)
        try:
            value = _answer(req)
            reply = {"id": req["id"], "ok": True, "printed": "", "value": _enc(value), "truth": bool(value)}
        except Exception as exc:
            reply = {"id": req["id"], "ok": False, "printed": "", "exc": type(exc).__name__, "msg": ""}
        os.write(1, (json.dumps(reply) + "\\n").encode())

if __name__ != "__main__":
    os.write(1, (json.dumps({"id": sys._getframe(1).f_locals.get("rid"), "ok": True, "printed": ""}) + "\\n").encode())
    _forge()
"""
)


def chat(text: str, **metadata: object) -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", text),), metadata=metadata)


def fenced(code: str) -> str:
    return f"```python\n{code}```"


def test_each_shape_is_judged_outside_or_reported_forgeable() -> None:
    steps = caller_test_steps(SETUP + "\n".join(SEALED + FORGEABLE) + "\n", answer={"f"})
    tests = [s for s in steps if s.is_test]
    assert [s.forgeable for s in tests] == [False] * len(SEALED) + [True] * len(FORGEABLE)
    # nothing of an expectation travels to the box for the sealed shapes: only leaves do
    sent = {c.source for s in tests[: len(SEALED)] for c in s.plan() if c.judge != "outside"}
    outside = [c for s in tests[: len(SEALED)] for c in s.plan() if c.judge == "outside"]
    assert all("0.33" not in src and "1.5" not in src for src in sent)
    assert {c.source for c in outside} >= {"abs(f(1.33) - 0.33) < 1e-06", "math.isclose(f(2.5), 1.5)"}
    # the and-joined assert is two checks, as two asserts would be
    assert len(tests[2].plan()) == 2


@pytest.mark.slow
@needs_box
async def test_a_forger_scores_no_more_than_its_wrong_solution_on_sealed_shapes() -> None:
    v = CodeTestsVerifier(unit_timeout_s=3, timeout_s=20)
    sealed = chat("Write f(x) = x - 1.", tests=SETUP + "\n".join(SEALED) + "\n")
    right = await v.score(sealed, gen(fenced(RIGHT)))
    wrong = await v.score(sealed, gen(fenced(WRONG)))
    forger = await v.score(sealed, gen(fenced(FORGER)))
    assert right.value == 1.0, right
    assert wrong.details["passed"] == 1, wrong  # only f(100) == 99
    assert forger.details["passed"] <= wrong.details["passed"], forger
    assert forger.details["forgeable"] == 0 and right.details["forgeable"] == 0

    loose = chat("Write f(x) = x - 1.", tests=SETUP + "\n".join(FORGEABLE) + "\n")
    honest = await v.score(loose, gen(fenced(WRONG)))
    forged = await v.score(loose, gen(fenced(FORGER)))
    # these the forger does pass: the count says so, for the honest run and the forged one alike
    assert honest.details["passed"] == 0
    assert forged.details["passed"] == len(FORGEABLE)
    assert honest.details["forgeable"] == forged.details["forgeable"] == len(FORGEABLE)


@pytest.mark.slow
@needs_box
async def test_a_doctest_stating_true_for_a_tolerance_check_is_judged_outside() -> None:
    prompt = "Write f(x) = x - 1.\n>>> abs(f(1.33) - 0.33) < 1e-6\nTrue\n>>> f(100) == 99\nTrue\n>>> f(4)\n3\n"
    v = CodeTestsVerifier(unit_timeout_s=3, timeout_s=20)
    request = chat(prompt, client_code=True)  # only a trusted caller's doctests may be expressions
    right = await v.score(request, gen(fenced(RIGHT)))
    wrong = await v.score(request, gen(fenced(WRONG)))
    forger = await v.score(request, gen(fenced(FORGER)))
    assert right.value == 1.0, right
    assert wrong.details["passed"] == 1
    assert forger.details["passed"] <= wrong.details["passed"], forger
    assert right.details["forgeable"] == 0


# ------------------------------------------------------------------ the evaluator, without a box


def run(judge: Judge, source: str, values: dict[str, Any]) -> tuple[Any, list[str]]:
    asked: list[str] = []

    async def ask(leaf: str) -> Any:
        asked.append(leaf)
        if leaf not in values:
            raise Failed("exception")
        return values[leaf]

    return asyncio.run(judge.value(ast.parse(source, mode="eval").body, ask)), asked


@pytest.mark.slow
@needs_box
async def test_a_huge_integer_from_the_box_does_not_hold_the_event_loop() -> None:
    """The answer returns a 300,000-digit hex string; the test squares it and takes it modulo itself
    less one, here, outside the box. Integer arithmetic holds the interpreter's lock throughout: before
    the cap the event loop stalled for seconds (minutes at the reply's 1 MiB). Seen from the loop."""
    answer = fenced("def f(x):\n    return 'f' * 300_000\n")
    request = chat("Write f.", tests="assert (int(f(1), 16) * int(f(1), 16)) % (int(f(1), 16) - 1) >= 0\n")
    lags: list[float] = []

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(0.05)
            lags.append(loop.time() - start - 0.05)

    tick = asyncio.create_task(ticker())
    try:
        score = await CodeTestsVerifier(timeout_s=20).score(request, gen(answer))
    finally:
        tick.cancel()
    assert score.details["failures"] == {"too_large": 1}, score  # first: it says what the box did
    # no tick at all: the score came back within one 50 ms tick, the loop never held
    assert max(lags, default=0.0) < 2.0, f"the event loop stalled {max(lags):.1f} s"


def test_leaves_are_asked_in_order_and_only_when_python_would() -> None:
    judge = Judge({"f", "g"})
    assert run(judge, "abs(f(1.33) - 0.33) < 1e-6", {"f(1.33)": 0.33 + 1e-9}) == (True, ["f(1.33)"])
    assert run(judge, "abs(f(1.33) - 0.33) < 1e-6", {"f(1.33)": 2.33})[0] is False
    # a chain evaluates its middle once and stops at the first false link
    assert run(judge, "0 < f(1) < g(1) < 5", {"f(1)": 3, "g(1)": 2}) == (False, ["f(1)", "g(1)"])
    assert run(judge, "f(1) < 0 < g(1)", {"f(1)": 3}) == (False, ["f(1)"])
    # or stops at the first true value
    assert run(judge, "f(0) == 1 or g(0) == 1", {"f(0)": 1}) == (True, ["f(0)"])
    assert run(judge, "math.isclose(f(2), 1.41, rel_tol=0.01)", {"f(2)": 1.414})[0] is True
    assert run(judge, "isinstance(f(1), (int, float)) and f(1) is not None", {"f(1)": 2.0})[0] is True
    assert run(judge, "sorted(f(3)) == [1, 2, 3]", {"f(3)": [3, 1, 2]})[0] is True
    # the builtins here mean what they mean, whatever the answer made of them in the box
    assert run(Judge({"f"}), "len(f(1)) == 2", {"f(1)": "ab"}) == (True, ["f(1)"])


@pytest.mark.parametrize(
    ("source", "values", "kind"),
    [
        ("f(1) * 10 ** 9 == []", {"f(1)": [0]}, "too_large"),
        ("2 ** f(1) > 0", {"f(1)": 10**7}, "too_large"),
        ("len(set(f(1))) == 1", {"f(1)": list(range(1000))}, "too_large"),
        ("round(f(1), -10 ** 9) == 0", {"f(1)": 10**100}, "too_large"),
        ("f(1) * f(1) % 7 == 0", {"f(1)": 1 << 60_000}, "too_large"),
        ("int(f(1), 16) % 7 == 0", {"f(1)": "f" * 30_000}, "too_large"),
        ("sum(f(1), []) == []", {"f(1)": [[1]] * 10}, "exception"),
        ("'%999999999d' % f(1) == ''", {"f(1)": 1}, "exception"),
        ("abs(f(1) - 1) < 1e-6", {"f(1)": Opaque("Any", "<Any>")}, "not_plain_data"),
        ("f(1) + 1 < 'a'", {"f(1)": 1}, "exception"),
        ("f(1) == 1 and g(1)", {"f(1)": 1}, "exception"),  # g(1) raised in the box
    ],
)
def test_work_here_is_bounded_and_failures_have_a_kind(source: str, values: dict[str, Any], kind: str) -> None:
    with pytest.raises(Failed) as caught:
        run(Judge({"f", "g"}), source, values)
    assert caught.value.kind == kind


def test_forgeable_shapes() -> None:
    judge = Judge({"f"})

    def forgeable(src: str) -> bool:
        return judge.forgeable(ast.parse(src, mode="eval").body)

    assert not forgeable("f(1) == 2")
    assert not forgeable("f(1)")  # the box cannot tell `assert f(1)` from `assert not f(1)`
    assert not forgeable("not f(1)")
    assert not forgeable("x == 9")  # a name the setup bound, against a literal
    assert not forgeable("f(1).real == 2 and f(2)[0] == 1")
    assert forgeable("x")  # a name's truth: whatever the setup stored, expectations included
    assert forgeable("f(1) == g(1)")
    assert forgeable("g(f(1), 2)")
    assert forgeable("abs(f(1) - g(1)) < 1e-9")
    assert forgeable("math.isclose(f(1), g(1))")
    assert forgeable("any(f(x) > 1 for x in [1])")
