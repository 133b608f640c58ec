"""What a cache key is made of, what the policy version follows, and the checks on a stored answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from router.admission.auth import Principal
from router.api.requests import ChatCompletionRequest
from router.cache import answer, keys
from router.cache.answer import InvalidEntry
from router.config import load_settings
from router.ledger.entries import CacheRow
from tests.support.cache import cache_config

BASE: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}


def key(
    scope: str = "key:ana", policy: str = "p", shape: str = "chat.completion", client_code: bool = False, **fields: Any
) -> str:
    request = ChatCompletionRequest(**{**BASE, **fields})
    return keys.cache_key(request, shape=shape, policy=policy, scope=scope, client_code=client_code)


def test_the_key_is_canonical_and_leaves_out_only_how_the_answer_is_delivered() -> None:
    assert key() == key(temperature=0.0)  # 0 and 0.0 are one value
    assert key() == key(stream=True, stream_options={"include_usage": True}, user="u-1")
    assert key() == key(some_future_parameter=3)  # ignored by the API: it cannot change the answer
    differ = [
        key(messages=[{"role": "user", "content": "Hi!"}]),
        key(model="small"),
        key(seed=1),
        key(n=2),
        key(max_tokens=5),
        key(top_p=0.5),
        key(stop=["x"]),
        key(logprobs=True, top_logprobs=2),
        key(response_format={"type": "json_object"}),
        key(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
        key(tool_choice="none"),
        key(scope="key:ben"),
        key(policy="q"),
        key(shape="text_completion"),
        key(client_code=True),  # the verifiers run the prompt's code for such a caller
    ]
    assert len({key(), *differ}) == len(differ) + 1


def test_only_requests_served_greedy_or_seeded_are_deterministic() -> None:
    assert keys.deterministic(ChatCompletionRequest(**BASE))
    assert keys.deterministic(ChatCompletionRequest(**{**BASE, "temperature": 1.0, "seed": 3}))
    # served at temperature 0 (router.api.requests.BaseRequest.sampling), whatever OpenAI's default
    assert keys.deterministic(ChatCompletionRequest(**{**BASE, "temperature": None}))
    assert keys.deterministic(ChatCompletionRequest(**{k: v for k, v in BASE.items() if k != "temperature"}))
    assert keys.deterministic(ChatCompletionRequest(**{**BASE, "temperature": 5e-5}))
    assert not keys.deterministic(ChatCompletionRequest(**{**BASE, "temperature": 0.2}))


def test_scopes_and_cache_control() -> None:
    assert keys.scope_of(Principal("ana", None), "key") == "key:ana"
    assert keys.scope_of(Principal("ana", None), "global") == "*"
    # a team scope: the team's keys share it; a key without a team is its own tenant
    assert keys.scope_of(Principal("ana", None, team="red"), "team") == "team:red"
    assert keys.scope_of(Principal("bob", None, team="red"), "team") == "team:red"
    assert keys.scope_of(Principal("cy", None, team="blue"), "team") == "team:blue"
    assert keys.scope_of(Principal("dee", None), "team") == "key:dee"
    assert keys.scope_of(Principal("ana", None, team="red"), "key") == "key:ana"
    assert keys.directives(None) == (True, True)
    assert keys.directives("no-cache") == (False, True)
    assert keys.directives("max-age=0, No-Store") == (False, False)
    assert keys.directives("max-age=60") == (True, True)


def test_the_policy_version_follows_what_decides_answers_and_not_prices(tmp_path: Path) -> None:
    cfg, _ = cache_config(tmp_path, {})
    text = cfg.read_text()

    def version(replace: tuple[str, str] = ("", "")) -> str:
        cfg.write_text(text.replace(*replace))
        return keys.policy_version(load_settings(cfg))

    same = version()
    assert version(("usd_per_1m_output_tokens = 2.40", "usd_per_1m_output_tokens = 9.0")) == same
    assert version(("threshold = 0.5", "threshold = 0.7")) != same
    assert version(("max_tokens = 64", "max_tokens = 65")) != same
    assert version(("enabled = true", 'enabled = true\nnamespace = "v2"')) != same


OPENAI_TIER = """[ledger]
path = "ledger.sqlite3"
[[tiers]]
name = "large"
backend = "openai"
threshold = 0.5
max_tokens = 64
timeout_s = 10
[tiers.price]
usd_per_1m_input_tokens = 0.60
usd_per_1m_output_tokens = 2.40
[tiers.openai]
model = "tier-model"
strategy = "weighted_random"
max_attempts = 2
[[tiers.openai.deployments]]
name = "a"
base_url = "http://127.0.0.1:9001/v1"
weight = 1
[[tiers.openai.deployments]]
name = "b"
base_url = "http://127.0.0.1:9002/v1"
weight = 3
"""
ANOTHER = '[[tiers.openai.deployments]]\nname = "c"\nbase_url = "https://api.example.com/v1"\n'


@pytest.mark.parametrize(
    "change",
    [
        ("weight = 3", "weight = 4"),
        ("weighted_random", "least_outstanding"),
        ("max_attempts = 2", "max_attempts = 3\nbackoff_initial_s = 1\nbackoff_max_s = 2"),
        ("max_attempts = 2", "max_attempts = 2\nbreaker_failures = 2\nbreaker_cooldown_s = 9\nbreaker_successes = 3"),
        ("max_attempts = 2", "max_attempts = 2\nprobe_interval_s = 5\nprobe_successes = 3\nattempt_timeout_s = 4"),
        ("max_attempts = 2", 'max_attempts = 2\napi_key_env = "K"\nhosted_prompt_tokens = 0'),
        ("max_attempts = 2", "max_attempts = 2\nmax_response_bytes = 9999\nmax_stream_events = 99"),
        ("weight = 3", "weight = 3\nmax_concurrent = 8"),
        ('name = "b"', 'name = "b-renamed"\napi_key_env = "B_KEY"'),  # a deployment's label and key
        ("9002", "9003"),  # a replica moved
        ("weight = 3\n", "weight = 3\n" + ANOTHER),  # a replica added
    ],
    ids=["weight", "strategy", "retries", "breaker", "probe", "key-hosted", "bounds", "max_concurrent",
         "deployment-name-key", "base_url", "added"],
)  # fmt: skip
def test_an_openai_tiers_transport_leaves_the_policy_version_alone(tmp_path: Path, change: tuple[str, str]) -> None:
    # the audit's finding: a weight, a strategy or a breaker setting was hashed with the policy, so
    # rebalancing traffic between replicas dropped every cached answer
    cfg = tmp_path / "config.toml"

    def version(replace: tuple[str, str] = ("", "")) -> str:
        assert replace[0] in OPENAI_TIER
        cfg.write_text(OPENAI_TIER.replace(*replace))
        return keys.policy_version(load_settings(cfg))

    same = version()
    assert version(change) == same
    # while what decides the answer still moves it: the tier's model, its threshold and limits,
    # what its verifiers are given
    for policy in [
        ('model = "tier-model"', 'model = "other-model"'),
        ("threshold = 0.5", "threshold = 0.7"),
        ("max_tokens = 64", "max_tokens = 65"),
        ("max_attempts = 2", "max_attempts = 2\nlogprobs = false"),
        ("max_attempts = 2", 'max_attempts = 2\nprompt_logprobs = "echo"'),
        ("threshold = 0.5", 'threshold = 0.5\nverifiers = [{name = "confidence"}]'),
        # the attack review's finding: a deployment's own `model` was transport, so pointing a
        # replica at another model kept serving the old model's cached answers
        ("weight = 3", 'weight = 3\nmodel = "b-other-model"'),
    ]:
        assert version(policy) != same, policy
    # naming the tier's own model on a deployment changes nothing it is sent
    assert version(("weight = 3", 'weight = 3\nmodel = "tier-model"')) == same


def test_a_deployments_model_is_hashed_as_the_set_of_models_sent() -> None:
    from router.config import Settings

    def tier(*deployments: dict[str, Any]) -> str:
        openai = {"model": "gpt-x", "deployments": list(deployments)}
        price = {"usd_per_1m_input_tokens": 1, "usd_per_1m_output_tokens": 1}
        raw = {"tiers": [{"name": "big", "backend": "openai", "openai": openai, "price": price}]}
        return keys.policy_version(Settings.model_validate(raw))

    a = {"base_url": "http://127.0.0.1:9/v1", "model": "small"}
    b = {"base_url": "http://10.0.0.2/v1"}  # the tier's model
    base = tier(a, b)
    assert tier({**a, "model": "LARGE"}, b) != base  # what a deployment is asked for decides answers
    assert tier(b, a) == base  # order is balancing, not policy
    assert tier(a, b, {**a, "base_url": "http://10.0.0.3/v1", "weight": 3}) == base  # a replica of one
    assert tier({**a, "base_url": "http://10.0.0.4/v1", "weight": 5, "max_concurrent": 2}, b) == base
    assert tier(b) == tier({**b, "model": "gpt-x"})  # naming the tier's model is not a change
    assert tier(b) != tier(a)


def test_every_openai_field_is_either_policy_or_transport() -> None:
    # a new field must be placed: hashed (a change drops the cache) or transport (it does not)
    from router.config import OpenAIBackendSettings

    assert keys.OPENAI_TRANSPORT.isdisjoint(keys.OPENAI_POLICY)
    assert keys.OPENAI_TRANSPORT | keys.OPENAI_POLICY == set(OpenAIBackendSettings.model_fields)


def test_every_deployment_field_is_either_policy_or_transport() -> None:
    # the same for one deployment's fields: a new one must be decided, not silently left out
    from router.config_tiers import DeploymentSettings

    assert keys.DEPLOYMENT_TRANSPORT.isdisjoint(keys.DEPLOYMENT_POLICY)
    assert keys.DEPLOYMENT_TRANSPORT | keys.DEPLOYMENT_POLICY == set(DeploymentSettings.model_fields)


def stored(body: Any, *, k: str = "k", scope: str = "key:ana", shape: str = "chat.completion") -> CacheRow:
    text = body if isinstance(body, str) else json.dumps(body)
    return CacheRow(k, scope, "p", shape, "small", "r", 0.0, 1.0, len(text), text, answer.digest(k, scope, text))


GOOD = {
    "v": 1,
    "shape": "chat.completion",
    "request_id": "chatcmpl-1",
    "tier": "small",
    "model": "small",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi", "extra": 1}, "finish_reason": "stop",
                 "logprobs": None, "injected": "x"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    "task": None,
    "task_why": None,
}  # fmt: skip


def decode(row: CacheRow, **where: Any) -> answer.CachedAnswer:
    return answer.decode(
        row,
        **{
            "cache_key": "k",
            "scope": "key:ana",
            "shape": "chat.completion",
            "max_bytes": 4096,
            "tiers": frozenset({"small"}),
            **where,
        },
    )


def test_a_good_entry_is_served_from_its_checked_fields_only() -> None:
    found = decode(stored(GOOD))
    assert found.choices == [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop", "logprobs": None}
    ]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"choices": []}, "choices"),
        ({"choices": [{**GOOD["choices"][0], "finish_reason": "length"}]}, "did not end on its own"),
        ({"choices": [{**GOOD["choices"][0], "index": 3}]}, "index"),
        ({"choices": [{**GOOD["choices"][0], "message": {"role": "user", "content": "x"}}]}, "assistant"),
        ({"choices": [{**GOOD["choices"][0], "message": {"role": "assistant", "content": None}}]}, "neither"),
        (
            {
                "choices": [
                    {**GOOD["choices"][0], "message": {"role": "assistant", "content": None, "tool_calls": [{}]}}
                ]
            },
            "function call",
        ),
        ({"usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 5}}, "sum"),
        ({"usage": {"prompt_tokens": True, "completion_tokens": 1, "total_tokens": 2}}, "count"),
        ({"model": "\x1b[31m"}, "printable"),
        ({"tier": "large"}, "configured"),
        ({"task": "t" * 300}, "task"),
        ({"shape": "text_completion"}, "format and endpoint"),
        ({"v": 99}, "format"),
    ],
)
def test_a_malformed_entry_is_refused(change: dict[str, Any], why: str) -> None:
    with pytest.raises(InvalidEntry, match=why):
        decode(stored({**GOOD, **change}))


def test_an_entry_moved_altered_or_oversized_is_refused() -> None:
    row = stored(GOOD)
    with pytest.raises(InvalidEntry, match="digest"):
        decode(row, scope="key:ben")
    with pytest.raises(InvalidEntry, match="digest"):
        decode(row, cache_key="other")
    with pytest.raises(InvalidEntry, match="digest"):
        decode(CacheRow(**{**row.__dict__, "body": row.body.replace("hi", "ho")}))
    with pytest.raises(InvalidEntry, match="max_entry_bytes"):
        decode(row, max_bytes=10)
    with pytest.raises(InvalidEntry, match="not JSON"):
        decode(stored("[" * 5000), max_bytes=10_000)
