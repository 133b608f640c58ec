"""Scoring a given answer on an OpenAI-compatible tier: `echo` against llama-cpp-python's real
server on SmolLM2, vLLM's `prompt_logprobs` shape against the scripted upstream (vLLM cannot run
here), and hostile values an upstream may send."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from router.backends.base import ScoringUnsupportedError
from router.backends.openai import OpenAIBackend
from router.backends.openai.prompt_scoring import LOGPROB_FLOOR, render_chat
from router.config import OpenAIBackendSettings
from router.errors import UpstreamError
from router.generation import GenerationRequest, Message
from tests.support.fault_upstream import FaultUpstream, raw
from tests.support.openai_backend import backend_for
from tests.support.servers import llama_cpp_server

ANSWER = "17 * 3 is 51."
CHAT = GenerationRequest(messages=(Message("user", "What is 17 * 3?"),), max_tokens=32)
PLAIN = GenerationRequest(prompt="Question: what is 17 * 3?\nAnswer:", max_tokens=32)


# -- echo, against the real server ---------------------------------------------------------------


@pytest.fixture(scope="module")
def server_url(smol_path: Path) -> Iterator[str]:
    with llama_cpp_server(smol_path) as url:
        yield url


async def _echo_backend(url: str, **config: Any) -> OpenAIBackend:
    settings = OpenAIBackendSettings(
        base_url=url, model="smol", prompt_logprobs="echo", chat_template="chatml", max_attempts=1, **config
    )
    backend = OpenAIBackend("large", settings, timeout_s=120)
    await backend.start()
    return backend


def _direct(smol_path: Path, text: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The last n tokens' logprobs and argmax flags from llama-cpp-python's Llama, set up as its
    server is (no flash attention, the whole prompt in one batch)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(smol_path), n_ctx=2048, n_threads=1, logits_all=True, verbose=False)
    try:
        tokens = llm.tokenize(text.encode(), add_bos=True, special=True)
        llm.eval(tokens)
        scores = np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()
    rows = scores[len(tokens) - n - 1 : len(tokens) - 1]
    targets = np.array(tokens[len(tokens) - n :])
    peak = rows.max(axis=1)
    lse = peak + np.log(np.exp(rows - peak[:, None]).sum(axis=1))
    return rows[np.arange(n), targets] - lse, rows.argmax(axis=1) == targets


@pytest.mark.slow
async def test_echo_against_a_real_server(server_url: str, smol_path: Path) -> None:
    """Prompts here start with SmolLM2's BOS token (ChatML's <|im_start|>): llama-cpp-python's
    server (0.3.x) pairs echoed tokens with logprobs one position late when a prompt does not
    (it drops a leading BOS from the tokens but not from the logits rows)."""
    backend = await _echo_backend(server_url)
    rendered = GenerationRequest(prompt=render_chat("chatml", CHAT.messages or ()), max_tokens=32)
    try:
        s = await backend.score_continuation(rendered, ANSWER)
        assert 5 <= s.continuation_tokens <= len(ANSWER)
        assert s.prompt_tokens > s.continuation_tokens and s.seconds > 0
        want_lp, want_top = _direct(smol_path, (rendered.prompt or "") + ANSWER, s.continuation_tokens)
        assert np.allclose(s.token_logprobs, want_lp, atol=1e-3)
        assert s.top1 == tuple(bool(v) for v in want_top)

        # a chat request is rendered with the configured template: the same as sending it rendered
        chat = await backend.score_continuation(CHAT, ANSWER)
        assert np.allclose(chat.token_logprobs, s.token_logprobs, atol=1e-6) and chat.top1 == s.top1

        # the server's own greedy answer (its default repeat penalty off): every token its top choice
        asked = {"prompt": rendered.prompt, "max_tokens": 16, "temperature": 0, "repeat_penalty": 1.0}
        async with httpx.AsyncClient(timeout=120) as client:
            reply = await client.post(f"{server_url}/completions", json=asked)
        own = reply.json()["choices"][0]["text"]
        assert own.strip()
        scored = await backend.score_continuation(rendered, own)
        assert all(scored.top1), scored
    finally:
        await backend.close()


async def test_a_tier_without_prompt_logprobs_cannot_score(upstream: FaultUpstream) -> None:
    async with backend_for(upstream) as backend:
        with pytest.raises(ScoringUnsupportedError):
            await backend.score_continuation(CHAT, ANSWER)
    async with backend_for(upstream, prompt_logprobs="echo") as backend:  # no template for a chat request
        with pytest.raises(ScoringUnsupportedError):
            await backend.score_continuation(CHAT, ANSWER)
    assert upstream.requests == []


# -- vLLM's prompt_logprobs, against the scripted upstream ----------------------------------------

PIECES = ("17", " *", " ", "3", " is", " ", "51", ".")


def _vllm_positions(pieces: tuple[str, ...] = PIECES, *, top_at: tuple[int, ...] = ()) -> list[Any]:
    """vLLM's shape: per prompt position, token id -> {logprob, rank, decoded_token}; position 0 has
    none. The prompt's own token has rank 1 unless `top_at` names the position, where another
    token is the top choice and is listed beside it."""
    template = [None, {"9": {"logprob": -2.0, "rank": 3, "decoded_token": "<|im_start|>"}}]
    template += [{"10": {"logprob": -0.1, "rank": 1, "decoded_token": "user\nWhat is 17 * 3?\n"}}]
    out: list[Any] = list(template)
    for i, piece in enumerate(pieces):
        own = {"logprob": -0.1 * (i + 1), "rank": 1, "decoded_token": piece}
        if i in top_at:
            out.append({str(100 + i): {**own, "rank": 2}, "7": {"logprob": -0.01, "rank": 1, "decoded_token": "x"}})
        else:
            out.append({str(100 + i): own})
    return out


def _vllm_body(prompt_logprobs: Any, *, chat: bool = True, usage: Any = None) -> bytes:
    usage = usage if usage is not None else {"prompt_tokens": 11, "completion_tokens": 1, "total_tokens": 12}
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}
        body = {"id": "c", "object": "chat.completion", "model": "m", "choices": [choice], "usage": usage}
        body["prompt_logprobs"] = prompt_logprobs
    else:
        choice = {"index": 0, "text": "x", "finish_reason": "length", "prompt_logprobs": prompt_logprobs}
        body = {"id": "c", "object": "text_completion", "model": "m", "choices": [choice], "usage": usage}
    return json.dumps(body).encode()


async def test_vllm_chat_request_and_response_shape(upstream: FaultUpstream) -> None:
    upstream.script(raw(200, _vllm_body(_vllm_positions(top_at=(2, 6)))))
    async with backend_for(upstream, prompt_logprobs="vllm") as backend:
        s = await backend.score_continuation(CHAT, ANSWER)
    sent = upstream.requests[0]
    assert sent.is_chat
    assert sent.body["messages"][-1] == {"role": "assistant", "content": ANSWER}
    assert sent.body["messages"][0] == {"role": "user", "content": "What is 17 * 3?"}
    assert sent.body["prompt_logprobs"] == 1 and sent.body["max_tokens"] == 1
    assert sent.body["add_generation_prompt"] is False and sent.body["continue_final_message"] is True
    assert s.continuation_tokens == len(PIECES)
    assert s.token_logprobs == pytest.approx([-0.1 * (i + 1) for i in range(len(PIECES))])
    assert s.top1 == tuple(i not in (2, 6) for i in range(len(PIECES)))
    assert s.prompt_tokens == 11


async def test_vllm_plain_prompt_uses_completions(upstream: FaultUpstream) -> None:
    upstream.script(raw(200, _vllm_body(_vllm_positions(), chat=False)))
    async with backend_for(upstream, prompt_logprobs="vllm") as backend:
        s = await backend.score_continuation(PLAIN, ANSWER)
    sent = upstream.requests[0]
    assert not sent.is_chat and sent.body["prompt"] == PLAIN.prompt + ANSWER
    assert sent.body["prompt_logprobs"] == 1 and "echo" not in sent.body
    assert s.continuation_tokens == len(PIECES) and all(s.top1)


# -- hostile upstreams ------------------------------------------------------------------------------


def _with(position: int, **item: Any) -> list[Any]:
    positions = _vllm_positions()
    key = next(iter(positions[position]))
    positions[position][key] = {**positions[position][key], **item}
    return positions


@pytest.mark.parametrize(
    "body",
    [
        _vllm_body(None),  # no prompt_logprobs
        _vllm_body("lots"),
        _vllm_body(_with(-1, logprob=3.5)),  # a probability above 1
        _vllm_body(_with(-1, logprob="-0.1")),
        _vllm_body(_with(-2, rank=0)),
        _vllm_body(_with(-2, rank=True)),
        _vllm_body(_with(-3, decoded_token=None)),
        _vllm_body([None, *_vllm_positions(("51", "."))[3:]]),  # does not reach back over the answer
        _vllm_body([{"1": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}}] * 20_000),  # more than the prompt
        b'{"choices": [{"index": 0, "message": {"content": "x"}}], "prompt_logprobs": [NaN]}',
    ],
    ids=["missing", "string", "positive", "text", "rank0", "rankbool", "nopiece", "short", "huge", "nan"],
)
async def test_hostile_values_are_malformed_and_retried(upstream: FaultUpstream, body: bytes) -> None:
    upstream.default = raw(200, body)
    async with backend_for(upstream, prompt_logprobs="vllm", max_attempts=2) as backend:
        with pytest.raises(UpstreamError, match="malformed"):
            await backend.score_continuation(CHAT, ANSWER)
    assert len(upstream.requests) == 2


async def test_hostile_values_that_can_be_clamped_are(upstream: FaultUpstream) -> None:
    impossible = _with(-1, logprob=float("-inf"))
    upstream.script(
        raw(200, _vllm_body(impossible, usage={"prompt_tokens": 10**12})),  # usage beyond the prompt
        raw(200, _vllm_body(_with(-1, logprob=1e-9))),  # rounding above 0
    )
    async with backend_for(upstream, prompt_logprobs="vllm") as backend:
        first = await backend.score_continuation(CHAT, ANSWER)
        second = await backend.score_continuation(CHAT, ANSWER)
    assert first.token_logprobs[-1] == LOGPROB_FLOOR
    assert first.prompt_tokens == len(_vllm_positions())  # the positions it read, not 10**12
    assert second.token_logprobs[-1] == 0.0
