"""n > 1 through the service, with the official `openai` client against a real server on the real
SmolLM2 model: n choices on chat and completions, streamed and not, usage and the `tierroute`
object counting every choice's tokens (the prompt once), and n or n * max_tokens past their caps
refused with a 400 naming `n`. A remote tier is sent `n` and its choices are read back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from router.api.app import create_app
from router.api.requests import MAX_CHOICE_TOKENS, ChatCompletionRequest
from router.config import load_settings
from router.errors import RequestError
from router.generation import GenerationRequest, Message
from tests.support.config import smol_config
from tests.support.fault_upstream import FaultUpstream, raw
from tests.support.openai_backend import backend_for
from tests.support.servers import UvicornThread

ASK = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[UvicornThread]:
    cfg = smol_config(tmp_path_factory.mktemp("choices"), threshold=0.0)
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: UvicornThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_chat_n_counts_every_choice(client: openai.OpenAI) -> None:
    one = client.chat.completions.create(model="small", messages=ASK, max_tokens=12)  # type: ignore[arg-type]
    three = client.chat.completions.create(
        model="small",
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=12,
        n=3,
        temperature=1.0,
        seed=11,
        logprobs=True,
    )
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert len({c.message.content for c in three.choices}) > 1  # seeds differ per choice
    tokens = [len(c.logprobs.content) for c in three.choices]  # type: ignore[union-attr]
    assert all(0 < t <= 12 for t in tokens)
    assert three.usage is not None and one.usage is not None
    assert three.usage.completion_tokens == sum(tokens)
    assert three.usage.prompt_tokens == one.usage.prompt_tokens  # the shared prompt, counted once
    report = three.model_extra["tierroute"]  # type: ignore[index]
    assert report["attempts"][-1]["completion_tokens"] == sum(tokens)
    assert report["cost_usd"] > 0  # priced by busy time here, summed over the n sequences


def test_completions_n_streamed(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model="small",
            prompt="The sky is",
            max_tokens=8,
            n=2,
            temperature=1.0,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts: dict[int, str] = {0: "", 1: ""}
    finished: dict[int, str | None] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason is not None:
                finished[choice.index] = choice.finish_reason
    assert set(finished) == {0, 1} and all(texts.values())
    last = chunks[-1]
    assert last.usage is not None and last.model_extra["tierroute"]["tier"] == "small"  # type: ignore[index]


def test_chat_n_streamed_matches_its_answer(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="small",
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=10,
        n=2,
        temperature=0.0,
        stream=True,
    )
    texts: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    whole = client.chat.completions.create(model="small", messages=ASK, max_tokens=10)  # type: ignore[arg-type]
    assert texts == {0: whole.choices[0].message.content, 1: whole.choices[0].message.content}  # greedy


@pytest.mark.parametrize(
    "extra",
    [{"n": 9}, {"n": 0}, {"n": True}, {"n": "2"}],
    ids=["n 9", "n 0", "n bool", "n string"],
)
def test_n_past_its_caps_is_400(server: UvicornThread, extra: dict[str, Any]) -> None:
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "auto", "messages": ASK, **extra}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "n"


def test_n_times_max_tokens_is_capped_as_the_tiers_cap_max_tokens() -> None:
    body = ChatCompletionRequest.model_validate({"model": "auto", "messages": ASK, "n": 8, "max_tokens": 4096})
    assert body.to_generation(512).n == 8  # 8 * 512 decoded at most: within the cap
    with pytest.raises(RequestError) as info:
        body.to_generation(4096)
    assert info.value.param == "n" and str(MAX_CHOICE_TOKENS) in str(info.value)
    one = body.model_copy(update={"n": 1})
    assert one.to_generation(1 << 20).max_tokens == 4096  # n = 1 is bounded by the tiers alone


def _two_choices() -> bytes:
    choices = [
        {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        for i, text in enumerate(["Red.", "Blue, or green."])
    ]
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": choices, "usage": usage}
    return json.dumps(body).encode()


async def test_a_remote_tier_is_sent_n_and_read_back() -> None:
    request = GenerationRequest(messages=(Message("user", "Name a colour."),), max_tokens=8, n=2)
    with FaultUpstream() as upstream:
        upstream.script(raw(200, _two_choices()))
        async with backend_for(upstream) as backend:
            gen = await backend.generate(request)
    assert upstream.requests[0].body["n"] == 2
    assert [g.text for g in gen.choices] == ["Red.", "Blue, or green."]
    assert (gen.prompt_tokens, gen.completion_tokens) == (5, 7)  # the upstream's usage covers both
