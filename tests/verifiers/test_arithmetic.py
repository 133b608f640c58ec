"""The `arithmetic` verifier: exact where a request is plain arithmetic, abstaining elsewhere, bounded
against hostile prompts; and, in the default config's maths policy, the README's first example
answered by the small tier when right and escalated when wrong."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path

import pytest

from router import policy
from router.backends.base import Backend
from router.config import load_settings
from router.engine import Engine
from router.generation import Delta, Generation, GenerationRequest, Message
from verifiers.arithmetic import ArithmeticVerifier, Unsupported, evaluate, expression_of
from verifiers.base import VerifierContext
from verifiers.builtins import BUILTINS

README_QUESTION = "What is 17 * 3?"
SMALL_RIGHT = "The product of 17 and 3 is 51."  # the small tier's answer on the default config
SMALL_CONFIDENCE = 0.878  # its mean token confidence: under the maths threshold 0.91


def ask(text: str) -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", text),), max_tokens=64)


def answer(text: str, finish_reason: str = "stop", confidence: float = 0.9) -> Generation:
    words = max(1, len(text.split()))
    return Generation(text, finish_reason, 10, words, (math.log(confidence),) * words, 0.1)  # type: ignore[arg-type]


def score(question: str, reply: str, finish_reason: str = "stop") -> float | None:
    return asyncio.run(ArithmeticVerifier().score(ask(question), answer(reply, finish_reason))).value


@pytest.mark.parametrize(
    ("question", "reply", "expected"),
    [
        (README_QUESTION, SMALL_RIGHT, 1.0),
        (README_QUESTION, "The product of 17 and 3 is 52.", 0.0),
        (README_QUESTION, "17 * 3 = 51", 1.0),
        (README_QUESTION, "\\boxed{51}", 1.0),
        (README_QUESTION, "I cannot do that.", 0.0),  # no number stated: not an answer to arithmetic
        ("Calculate (3 + 4) * 2", "14", 1.0),
        ("what's 2^10?", "2^10 = 1024.", 1.0),
        ("whats 12 x 12", "144", 1.0),
        ("What does 7 * 8 equal?", "56", 1.0),
        ("What is 3 - 5?", "3 - 5 = -2", 1.0),
        ("What is -2^2?", "-4", 1.0),  # the power binds before the sign, as written in mathematics
        ("What is 2 ** 3 ** 2?", "512", 1.0),  # right-associative
        ("What is 7/2?", "3.5", 1.0),
        ("What is 1/3?", "0.333", 1.0),  # correctly rounded to the decimals it writes
        ("What is 1/3?", "0.3", 0.0),  # one decimal is not enough to call it the value
        ("What is 1,000 * 3?", "3,000", 1.0),
        # exact past a float's 53 bits: the last digit counts
        ("What is 123456789 * 987654321?", "121932631112635269", 1.0),
        ("What is 123456789 * 987654321?", "121932631112635268", 0.0),
        # not plain arithmetic: abstain, and the policy's other verifiers decide
        ("Janet has 3 apples and buys 4 more. How many does she have?", "7", None),
        ("What is 17 * 3? Explain your steps.", "51", None),
        ("What is 5?", "5", None),
        ("What is x + 3?", "3", None),
        ("What is 2^0.5?", "1.414", None),
        ("What is 10 / 0?", "undefined", None),
        ("What is 0^0?", "1", None),
        ("Solve the following math problem.\n\nWhat is 17 * 3?", "51", None),
    ],
)
def test_scores(question: str, reply: str, expected: float | None) -> None:
    assert score(question, reply) == expected


def test_a_cut_off_answer_is_read_by_what_it_states() -> None:
    looping = "Let me compute 17 * 3 step by step: 17 + 17 = 34, 34 + 17"
    assert score(README_QUESTION, looping, "length") == 0.0  # its last number is where it stopped
    assert score(README_QUESTION, "The answer is 51. To check: 51 / 3 = 17, 17", "length") == 1.0


def test_the_evaluator_is_exact() -> None:
    assert evaluate("0.1 + 0.2") == Fraction(3, 10)
    assert evaluate("(1 + 2) * (3 - 4) / 6") == Fraction(-1, 2)
    assert evaluate("2^-2") == Fraction(1, 4)
    assert expression_of("Please calculate: 6 × 7 =?") == "6 × 7"
    assert evaluate("6 × 7 ÷ 2 − 1") == 20
    for text in ("1 +", "(1 + 2", "1 2", "1 +* 2", "1,23 + 4", "2(3)", "١ + ٢"):  # the last: Arabic-Indic digits
        with pytest.raises(Unsupported):
            evaluate(text)


HOSTILE = [
    "(" * 100_000 + "1" + ")" * 100_000,  # deep nesting, far past any length bound
    "(" * 30 + "1" + ")" * 30 + " + 1",  # deep nesting inside the length bound
    "-" * 300 + "1 + 1",  # a tower of signs
    "9^9^9^9^9",  # a power tower: 9^(9^(...)) would never finish
    "2^-99999",
    "(10^100)^100",
    "10^4000 * 10^4000",
    "1/3^4096",
    "9" * 39 + " * " + "9" * 39 + " * " + "9" * 39,
    "1" * 10_000_000 + " + 1",  # ten megabytes of digits
    " + ".join(["1"] * 1000),
]


@pytest.mark.parametrize("expression", HOSTILE, ids=lambda e: e[:24])
def test_a_hostile_prompt_neither_hangs_nor_crashes_it(expression: str) -> None:
    started = time.process_time()
    value = score(f"What is {expression}?", "1")
    assert value in (None, 0.0)  # abstains past a bound, or computes within them and disagrees
    assert time.process_time() - started < 2.0  # microseconds in fact; generous for a loaded machine


@pytest.mark.parametrize(
    "reply",
    ["0." + "0" * 5000 + "1", "5" * 5000, "51" + " 51" * 20_000, "\\boxed{" * 2000 + "51"],
    ids=["long decimal", "long integer", "many numbers", "unclosed boxes"],
)
def test_a_strange_answer_neither_hangs_nor_crashes_it(reply: str) -> None:
    started = time.process_time()
    assert score(README_QUESTION, reply) in (None, 0.0, 1.0)
    assert time.process_time() - started < 5.0


def test_it_is_registered_like_the_other_verifiers() -> None:
    made = BUILTINS["arithmetic"]({}, VerifierContext(tier="small"))
    assert made.name == "arithmetic"
    with pytest.raises(TypeError):
        BUILTINS["arithmetic"]({"precision": 3}, VerifierContext(tier="small"))


class Says(Backend):
    """A tier that answers one fixed text at a given mean token confidence."""

    def __init__(self, name: str, text: str, confidence: float) -> None:
        super().__init__(name)
        self.text, self.confidence, self.calls = text, confidence, 0

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        self.calls += 1
        yield Delta(self.text)
        yield answer(self.text, confidence=self.confidence)


async def _served_by(small_text: str, small_confidence: float) -> tuple[str, list[str]]:
    """Which tier answers the README's question under the default config's own policies."""
    backends = {"small": Says("small", small_text, small_confidence), "large": Says("large", "51", 0.99)}
    engine = Engine.from_settings(load_settings(), backends=backends)
    await engine.start()
    try:
        result = await engine.cascade.run(ask(README_QUESTION))
    finally:
        await engine.close()
    return result.final.tier, [a.tier for a in result.attempts]


async def test_the_readme_example_stays_small_when_right_and_escalates_when_wrong() -> None:
    assert await _served_by(SMALL_RIGHT, SMALL_CONFIDENCE) == ("small", ["small"])
    # a wrong product escalates however sure the small model is of it
    assert await _served_by("The product of 17 and 3 is 52.", 0.999) == ("large", ["small", "large"])
    # a question it does not compute is judged as before, by mean confidence alone
    backends = {"small": Says("small", "7", SMALL_CONFIDENCE), "large": Says("large", "7", 0.99)}
    engine = Engine.from_settings(load_settings(), backends=backends)
    await engine.start()
    try:
        result = await engine.cascade.run(ask("Janet has 3 apples and buys 4 more. How many does she have?"))
    finally:
        await engine.close()
    assert result.final.tier == "large" and result.task is not None and result.task.task == "maths"


def test_the_readme_shows_what_the_default_policy_computes() -> None:
    """The README's `tierroute` object for its first example: the arithmetic score and reason are
    what the verifier gives the answer shown, and the combined score is the default maths policy's
    weighted mean of the two scores shown, against the default threshold."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in readme.split("```json\n")[1:]]
    shown = json.loads(next(b for b in blocks if '"task": "maths"' in b))
    attempt = shown["attempts"][0]
    said = asyncio.run(ArithmeticVerifier().score(ask(README_QUESTION), answer("17 * 3 equals 51.")))
    assert attempt["scores"]["arithmetic"] == {"score": said.value, "reason": said.reason}
    maths = policy.task_policy(load_settings().tier("small"), "maths")
    weights = {spec.name: spec.weight for spec in maths.verifiers}
    members = [(attempt["scores"][name]["score"], weights[name]) for name in ("arithmetic", "confidence")]
    combined = policy.combine(members, maths.combine)
    assert combined is not None and round(combined, 5) == attempt["score"]
    assert attempt["threshold"] == maths.threshold and attempt["accepted"] is policy.accepts(combined, maths.threshold)
    assert attempt["scores"]["confidence"]["score"] < maths.threshold  # confidence alone would have escalated it
