"""Reported usage is never below what was sent and delivered (`router.backends.openai.reading`,
usage floors): an upstream on loopback that reports 0/0, or too little, for a long answer."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from router.backends.openai.reading import MAX_PIECE_CHARS
from router.generation import GenerationRequest, Message
from router.plugins import VerifierRegistry
from tests.support.accounting import auth, keys_section, read_ledger, running
from tests.support.config import TOKEN_PRICE, table, tier, write_config
from tests.support.fault_upstream import FaultUpstream, chat_chunk, honest, raw, sse
from tests.support.openai_backend import backend_for, collect

PROMPT = "Tell me about the sea. " * 20  # 460 characters: at least 8 prompt tokens
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
    assert gen.prompt_tokens == -(-len(PROMPT) // MAX_PIECE_CHARS)
    assert raised == 2 and "below what it delivered" in caplog.text


async def test_without_logprobs_the_text_sets_the_floor(upstream: FaultUpstream) -> None:
    text = "word " * 400  # 2000 characters
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
    assert gen.completion_tokens == -(-2000 // MAX_PIECE_CHARS)
    assert gen.prompt_tokens == -(-len(PROMPT) // MAX_PIECE_CHARS)


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
    assert gen.completion_tokens == -(-len(" wave" * 40) // MAX_PIECE_CHARS)
    assert gen.prompt_tokens > 0


LONG_TOKENS = GenerationRequest(messages=(Message("user", "Repeat the equals signs."),), max_tokens=50)


async def test_an_honest_count_of_the_longest_tokens_is_never_raised(upstream: FaultUpstream) -> None:
    # the floor must be a bound: at 32 bytes a token (before), an honest server's true count of
    # 64-character tokens (a run of `=`, which the reader takes as one token) was doubled, with a
    # warning that the upstream under-reported
    upstream.default = honest("=" * MAX_PIECE_CHARS)  # true usage: one token each
    for logprobs in (True, False):
        async with backend_for(upstream, logprobs=logprobs) as backend:
            gen = await backend.generate(LONG_TOKENS)
            assert backend.stats()["usage_raised_total"] == 0, logprobs
        assert gen.completion_tokens == 50, logprobs


async def test_a_stream_cut_after_a_usage_chunk_of_nothing_is_charged_what_it_delivered(tmp_path: Path) -> None:
    # Found by the outside review: a stream whose first chunk reports 0/0 usage and which is then
    # cut (no finish_reason, no [DONE]) was charged $0: a cut stream is priced from its last
    # piece's counts, which were the reported ones without the floors the final answer applies.
    # Through the app: the ledger row's counts are at least the floors of what was delivered.
    words = [" hello"] * 200
    first = {**chat_chunk(""), "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
    with FaultUpstream(default=sse(first, *(chat_chunk(w) for w in words), done=False)) as up:
        engine = {"base_url": up.base_url, "model": "m", "max_attempts": 1, "hosted_prompt_tokens": 0}
        body, keys = keys_section({"k": {}})
        text = f"[server]\n{body}\n" + table("ledger", {"path": tmp_path / "ledger.sqlite3"})
        text += tier("large", backend="openai", max_tokens=512, timeout_s=20, engine=engine, price=TOKEN_PRICE)
        cfg = write_config(tmp_path / "config.toml", text)
        async with running(cfg, registry=VerifierRegistry.from_entry_points()) as client:
            sent = {"model": "large", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 400}
            r = await client.post("/v1/chat/completions", json={**sent, "stream": True}, headers=auth(keys["k"]))
    assert r.status_code == 200 and '"error"' in r.text  # the cut reaches the client as an error event
    (row,) = read_ledger(tmp_path / "ledger.sqlite3").values()
    assert row.completion_tokens >= -(-len("".join(words)) // MAX_PIECE_CHARS), row
    assert row.prompt_tokens >= -(-len(PROMPT) // MAX_PIECE_CHARS), row
    assert row.cost_usd > 0, row
