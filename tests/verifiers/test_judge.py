from __future__ import annotations

import pytest

from router.generation import GenerationRequest, Message
from tests.support.scripted import ScriptedBackend, gen
from verifiers.base import VerifierContext
from verifiers.judge import RUBRIC, JudgeVerifier, parse_judge_score

REQ = GenerationRequest(
    messages=(Message("system", "Be brief."), Message("user", "What is the capital of France?")), max_tokens=32
)


def judge_says(reply: str, **kw: object) -> tuple[JudgeVerifier, ScriptedBackend]:
    backend = ScriptedBackend("big", lambda r: reply, prompt_tokens=200, completion_tokens=40, busy_s=1.5, **kw)  # type: ignore[arg-type]
    small = ScriptedBackend("small", lambda r: "unused")
    return JudgeVerifier(tier="big", ctx=VerifierContext("small", small, {"small": small, "big": backend})), backend


@pytest.mark.parametrize(
    ("reply", "grade"),
    [
        ("Correct and concise.\nSCORE: 9", 9.0),
        ("score: 10", 10.0),
        ("**SCORE:** 7", 7.0),
        ("Score = 3/10", 3.0),
        ("First I'd say SCORE: 2, but on reflection...\nSCORE: 8", 8.0),
        ("SCORE: 0", 0.0),
        ("SCORE: 11", None),
        ("It deserves a 9.", None),
        ("", None),
    ],
)
def test_parse_judge_score(reply: str, grade: float | None) -> None:
    assert parse_judge_score(reply) == grade


async def test_the_judge_grades_with_the_rubric_and_its_cost_counts() -> None:
    v, backend = judge_says("The answer names Paris, which is right.\nSCORE: 9")
    s = await v.score(REQ, gen("Paris."))
    assert s.value == pytest.approx(0.9)
    assert s.details["grade"] == 9.0
    assert (s.cost.prompt_tokens, s.cost.completion_tokens, s.cost.seconds, s.cost.tier) == (200, 40, 1.5, "big")
    [sent] = backend.requests
    assert sent.messages is not None and sent.messages[0].content == RUBRIC
    body = sent.messages[1].content
    assert "What is the capital of France?" in body and "Paris." in body and "SCORE: N" in body
    assert sent.temperature == 0.0


async def test_an_unparseable_reply_is_a_reject() -> None:
    v, _ = judge_says("Looks fine to me!")
    s = await v.score(REQ, gen("Paris."))
    assert s.value == 0.0
    assert s.reason == "judge reply did not parse"
    assert s.cost.completion_tokens == 40  # it still cost something


async def test_a_missing_tier_fails_at_score_time_not_at_creation() -> None:
    v = JudgeVerifier(tier="big", ctx=VerifierContext("small", None, {}))  # backends not filled yet
    s = await v.score(REQ, gen("Paris."))
    assert s.value == 0.0 and "'big' is not configured" in s.reason
    with pytest.raises(TypeError):
        JudgeVerifier()  # type: ignore[call-arg]


async def test_a_failing_judge_is_a_reject_with_its_reason() -> None:
    def down(request: GenerationRequest) -> str:
        raise TimeoutError("judge took too long")

    backend = ScriptedBackend("big", down)
    v = JudgeVerifier(tier="big", ctx=VerifierContext("small", None, {"big": backend}))
    s = await v.score(REQ, gen("Paris."))
    assert s.value == 0.0 and "TimeoutError" in s.reason


async def test_long_inputs_are_clipped_to_fit() -> None:
    v, backend = judge_says("SCORE: 5")
    await JudgeVerifier(tier="big", max_chars=200, ctx=v.ctx).score(
        GenerationRequest(prompt="Q" * 10_000), gen("start " + "A" * 10_000 + " end")
    )
    body = backend.requests[0].messages[1].content  # type: ignore[index]
    assert len(body) < 1000
    assert "characters left out" in body and "start" in body and "end" in body
