"""Reported usage is never below what was sent and delivered (`router.backends.openai.reading`,
usage floors): an upstream on loopback that reports 0/0, or too little, for a long answer."""

from __future__ import annotations

import json
import logging

import pytest

from router.backends.openai.reading import MAX_BYTES_PER_TOKEN
from router.generation import GenerationRequest, Message
from tests.support.fault_upstream import FaultUpstream, chat_chunk, honest, raw, sse
from tests.support.openai_backend import backend_for, collect

PROMPT = "Tell me about the sea. " * 20  # 460 bytes: at least 15 prompt tokens
CHAT = GenerationRequest(messages=(Message("user", PROMPT),), max_tokens=200)
NOTHING = {"prompt_tokens": 0, "completion_tokens": 0}


async def test_nothing_reported_for_200_tokens_is_counted_as_200(
    upstream: FaultUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "router.backends.openai")
    upstream.default = honest(" wave", usage=NOTHING)
    async with backend_for(upstream) as backend:
        gen = await backend.generate(CHAT)
        raised = backend.stats()["usage_raised_total"]
    assert gen.completion_tokens == 200  # one logprob entry a token
    assert gen.prompt_tokens == -(-len(PROMPT) // MAX_BYTES_PER_TOKEN)
    assert raised == 2 and "below what it delivered" in caplog.text


async def test_without_logprobs_the_text_sets_the_floor(upstream: FaultUpstream) -> None:
    text = "word " * 400  # 2000 bytes
    body = {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 3},
    }
    upstream.default = raw(200, json.dumps(body).encode())
    async with backend_for(upstream, logprobs=False) as backend:
        gen = await backend.generate(CHAT.with_(max_tokens=1000))
    assert gen.completion_tokens == -(-2000 // MAX_BYTES_PER_TOKEN)
    assert gen.prompt_tokens == -(-len(PROMPT) // MAX_BYTES_PER_TOKEN)


async def test_every_choice_counts_toward_the_floor(upstream: FaultUpstream) -> None:
    upstream.default = honest(" wave", usage={"prompt_tokens": 500, "completion_tokens": 10})
    async with backend_for(upstream) as backend:
        gen = await backend.generate(CHAT.with_(n=3, max_tokens=50))
    assert gen.completion_tokens == 150 and gen.prompt_tokens == 500  # plausible counts stand


async def test_a_stream_reporting_nothing_is_counted_from_what_it_delivered(upstream: FaultUpstream) -> None:
    pieces = [chat_chunk(" wave") for _ in range(40)]
    usage = {"id": "u", "object": "chat.completion.chunk", "choices": [], "usage": NOTHING}
    upstream.default = sse(*pieces, chat_chunk(finish="stop"), usage)
    async with backend_for(upstream, logprobs=False) as backend:
        _, gen = await collect(backend, CHAT)
        assert backend.stats()["usage_raised_total"] == 2
    assert gen.completion_tokens == -(-len(" wave" * 40) // MAX_BYTES_PER_TOKEN)
    assert gen.prompt_tokens > 0
