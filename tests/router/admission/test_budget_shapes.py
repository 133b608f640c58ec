"""No request shape takes a key past its budget: `n` choices, tools, a tool-call history, a
response_format schema, verifier work that generates, and bursts of them all in flight at once.

Each test runs the real service on loopback in front of an OpenAI-compatible upstream that bills
every request what its shape lets it bill (`budget_helpers.billing`: as a real tokenizer would,
and as much as the service would accept), fires a burst against a key with a small budget, and
reads the key's spend back from the ledger. The reservation is each request's worst case, so the
spend never passes the budget; and it is not so loose that the budget goes unused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from router.api.app import create_app
from router.config import load_settings
from tests.support.accounting import read_ledger
from tests.support.budget import Mode, billing, budget_config, burst, remote_tier, spent
from tests.support.fault_upstream import FaultUpstream
from tests.support.servers import UvicornThread

MODES = ["realistic", "greedy"]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    with FaultUpstream() as server:
        yield server


def run_burst(
    tmp: Path, upstream: FaultUpstream, mode: Mode, budget: float, bodies: list[dict[str, Any]], tiers: str = ""
) -> tuple[list[int], float, list[float]]:
    """The statuses the burst got, the key's spend in the ledger, and each served request's cost."""
    upstream.default = billing(mode)
    cfg, keys = budget_config(tmp, {"k": {"usd_per_day": budget}}, tiers or remote_tier("large", upstream.base_url))
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        responses = asyncio.run(burst(srv.url, keys["k"], bodies))
    statuses = [r.status_code for r in responses]
    for r in responses:
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "insufficient_quota"
    rows = [e for e in read_ledger(tmp / "ledger.sqlite3").values() if e.key_id == "k"]
    assert len(rows) == statuses.count(200)  # every served request is recorded, and only those
    return statuses, spent(tmp / "ledger.sqlite3", "k"), [e.cost_usd for e in rows]


def chat(content: str, *, max_tokens: int = 16, stream: bool = False, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "large",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        **extra,
    }
    if stream:
        body["stream"] = True
    return body


def assert_within(statuses: list[int], total: float, costs: list[float], budget: float, *, served: bool) -> None:
    assert set(statuses) <= {200, 429}, statuses
    assert total <= budget * (1 + 1e-9), f"spent ${total:.6f} of a ${budget} budget"
    if served:
        assert 200 in statuses  # the budget is not reserved away: what fits is served


@pytest.mark.parametrize("mode", MODES)
def test_n_choices_are_reserved_n_times(tmp_path: Path, upstream: FaultUpstream, mode: Mode) -> None:
    # the attack: two of these both passed a $0.01 budget and cost $0.0787
    attack = {**chat("Write a long story.", max_tokens=2048), "n": 8}
    statuses, total, costs = run_burst(tmp_path, upstream, mode, 0.01, [attack, attack])
    assert statuses == [429, 429]
    assert_within(statuses, total, costs, 0.01, served=False)


@pytest.mark.parametrize("mode", MODES)
def test_a_burst_of_n_choices_stays_within_the_budget(tmp_path: Path, upstream: FaultUpstream, mode: Mode) -> None:
    budget = 0.05
    bodies = [{**chat(f"Story {i}.", max_tokens=256, stream=bool(i % 2)), "n": 4} for i in range(16)]
    statuses, total, costs = run_burst(tmp_path, upstream, mode, budget, bodies)
    assert_within(statuses, total, costs, budget, served=True)
    if mode == "greedy":  # billed its worst case, every request costs what it reserved
        assert budget - total < 2 * max(costs)


def tools(count: int, size: int) -> list[dict[str, Any]]:
    """`count` functions of about `size` bytes of JSON each."""
    out = []
    for i in range(count):
        props = {f"p{j}": {"type": "string", "description": "d" * 900} for j in range((size - 16_500) // 950)}
        out.append(
            {
                "type": "function",
                "function": {
                    "name": f"tool_{i}",
                    "description": "t" * 16_000,
                    "parameters": {"type": "object", "properties": props},
                },
            }
        )
    return out


def history(argument_bytes: int) -> list[dict[str, Any]]:
    """A conversation whose assistant turn called a function with an argument this long."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "tool_0", "arguments": json.dumps({"text": "a" * argument_bytes})},
    }
    return [
        {"role": "user", "content": "Summarise the file."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
    ]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_tools_and_a_tool_call_history_are_reserved(tmp_path: Path, upstream: FaultUpstream, mode: Mode) -> None:
    # the attack: 13 tools of ~31 KB and a 99 KB argument reserved $0.00003 and cost
    # $0.0795 each; ten at once took the key far past its budget
    budget = 0.5
    offered = tools(13, 31_000)
    assert 12 * 31_000 < len(json.dumps(offered)) < 14 * 31_000
    body = {"model": "large", "messages": history(99_000), "tools": offered, "max_tokens": 16}
    statuses, total, costs = run_burst(tmp_path, upstream, mode, budget, [body] * 10)
    assert_within(statuses, total, costs, budget, served=True)


@pytest.mark.parametrize("mode", MODES)
def test_a_tool_call_history_alone_is_reserved(tmp_path: Path, upstream: FaultUpstream, mode: Mode) -> None:
    budget = 0.1
    bodies = [
        {"model": "large", "messages": history(99_000), "max_tokens": 16, "stream": bool(i % 2)} for i in range(10)
    ]
    statuses, total, costs = run_burst(tmp_path, upstream, mode, budget, bodies)
    assert_within(statuses, total, costs, budget, served=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_response_format_schema_is_reserved(tmp_path: Path, upstream: FaultUpstream, mode: Mode) -> None:
    budget = 0.01
    props = {f"field_{j}": {"type": "string", "description": "s" * 1000} for j in range(10)}  # ~10 KB
    schema = {"type": "object", "properties": props, "required": ["field_0"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}
    bodies = [chat(f"Fill it in, {i}.", response_format=fmt, stop=["END" * 10] * 4) for i in range(10)]
    statuses, total, costs = run_burst(tmp_path, upstream, mode, budget, bodies)
    assert_within(statuses, total, costs, budget, served=True)


@pytest.mark.parametrize("mode", MODES)
def test_a_burst_of_small_requests_is_reserved_what_a_hosted_api_may_bill(
    tmp_path: Path, upstream: FaultUpstream, mode: Mode
) -> None:
    # a hosted API counts its own system prompt: an upstream may bill thousands of prompt tokens
    # for a one-word message, and the service accepts that usage, so it must reserve it
    budget = 0.01
    bodies = [chat(f"Hi {i}", stream=bool(i % 2)) for i in range(20)]
    bodies += [{"model": "large", "prompt": f"Hi {i}", "max_tokens": 16} for i in range(4)]
    statuses, total, costs = run_burst(tmp_path, upstream, mode, budget, bodies)
    assert_within(statuses, total, costs, budget, served=True)
    if mode == "greedy":
        assert budget - total < 2 * max(costs)


VERIFIED = """
[[tiers.verifiers]]
name = "self_consistency"
params = { k = 3, extract = "text" }
[[tiers.verifiers]]
name = "judge"
params = { tier = "large", max_tokens = 512, max_chars = 500 }
"""


@pytest.mark.parametrize("mode", MODES)
def test_verifier_work_that_generates_is_reserved(tmp_path: Path, upstream: FaultUpstream, mode: Mode) -> None:
    # the small tier samples its answer three more times and asks the large tier to judge it:
    # that work is reserved at the tiers that do it
    budget = 0.05
    tiers = remote_tier("small", upstream.base_url, max_tokens=256, extra="threshold = 0.5\n" + VERIFIED)
    tiers += remote_tier("large", upstream.base_url)
    bodies = [{**chat(f"Question {i}?", max_tokens=256, stream=bool(i % 2)), "model": "small"} for i in range(20)]
    statuses, total, costs = run_burst(tmp_path, upstream, mode, budget, bodies, tiers)
    assert_within(statuses, total, costs, budget, served=True)
    rows = [e for e in read_ledger(tmp_path / "ledger.sqlite3").values() if e.key_id == "k"]
    assert all(a.verifier_cost_usd > a.cost_usd for e in rows for a in e.attempts)  # the verifying was charged
