"""Escalation end to end: our service in front, llama-cpp-python's server as the upper tier."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from router.api.app import create_app
from router.config import load_settings
from tests.support.config import smol_config
from tests.support.servers import UvicornThread, llama_cpp_server

ASK = [{"role": "user", "content": "What is 17 * 3?"}]
# a format check the small model's free-form answer never passes: the small tier is rejected
REJECT_ALL = '[[tiers.verifiers]]\nname = "format"\nparams = { regex = "^NEVER-MATCHES$" }\n'


@pytest.fixture(scope="module")
def upstream(smol_path: Path) -> Iterator[str]:
    with llama_cpp_server(smol_path) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, upstream: str) -> Iterator[openai.OpenAI]:
    tmp = tmp_path_factory.mktemp("escalation")
    cfg = smol_config(tmp, threshold=0.5, verifiers=REJECT_ALL, large="remote", base_url=upstream)
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)


def test_rejected_small_answer_is_answered_by_the_large_tier(service: openai.OpenAI) -> None:
    raw = service.chat.completions.with_raw_response.create(model="auto", messages=ASK, max_tokens=16)
    r = raw.parse()
    ext = r.model_extra["tierroute"]
    assert raw.headers["x-tierroute-tier"] == "large"
    assert raw.headers["x-tierroute-escalated"] == "true"
    assert ext["tier"] == "large" and ext["escalated"] is True
    small, large = ext["attempts"]
    assert small["tier"] == "small" and small["accepted"] is False
    assert small["score"] == 0.0 and "format" in small["reason"] and "threshold" in small["reason"]
    assert small["completion_tokens"] > 0 and small["cost_usd"] > 0
    assert large["tier"] == "large" and large["accepted"] is True
    assert large["completion_tokens"] == r.usage.completion_tokens
    assert r.choices[0].message.content
    # the upstream's logprobs reached us, so the large tier could be verified too
    assert ext["cost_usd"] == pytest.approx(small["cost_usd"] + large["cost_usd"])


def test_escalated_stream_comes_from_the_large_tier(service: openai.OpenAI) -> None:
    chunks = list(service.chat.completions.create(model="auto", messages=ASK, max_tokens=16, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    ext = chunks[-1].model_extra["tierroute"]
    assert ext["tier"] == "large"
    assert [a["tier"] for a in ext["attempts"]] == ["small", "large"]


def test_legacy_completions_escalate_too(service: openai.OpenAI) -> None:
    r = service.completions.create(model="auto", prompt="The capital of France is", max_tokens=8)
    assert r.model_extra["tierroute"]["tier"] == "large"
    assert r.choices[0].text
