from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from router.errors import DeadlineError
from router.generation import GenerationRequest, Message
from tests.support.scripted import ScriptedBackend, gen
from verifiers.base import VerifierContext
from verifiers.consistency import SelfConsistencyVerifier

REQ = GenerationRequest(messages=(Message("user", "Tom has 3 apples and buys 4. How many?"),), max_tokens=64)


def answers(*texts: str) -> ScriptedBackend:
    """A backend whose i-th sample answers texts[i]."""
    it: Iterator[str] = iter(texts)
    return ScriptedBackend("small", lambda request: next(it), delay_s=0.05)


async def test_score_is_the_fraction_of_samples_that_agree() -> None:
    backend = answers("3 + 4 = 7\n#### 7", "The answer is 7.00", "#### 8", "Answer: $7")
    v = SelfConsistencyVerifier(k=4, ctx=VerifierContext("small", backend, {"small": backend}))
    s = await v.score(REQ, gen("He has 3 + 4 = 7 apples.\n#### 7"))
    assert s.value == pytest.approx(3 / 4)
    assert s.details["agree"] == 3
    assert s.details["sample_answers"] == ["7", "7.00", "8", "$7"]
    assert "3/4" in s.reason


async def test_samples_run_concurrently_with_distinct_seeds_at_the_temperature() -> None:
    backend = answers("#### 7", "#### 7", "#### 7")
    v = SelfConsistencyVerifier(k=3, temperature=0.9, seed=10, ctx=VerifierContext("small", backend, {}))
    s = await v.score(REQ, gen("#### 7"))
    assert s.value == 1.0
    assert backend.most_in_flight == 3
    assert sorted(r.seed for r in backend.requests) == [11, 12, 13]
    assert {r.temperature for r in backend.requests} == {0.9}
    assert all(r.messages == REQ.messages and r.max_tokens == 64 for r in backend.requests)


async def test_cost_carries_the_extra_tokens_and_time_of_the_sampling_tier() -> None:
    small = answers("#### 1")
    big = ScriptedBackend("big", lambda r: "#### 7", prompt_tokens=30, completion_tokens=11, busy_s=None, delay_s=0.0)
    v = SelfConsistencyVerifier(k=2, tier="big", ctx=VerifierContext("small", small, {"small": small, "big": big}))
    s = await v.score(REQ, gen("#### 7"))
    assert s.value == 1.0
    assert small.requests == []
    assert (s.cost.prompt_tokens, s.cost.completion_tokens, s.cost.tier) == (60, 22, "big")
    assert s.cost.seconds == pytest.approx(2 * 0.5)  # no busy_s: the latency counts


async def test_text_mode_folds_case_and_whitespace() -> None:
    backend = answers("Paris", "  paris\n", "Lyon")
    v = SelfConsistencyVerifier(k=3, extract="text", ctx=VerifierContext("small", backend, {}))
    s = await v.score(REQ, gen("PARIS"))
    assert s.value == pytest.approx(2 / 3)


async def test_no_answer_in_the_candidate_costs_nothing() -> None:
    backend = answers()
    v = SelfConsistencyVerifier(ctx=VerifierContext("small", backend, {}))
    s = await v.score(REQ, gen("I am not sure."))
    assert s.value == 0.0
    assert "no answer" in s.reason
    assert backend.requests == [] and s.cost.completion_tokens == 0


async def test_any_failed_sample_is_no_verdict_but_its_siblings_are_charged() -> None:
    calls = 0

    def flaky(request: GenerationRequest) -> str:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise DeadlineError("tier 'small' did not finish before the deadline")
        return "#### 7"

    backend = ScriptedBackend("small", flaky, completion_tokens=5)
    v = SelfConsistencyVerifier(k=3, ctx=VerifierContext("small", backend, {}))
    s = await v.score(REQ, gen("#### 8"))
    # two samples disagree with the candidate, but one of three is missing: not a 0 (an eval run
    # once stored such timeouts under load as verdicts), and not a fraction over two
    assert s.value is None and s.is_unavailable
    assert "1 of 3 samples failed" in s.reason and len(s.details["errors"]) == 1
    assert s.cost.completion_tokens == 10  # the two that ran are paid for

    def down(request: GenerationRequest) -> str:
        raise ConnectionError("down")

    dead = ScriptedBackend("small", down)
    s = await SelfConsistencyVerifier(ctx=VerifierContext("small", dead, {})).score(REQ, gen("#### 7"))
    assert s.is_unavailable and "3 of 3 samples failed" in s.reason


async def test_missing_backend_is_a_reject_at_score_time() -> None:
    v = SelfConsistencyVerifier(tier="big", ctx=VerifierContext("small", None, {}))
    s = await v.score(REQ, gen("#### 7"))
    assert s.value == 0.0 and "no backend" in s.reason


async def test_cancellation_propagates() -> None:
    backend = ScriptedBackend("small", lambda r: "#### 7", delay_s=5)
    v = SelfConsistencyVerifier(ctx=VerifierContext("small", backend, {}))
    task = asyncio.create_task(v.score(REQ, gen("#### 7")))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"k": 0}, ValueError),
        ({"k": 2.5}, TypeError),
        ({"extract": "code"}, ValueError),
        ({"temperature": -1}, ValueError),
        ({"timeout_s": float("nan")}, ValueError),
        ({"tier": 3}, TypeError),
    ],
)
def test_bad_params(params: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        SelfConsistencyVerifier(**params)
