"""`steps`: the worked arithmetic of an answer re-checked, on answers with known steps (right,
wrong, none, cut off) and on hostile ones (a power too large to compute, a flood of equations, a
step that is text dressed as arithmetic); it reads nothing but the answer."""

from __future__ import annotations

import time

import pytest

from router.generation import Generation, GenerationRequest, Message
from verifiers.base import VerifierContext
from verifiers.steps import StepsVerifier, make_steps, read_steps

REQUEST = GenerationRequest(messages=(Message("user", "Janet's ducks lay 16 eggs per day..."),))


def answer(text: str) -> Generation:
    return Generation(
        text=text, finish_reason="stop", prompt_tokens=1, completion_tokens=1, token_logprobs=None, latency_s=0.0
    )


async def score(text: str) -> float | None:
    return (await StepsVerifier().score(REQUEST, answer(text))).value


async def test_right_steps_score_one() -> None:
    text = (
        "Janet starts with 16 eggs per day.\nShe eats 3 for breakfast, so she has 16 - 3 = 13 eggs left.\n"
        "She sells these 9 eggs at the farmers' market for 9 * $2 = $<<9*2=18>>18.\n#### 18"
    )
    assert await score(text) == 1.0
    steps = read_steps(text)
    assert [(s.expression, s.written) for s in steps] == [("9*2", "18"), ("16 - 3", "13"), ("9 * $2", "18")]


async def test_a_wrong_step_lowers_the_score_by_its_share() -> None:
    s = await StepsVerifier().score(REQUEST, answer("5 + 7 = 12 apples. Then 12 * 3 = 38 in all."))
    assert s.value == pytest.approx(0.5)
    assert s.details == {"steps": 2, "wrong": 1, "first_wrong": "12 * 3 = 38"}
    assert await score("<<12*3=38>>") == 0.0


async def test_chains_fractions_rounding_and_currency() -> None:
    assert await score("So 2 + 1/2 = 5/2 = <<5/2=2.5>>2.5 bolts.") == 1.0
    assert await score("Each gets 100/3 = 33.33 dollars") == 1.0  # rounded to the decimals written
    assert await score("Each gets 100/3 = 33 dollars") == 0.0  # not a rounding at two decimals
    assert await score("$80,000 + $50,000 = $130,000 in all") == 1.0
    assert await score("60 x 0.13 = 7.8") == 1.0  # x between numbers is a times sign


async def test_an_answer_without_steps_abstains() -> None:
    for text in ("", "The answer is 18.", "#### 18", "3 sprints * 60 meters = 180 meters", "x = 5", "13 = 13"):
        s = await StepsVerifier().score(REQUEST, answer(text))
        assert s.value is None, text
    # a cut-off step (nothing after its =, or a number cut in its thousands) is not read
    assert await score("The value is 80,000 + 50,000 = $<<80000+50000=130000>>130,00") == 1.0  # the annotation only
    assert len(read_steps("80,000 + 50,000 = ")) == 0


async def test_hostile_answers_are_bounded_and_never_crash() -> None:
    started = time.monotonic()
    assert await score("2^99999999 = 1") is None  # too large to compute: not a step it reads
    assert await score("(" * 500 + "1+1" + ")" * 500 + " = 2") is None  # nested past the bound
    assert await score("1/0 = 5") is None
    flood = " ".join(f"{i} + 1 = {i + 1}." for i in range(5000))
    s = await StepsVerifier().score(REQUEST, answer(flood))
    assert s.value == 1.0 and s.details["steps"] == 64  # at most max_steps read
    assert await score("import os; os.system('rm -rf /') = 0") is None  # text, not arithmetic, is never run
    assert await score("__import__('os') + 1 = 2") is None  # its arithmetic tail, "+ 1", computes nothing
    # a side longer than a step's is read only to its last MAX_SIDE characters: "1+...+1" past the
    # evaluator's token bound is no step, and it costs no more than a short one
    assert await score("1+" * 10_000 + "1 = 10001") is None
    assert time.monotonic() - started < 5


def test_params_are_checked() -> None:
    ctx = VerifierContext(tier="small")
    assert make_steps({}, ctx).name == "steps"
    with pytest.raises(TypeError):
        make_steps({"max_chars": "many"}, ctx)
    with pytest.raises(ValueError):
        make_steps({"max_steps": 0}, ctx)
    with pytest.raises(TypeError):
        make_steps({"unknown": 1}, ctx)
