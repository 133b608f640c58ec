"""What admission reserves (`router.admission.accounting.worst_case_usd`): every part of a request a tier is
sent counts, `n` choices count n times (the prompt once), a time-priced tier its timeout per
choice, and verifier work that generates at the tier that does it. The openai backend accepts no
usage above what was reserved for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from router.admission.accounting import lifetime_s, unreserved_verifiers, worst_case_usd
from router.backends.instant import InstantBackend
from router.backends.openai import OpenAIBackend
from router.cascade import Tier
from router.config import load_settings
from router.generation import GenerationRequest, Message, NamedTool, ResponseFormat, ToolCall, ToolSpec
from router.policy import TaskPolicy
from router.verification import VerifierContext, VerifierCost, VerifierSet, WeightedVerifier, worst_cost
from router.wire import prompt_token_bound, sent_bytes
from tests.support.config import write_config
from verifiers.consistency import make_self_consistency
from verifiers.cross_tier import make_cross_tier
from verifiers.execution import ExecutionVerifier
from verifiers.judge import make_judge

TIERS = """
[server]
allow_unauthenticated = true
[[tiers]]
name = "small"
backend = "openai"
max_tokens = 100
timeout_s = 30
[tiers.openai]
base_url = "http://127.0.0.1:9/v1"
model = "small"
[tiers.price]
usd_per_hour = 0.36
[[tiers]]
name = "large"
backend = "openai"
max_tokens = 1000
timeout_s = 60
[tiers.openai]
base_url = "http://127.0.0.1:9/v1"
model = "large"
[tiers.price]
usd_per_1m_input_tokens = 1.0
usd_per_1m_output_tokens = 10.0
"""
BASE = GenerationRequest(messages=(Message("user", "hello"),), max_tokens=50)


def tiers(tmp: Path, **verifiers: list[Any]) -> dict[str, Tier]:
    s = load_settings(write_config(tmp / "c.toml", TIERS))
    backends = {t.name: InstantBackend(t.name) for t in s.tiers}
    out = {}
    for t in s.tiers:
        ctx = VerifierContext(tier=t.name, backend=backends[t.name], backends=backends)
        members = [WeightedVerifier(make(dict(params), ctx), 1.0) for make, params in verifiers.get(t.name, [])]
        out[t.name] = Tier(t, backends[t.name], VerifierSet(members))
    return out


ARG = json.dumps({"path": "x" * 5000})
SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "description": "y" * 5000}}}
TOOL = ToolSpec("lookup", "z" * 5000, json.dumps(SCHEMA))


@pytest.mark.parametrize(
    "part",
    [
        {"messages": (Message("user", "hello"), Message("assistant", "", (ToolCall("call_1", "lookup", ARG),)))},
        {"messages": (Message("user", "hello"), Message("tool", "r" * 5000, tool_call_id="call_1"))},
        {"tools": (TOOL,)},
        {"tools": (TOOL,), "tool_choice": NamedTool("lookup")},
        {"response_format": ResponseFormat("json_schema", SCHEMA, "s")},
        {"stop": ("w" * 5000,)},
    ],
    ids=["tool_call_arguments", "tool_result", "tools", "named_tool", "schema", "stop"],
)
def test_every_part_of_what_is_sent_is_counted(part: dict[str, Any]) -> None:
    request = BASE.with_(**part)
    grown = sent_bytes(request) - sent_bytes(BASE)
    assert grown >= 5000  # each part above carries 5000 bytes of text
    assert prompt_token_bound(request) - prompt_token_bound(BASE) >= grown


def test_n_choices_count_the_completion_n_times_and_the_prompt_once(tmp_path: Path) -> None:
    t = tiers(tmp_path)
    large, small = t["large"], t["small"]
    prompt = prompt_token_bound(BASE)
    one = worst_case_usd([large], BASE)
    assert one == pytest.approx((prompt * 1.0 + 50 * 10.0) / 1e6)
    assert worst_case_usd([large], BASE.with_(n=8)) == pytest.approx((prompt * 1.0 + 8 * 50 * 10.0) / 1e6)
    # the request's max_tokens is capped by the tier's, as the cascade caps it
    assert worst_case_usd([large], BASE.with_(max_tokens=10**6)) == pytest.approx((prompt + 1000 * 10.0) / 1e6)
    # a time-priced tier: its whole timeout per choice (n samples each run up to it)
    assert worst_case_usd([small], BASE.with_(n=4)) == pytest.approx(0.36 * 4 * 30 / 3600)
    assert worst_case_usd([small, large], BASE) == pytest.approx(0.36 * 30 / 3600 + one)


def test_the_openai_backend_accepts_no_usage_above_what_is_reserved(tmp_path: Path) -> None:
    s = load_settings(write_config(tmp_path / "c.toml", TIERS))
    backend = OpenAIBackend.from_settings(s.tier("large"), s)
    tier = Tier(s.tier("large"), backend, VerifierSet([]))
    request = BASE.with_(tools=(TOOL,), n=3, max_tokens=5000)
    call = backend._new_call(request.with_(max_tokens=1000))
    # the limits its usage check applies are the ones admission prices
    assert call.prompt_limit == backend.prompt_token_limit(request) >= sent_bytes(request) + 4096
    assert call.completion_limit == backend.completion_token_limit(request) == 3 * 1000 + 8
    assert worst_case_usd([tier], request) == pytest.approx(
        (call.prompt_limit * 1.0 + call.completion_limit * 10.0) / 1e6
    )


@pytest.mark.parametrize("hosted", [0, 1_000_000])
def test_the_hosted_allowance_is_reserved_at_both_ends_of_its_range(tmp_path: Path, hosted: int) -> None:
    # 0: a server that adds no system prompt, reserved what is sent; 1_000_000: every request to
    # the tier reserves a million prompt tokens more ($1 here), so a small budget refuses it
    text = TIERS.replace('model = "large"\n', f'model = "large"\nhosted_prompt_tokens = {hosted}\n')
    s = load_settings(write_config(tmp_path / "c.toml", text))
    backend = OpenAIBackend.from_settings(s.tier("large"), s)
    tier = Tier(s.tier("large"), backend, VerifierSet([]))
    prompt = sent_bytes(BASE) + 64 + hosted
    assert backend.prompt_token_limit(BASE) == prompt
    assert worst_case_usd([tier], BASE) == pytest.approx((prompt * 1.0 + (50 + 8) * 10.0) / 1e6)


def test_verifier_work_is_reserved_at_the_tier_that_does_it(tmp_path: Path) -> None:
    plain = tiers(tmp_path)
    checked = tiers(
        tmp_path,
        large=[
            (make_self_consistency, {"k": 3}),  # samples on the large tier itself
            (make_judge, {"tier": "small", "max_tokens": 64, "timeout_s": 10}),  # a reply of the small tier
            (make_cross_tier, {"tier": "small", "timeout_s": 5}),  # a prefill on the small tier
        ],
    )
    request = BASE.with_(max_tokens=200)
    base = worst_case_usd([plain["large"]], request, tiers=plain)
    with_verifiers = worst_case_usd([checked["large"]], request, tiers=checked)
    sampled = 3 * (prompt_token_bound(request) * 1.0 + 200 * 10.0) / 1e6  # at the large tier's tokens
    judged_and_read = 0.36 * (10 + 5) / 3600  # the small tier is time-priced: its timeouts
    assert with_verifiers == pytest.approx(base + sampled + judged_and_read)
    # shadow work is a generation only
    assert worst_case_usd([checked["large"]], request, tiers=checked, verify=False) == pytest.approx(base)


def test_the_costliest_task_policy_is_reserved(tmp_path: Path) -> None:
    t = tiers(tmp_path, large=[(make_self_consistency, {"k": 2})])
    large = t["large"]
    plain = worst_case_usd([large], BASE, tiers=t)
    ctx = VerifierContext(tier="large", backend=large.backend, backends={n: x.backend for n, x in t.items()})
    costly = VerifierSet([WeightedVerifier(make_self_consistency({"k": 8}, ctx), 1.0)])
    large.tasks = {
        "maths": TaskPolicy(costly, "mean", 0.5, "maths"),
        "code": TaskPolicy(VerifierSet([]), "mean", 0.5, "code"),
    }
    per_sample = (prompt_token_bound(BASE) + 50 * 10.0) / 1e6
    assert worst_case_usd([large], BASE, tiers=t) == pytest.approx(plain + 6 * per_sample)


def test_a_second_opinion_is_reserved_only_when_asked_for(tmp_path: Path) -> None:
    t = tiers(tmp_path)
    ctx = VerifierContext(tier="large", backend=t["large"].backend, backends={})
    assert worst_cost(ExecutionVerifier(ctx=ctx), BASE) == VerifierCost()
    found = worst_cost(ExecutionVerifier(second_opinion=True, max_tokens=300, ctx=ctx), BASE)
    assert found is not None and found.completion_tokens == 300 and found.prompt_tokens > len("hello")


class Unsaid:
    """A plugin verifier that asks a model for work and does not say what it may cost."""

    name = "unsaid"
    uses_model = True

    async def score(self, request: GenerationRequest, candidate: object) -> object:
        raise NotImplementedError


def test_a_verifier_that_does_not_say_its_cost_is_named(tmp_path: Path) -> None:
    t = tiers(tmp_path)
    t["small"].verifiers = VerifierSet([WeightedVerifier(Unsaid(), 1.0)])  # type: ignore[arg-type]
    assert unreserved_verifiers(list(t.values())) == ["small.unsaid"]
    assert worst_cost(Unsaid(), BASE) is None  # type: ignore[arg-type]


def test_a_reservation_outlives_its_requests_verifying(tmp_path: Path) -> None:
    # on a shared ledger a reservation stops counting at its expiry: it must not expire while its
    # request can still be verifying (verify_timeout_s defaults to 60 s)
    plain = tiers(tmp_path)
    assert lifetime_s(list(plain.values())) == 30 + 60
    checked = tiers(tmp_path, small=[(make_self_consistency, {"k": 2})])
    assert lifetime_s(list(checked.values())) == 30 + 60 + 60
