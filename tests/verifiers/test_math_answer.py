from __future__ import annotations

import pytest

from router.generation import GenerationRequest
from tests.support.scripted import gen
from verifiers.math_answer import (
    MathAnswerVerifier,
    answers_agree,
    extract_answer,
    numbers_equal,
    parse_number,
)

REQ = GenerationRequest(prompt="Natalia sold clips to 48 of her friends in April, ...")


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("She makes 9 * 2 = $18 every day.\n#### 18", "18"),
        ("#### 1,000", "1,000"),
        # a small model running on into an invented next question: the first #### closes the answer
        ("#### 18\n\nQuestion: Tom has 3 apples.\nAnswer: 3 + 4 = 7\n#### 7", "18"),
        ("So x = 4. \\boxed{\\frac{3}{4}} is wrong, rather \\boxed{-5}.", "-5"),
        ("\\boxed{\\text{\\{1, 2\\}}}", "\\text{\\{1, 2\\}}"),
        ("The answer is 3.5.", "3.5"),
        ("the answer is $1,234.56.", "$1,234.56"),
        ("The answer is 42 because 6 * 7 = 42.", "42"),
        ("Final Answer: The final answer is $18$. I hope it is correct.", "18"),
        ("**Answer:** 42 eggs", "42 eggs"),
        ("First I thought the answer is 5.\nAnswer: 6", "6"),
        ("Answer: blue", "blue"),
        ("ANSWER: -7", "-7"),
        ("No marker at all: 5 and 7", None),
        ("", None),
        ("Answer:   ", None),
    ],
)
def test_extract_answer(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer


def test_the_last_number_only_on_request() -> None:
    text = "Adding 5 and 7 gives 12 apples."
    assert extract_answer(text) is None
    assert extract_answer(text, fallback_last_number=True) == "12"
    assert extract_answer("It costs $1,250 in total", fallback_last_number=True) == "$1,250"
    # a marker still wins over the last number
    assert extract_answer("#### 3\nthen 9 more", fallback_last_number=True) == "3"


@pytest.mark.parametrize(
    ("s", "value"),
    [
        ("18", 18.0),
        ("  7  ", 7.0),
        ("1,234", 1234.0),
        ("12,345,678.9", 12345678.9),
        ("-42", -42.0),
        ("−3", -3.0),  # unicode minus
        ("$18.00", 18.0),
        ("-$5", -5.0),
        ("$-5", -5.0),
        ("\\$25.50", 25.5),
        ("$\\$18$", 18.0),
        ("25%", 25.0),
        ("100 percent", 100.0),
        ("3/4", 0.75),
        ("1 3/4", 1.75),
        ("\\frac{3}{4}", 0.75),
        ("-\\dfrac{1}{2}", -0.5),
        (".5", 0.5),
        ("2.", 2.0),
        ("1e3", 1000.0),
        ("x = 5", 5.0),
        ("10 + 8 = 18", 18.0),
        ("about 7", 7.0),
        ("18 eggs", 18.0),
        ("5 km/h", 5.0),
        ("\\text{18 dollars}", 18.0),
        ("1{,}000", 1000.0),
        ("**18**", 18.0),
        ("\\(2\\)", 2.0),
        ("7.", 7.0),
        # a final answer stated in a sentence with exactly one number
        ("Each child got 5 books.", 5.0),
        ("Each child got $1,250 in the end!", 1250.0),
        ("So every well-known child got 2.5 pies", 2.5),
        ("He lost -5 dollars", -5.0),
        ("Each gets 3/4 of a pie", 0.75),
    ],
)
def test_parse_number_reads_numbers(s: str, value: float) -> None:
    got = parse_number(s)
    assert got is not None and got == pytest.approx(value)


@pytest.mark.parametrize(
    "s",
    [
        "",
        "five",
        "blue",
        "3 apples and 4 pears",
        "1,23",
        "--5",
        "1/0",
        "n/a",
        "1.2.3",
        None,
        "inf",
        "nan",
        # a sentence with two numbers, or a number inside an expression or a word, is not read
        "Each child got 5 books, so 15 in all.",
        "Each of the 3 children got 5 books",
        "Each child got five books.",
        "C - 80",
        "x + 5",
        "a 5-year-old got them",
        "x^2 books",
    ],
)
def test_parse_number_refuses_non_numbers(s: str | None) -> None:
    assert parse_number(s) is None


def test_a_stated_sentence_after_the_hashes_is_graded_as_its_number() -> None:
    from evals.grading import grade_numeric

    text = "15 books shared by 3 children is 15 / 3 = 5.\n#### Each child got 5 books."
    assert extract_answer(text) == "Each child got 5 books"
    assert grade_numeric(text, "5").correct
    assert not grade_numeric(text.replace("5 books.", "5 books, 15 in all."), "5").correct


def test_equality_of_answers() -> None:
    assert numbers_equal(0.1 + 0.2, 0.3)
    assert not numbers_equal(18.0, 18.01)
    assert not numbers_equal(None, 1.0)
    assert answers_agree("18", "$18.00")
    assert answers_agree("3/4", "0.75")
    assert answers_agree("Blue", "blue.")
    assert not answers_agree("18", "blue")
    assert not answers_agree("18", "19")
    assert not answers_agree(None, "18")


async def test_verifier_scores_numeric_partial_and_missing() -> None:
    v = MathAnswerVerifier()
    numeric = await v.score(REQ, gen("48 / 2 = 24 in May, 48 + 24 = 72.\n#### 72"))
    assert numeric.value == 1.0
    assert numeric.details["number"] == 72.0 and numeric.details["marker"] == "####"
    partial = await v.score(REQ, gen("The answer is: a lot of clips."))
    assert partial.value == pytest.approx(0.3)
    assert "not a number" in partial.reason
    none = await v.score(REQ, gen("She sold 72 clips altogether"))
    assert none.value == 0.0
    assert "no final answer" in none.reason


async def test_verifier_params() -> None:
    lenient = MathAnswerVerifier(non_numeric=0.0, fallback_last_number=True)
    assert (await lenient.score(REQ, gen("She sold 72 clips altogether"))).value == 1.0
    assert (await lenient.score(REQ, gen("Answer: many"))).value == 0.0
    with pytest.raises(ValueError):
        MathAnswerVerifier(non_numeric=2.0)
    with pytest.raises(TypeError):
        MathAnswerVerifier(fallback_last_number="yes")  # type: ignore[arg-type]
