"""The built-in agreement rules of shadow escalation, loaded through their entry point as the
service loads them: numbers, option letters, the caller's tests in the sandbox, and text."""

from __future__ import annotations

import pytest

from router.generation import GenerationRequest, Message
from router.quality.agreement import TEXT_THRESHOLD, AgreementRegistry, normalise, text_agreement

Q = GenerationRequest(messages=(Message("user", "A question"),))


@pytest.fixture(scope="module")
def rules() -> AgreementRegistry:
    return AgreementRegistry.from_entry_points()


async def test_numbers_agree_as_numbers(rules: AgreementRegistry) -> None:
    found = await rules.compare("maths", Q, "So the total is $1,200.", "The answer is 1200")
    assert (found.agree, found.rule, found.answer, found.shadow) == (True, "number", "$1,200", "1200")
    found = await rules.compare("maths", Q, "#### 41", "#### 42")
    assert (found.agree, found.rule) == (False, "number")
    # no number in one answer: the number rule cannot read it, text decides
    assert (await rules.compare("maths", Q, "I cannot say.", "42")).rule == "text"


async def test_option_letters_agree_as_the_grader_reads_them(rules: AgreementRegistry) -> None:
    found = await rules.compare("choice", Q, "The answer is (B).", "B. Because the rest are wrong.")
    assert (found.agree, found.rule, found.answer, found.shadow) == (True, "choice", "B", "B")
    assert not (await rules.compare("choice", Q, "Answer: C", "Answer: B")).agree


@pytest.mark.slow
async def test_code_runs_the_callers_tests_only_when_the_request_carries_them(rules: AgreementRegistry) -> None:
    from verifiers import sandbox

    right = "```python\ndef add(a, b):\n    return a + b\n```"
    also_right = "def add(x, y):\n    return y + x\n"
    wrong = "```python\ndef add(a, b):\n    return a - b\n```"
    # no tests (or a caller not allowed to send them): nothing runs, the text rule decides
    plain = await rules.compare("code", Q, right, also_right)
    assert plain.rule == "text"
    forbidden = Q.with_(metadata={"tests": ["assert add(1, 2) == 3"]})  # no client_code permission
    assert (await rules.compare("code", forbidden, right, wrong)).rule == "text"
    if sandbox.available() is not None:
        pytest.skip(f"no sandbox here: {sandbox.available()}")
    allowed = Q.with_(metadata={"tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], "client_code": True})
    same = await rules.compare("code", allowed, right, also_right)
    assert (same.agree, same.rule, same.answer, same.shadow) == (True, "code_tests", "11", "11")
    differ = await rules.compare("code", allowed, right, wrong)
    assert (differ.agree, differ.answer, differ.shadow) == (False, "11", "01")


def test_text_agreement_is_normalised_similarity() -> None:
    assert normalise("  Paris, France!  ") == "paris france"
    assert text_agreement("Paris.", "paris").agree
    found = text_agreement("The capital is Paris.", "It is Lyon, I think.")
    assert not found.agree and found.rule == "text" and f"< {TEXT_THRESHOLD:.2f}" in found.detail


async def test_an_open_ended_answer_uses_text(rules: AgreementRegistry) -> None:
    assert (await rules.compare("open_ended", Q, "Hello there", "hello there!")).rule == "text"
    assert (await rules.compare(None, Q, "a", "b")).rule == "text"
