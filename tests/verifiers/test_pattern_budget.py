"""The pattern checks of one answer share one time budget (issue 26, item 8).

A per-search limit does not bound an answer: a slow pattern that still matches yields no error,
so before the budget an array of many such strings ran every search to completion. A clock is
injected for the counts; one real run checks the wall time with a generous bound.
"""

from __future__ import annotations

import json
import time

import pytest

from router.generation import Generation, GenerationRequest, Message, ResponseFormat, ToolCall, ToolSpec
from tests.support.scripted import gen
from verifiers.format import FormatVerifier
from verifiers.jsonschema_check import PATTERN_BUDGET_S, PatternBudget, first_error
from verifiers.tool_call import ToolCallVerifier

# matches "a" * 15, after tens of milliseconds of backtracking (below the per-search limit)
SLOW_MATCH = "^(?:(a|aa)+)+b|^a"
SLOW = {"type": "array", "items": {"type": "string", "pattern": SLOW_MATCH}}


class SteppingClock:
    """Each reading is `step` seconds after the one before: every search costs `step / 2`."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step / 2
        return self.now


def test_searches_stop_once_the_budget_is_spent() -> None:
    budget = PatternBudget(1.0, clock=SteppingClock(0.2))  # 0.1 s a search: ten fit
    error = first_error({"type": "array", "items": {"pattern": "^a"}}, ["a"] * 10_000, budget)
    assert error is not None and "took too long in all" in error
    assert budget.searches == 10
    # a spent budget fails the next value at once, without a search
    assert first_error({"pattern": "^a"}, "a", budget) is not None and budget.searches == 10


@pytest.mark.timeout(60)
def test_many_slow_matching_strings_cost_at_most_the_budget() -> None:
    strings = ["a" * 15] * 400  # each matches; unbounded, about 10 s of matching here
    started = time.monotonic()
    error = first_error(SLOW, strings)
    took = time.monotonic() - started
    assert error is not None and "took too long in all" in error
    assert took < PATTERN_BUDGET_S * 10  # the budget and one search's overrun, with room for a loaded box


@pytest.mark.timeout(60)
async def test_every_tool_call_of_one_answer_shares_the_budget() -> None:
    schema = json.dumps({"type": "object", "properties": {"s": SLOW}})
    tools = tuple(ToolSpec(f"t{i}", None, schema) for i in range(8))
    calls = tuple(ToolCall(f"c{i}", f"t{i}", json.dumps({"s": ["a" * 15] * 60})) for i in range(8))
    request = GenerationRequest(messages=(Message("user", "x"),), tools=tools, parallel_tool_calls=True)
    started = time.monotonic()
    score = await ToolCallVerifier().score(request, Generation("", "stop", 1, 1, None, 0.0, tool_calls=calls))
    assert score.value == 0.0 and "took too long in all" in score.reason
    assert time.monotonic() - started < PATTERN_BUDGET_S * 10


@pytest.mark.timeout(60)
async def test_the_format_verifier_bounds_an_answer() -> None:
    request = GenerationRequest(prompt="x", response_format=ResponseFormat("json_schema", SLOW, "slow"))
    started = time.monotonic()
    score = await FormatVerifier(json_schema=SLOW).score(request, gen(json.dumps(["a" * 15] * 400)))
    assert score.value == 0.0 and "took too long" in score.reason
    assert time.monotonic() - started < PATTERN_BUDGET_S * 10
