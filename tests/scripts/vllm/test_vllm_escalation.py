"""Escalation end to end with vLLM as the upper tier: the service in front (SmolLM2 as the small
tier, its answers rejected), a real vLLM server behind, plain and streamed. The small tier's
answer is also read by vLLM (`cross_tier` through `prompt_logprobs`), as a configured verifier."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from router.api.app import create_app
from router.config import load_settings
from tests.support.config import TOKEN_PRICE, keyless, small_tier, tier, write_config
from tests.support.servers import UvicornThread
from tests.support.vllm_server import KEY_ENV, VllmServer

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ASK = [{"role": "user", "content": "What is 17 * 3?"}]
# a format check the small model's answer never passes, and vLLM's reading of that answer
VERIFIERS = (
    '[[tiers.verifiers]]\nname = "format"\nparams = { regex = "^NEVER-MATCHES$" }\n'
    '[[tiers.verifiers]]\nname = "cross_tier"\nparams = { tier = "large" }\n'
)


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, smol_path: Path, vllm_server: VllmServer
) -> Iterator[openai.OpenAI]:
    vllm = vllm_server.ensure_up()
    tmp = tmp_path_factory.mktemp("vllm-escalation")
    engine = {
        "base_url": vllm.base_url,
        "model": vllm.model,
        "api_key_env": KEY_ENV,
        "prompt_logprobs": "vllm",
        "hosted_prompt_tokens": 256,
        "max_attempts": 2,
        "backoff_initial_s": 0.1,
    }
    body = keyless({"path": str(tmp / "ledger.sqlite3")}) + small_tier(0.5, VERIFIERS)
    body += tier("large", backend="openai", max_tokens=24, timeout_s=120, engine=engine, price=TOKEN_PRICE)
    cfg = write_config(tmp / "config.toml", body)
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=300)


def _check(ext: dict, completion_tokens: int | None = None) -> None:  # type: ignore[type-arg]
    assert ext["tier"] == "large" and ext["escalated"] is True
    small, large = ext["attempts"]
    assert small["tier"] == "small" and small["accepted"] is False
    assert large["tier"] == "large" and large["accepted"] is True
    if completion_tokens is not None:
        assert large["completion_tokens"] == completion_tokens
    # on top of both answers: vLLM's prefill of the small answer (cross_tier), priced as its input
    assert ext["cost_usd"] > small["cost_usd"] + large["cost_usd"]


def test_a_rejected_answer_is_answered_by_vllm(service: openai.OpenAI) -> None:
    raw = service.chat.completions.with_raw_response.create(model="auto", messages=ASK, max_tokens=24)
    r = raw.parse()
    assert raw.headers["x-tierroute-tier"] == "large"
    assert r.choices[0].message.content and "51" in r.choices[0].message.content
    ext = r.model_extra["tierroute"]  # type: ignore[index]
    _check(ext, r.usage.completion_tokens if r.usage else None)
    read = ext["attempts"][0]["scores"]["cross_tier"]
    assert read["score"] is not None and 0.0 < read["score"] <= 1.0, read  # vLLM read the small answer
    assert read["details"]["tier"] == "large" and read["details"]["tokens"] > 0


def test_an_escalated_stream_comes_from_vllm(service: openai.OpenAI) -> None:
    chunks = list(service.chat.completions.create(model="auto", messages=ASK, max_tokens=24, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "51" in text
    _check(chunks[-1].model_extra["tierroute"])  # type: ignore[index]
