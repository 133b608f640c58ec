"""`logprobs` and `top_logprobs` served as OpenAI serves them, read back by the official `openai`
client from a real server on SmolLM2: chat and legacy completions, plain and streamed."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from router.api.app import create_app
from router.config import load_settings
from tests.support.config import smol_config
from tests.support.servers import UvicornThread

ASK = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[openai.OpenAI]:
    tmp = tmp_path_factory.mktemp("api-logprobs")
    # the small tier's `choice` verifier makes the cascade ask it for 5 alternatives per token,
    # more than some of these clients ask for; threshold 0: the small tier always answers
    verifiers = '[[tiers.verifiers]]\nname = "choice"\nparams = { top_logprobs = 5 }\n'
    cfg = smol_config(tmp, threshold=0.0, verifiers=verifiers, large="none")
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def check_chat_tokens(content: list, k: int) -> None:  # type: ignore[type-arg]
    for t in content:
        assert t.logprob <= 0.0 and math.isfinite(t.logprob)
        assert t.bytes == list(t.token.encode("utf-8"))
        assert len(t.top_logprobs) == k
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
        if k:  # greedy: the likeliest alternative is the token itself
            assert (t.top_logprobs[0].token, t.top_logprobs[0].logprob) == (t.token, t.logprob)


@pytest.mark.parametrize("k", [0, 2, 8])
def test_chat(client: openai.OpenAI, k: int) -> None:
    r = client.chat.completions.create(model="small", messages=ASK, max_tokens=12, logprobs=True, top_logprobs=k)
    choice = r.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    check_chat_tokens(choice.logprobs.content, k)
    assert "".join(t.token for t in choice.logprobs.content) == choice.message.content
    assert len(choice.logprobs.content) == r.usage.completion_tokens  # type: ignore[union-attr]


def test_chat_without_logprobs_has_none(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="small", messages=ASK, max_tokens=6)
    assert r.choices[0].logprobs is None


def test_chat_stream_matches_the_plain_answer(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="small", messages=ASK, max_tokens=12, logprobs=True, top_logprobs=3)
    chunks = list(
        client.chat.completions.create(
            model="small", messages=ASK, max_tokens=12, logprobs=True, top_logprobs=3, stream=True
        )
    )
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content or ()]
    check_chat_tokens(streamed, 3)
    assert [t.token for t in streamed] == [t.token for t in whole.choices[0].logprobs.content]  # type: ignore[union-attr]
    # each chunk carries the tokens of its own text
    for c in chunks:
        if c.choices and c.choices[0].delta.content and c.choices[0].logprobs:
            assert "".join(t.token for t in c.choices[0].logprobs.content or ()) == c.choices[0].delta.content


def test_a_stop_sequence_cuts_the_tokens_too(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="small", messages=ASK, max_tokens=12, logprobs=True)
    text = first.choices[0].message.content or ""
    stop = text.strip().split()[-1]  # a word from the middle or end of the answer
    r = client.chat.completions.create(model="small", messages=ASK, max_tokens=12, logprobs=True, stop=[stop])
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    pieces = "".join(t.token for t in content or ())
    assert pieces.startswith(r.choices[0].message.content or "")
    assert len(pieces) < len(r.choices[0].message.content or "") + len(content[-1].token) + 1  # type: ignore[index]


@pytest.mark.parametrize("k", [0, 3, 5])
def test_completions_legacy_shape(client: openai.OpenAI, k: int) -> None:
    r = client.completions.create(model="small", prompt="The capital of France is", max_tokens=8, logprobs=k)
    choice = r.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs is not None
    assert "".join(lp.tokens) == choice.text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset or ())
    offsets = [0]
    for t in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(t))
    assert lp.text_offset == offsets
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == max(k, 1)  # the sampled token's own is always there (greedy: among the top k)
        assert top[token] == logprob


def test_completions_stream(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model="small", prompt="The capital of France is", max_tokens=8, logprobs=2, stream=True
        )
    )
    tokens: list[str] = []
    offsets: list[int] = []
    text = ""
    for c in chunks:
        choice = c.choices[0]
        if choice.text and choice.logprobs:
            assert "".join(choice.logprobs.tokens or ()) == choice.text
            tokens += choice.logprobs.tokens or []
            offsets += choice.logprobs.text_offset or []
        text += choice.text
    assert "".join(tokens) == text and tokens
    assert offsets[0] == 0 and offsets == sorted(offsets)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": False, "top_logprobs": 1}, "top_logprobs"),
    ],
)
def test_chat_refusals(client: openai.OpenAI, kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="small", messages=ASK, max_tokens=4, **kwargs)  # type: ignore[call-overload]
    assert info.value.param == param


def test_completions_refusals(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="small", prompt="x", max_tokens=2, logprobs=6)
    assert info.value.param == "logprobs"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="small", prompt="x", max_tokens=2, extra_body={"top_logprobs": 2})
    assert info.value.param == "top_logprobs"
