"""The local tier on the real SmolLM2-135M model."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from router.backends.llamacpp import LlamaCppBackend
from router.config import LlamaCppSettings
from router.errors import ContextLengthError, DeadlineError, OverloadedError
from router.generation import Delta, Generation, GenerationRequest, Message

QUESTION = GenerationRequest(messages=(Message("user", "What is 17 * 3?"),), max_tokens=24)


@pytest.fixture(scope="module")
async def backend(smol_path: Path):
    b = LlamaCppBackend(
        "small", smol_path, LlamaCppSettings(model=str(smol_path), n_ctx=1024, n_threads=2, n_parallel=4, max_queue=8), 512
    )
    await b.start()
    yield b
    await b.close()


async def test_loads_and_answers(backend: LlamaCppBackend) -> None:
    assert backend.ready
    g = await backend.generate(QUESTION)
    assert g.text.strip()
    assert g.prompt_tokens > 5
    assert 0 < g.completion_tokens <= 24
    assert g.finish_reason in ("stop", "length")
    assert g.latency_s > 0 and g.busy_s is not None and g.busy_s > 0


async def test_greedy_is_deterministic(backend: LlamaCppBackend) -> None:
    a = await backend.generate(QUESTION.with_(seed=1))
    b = await backend.generate(QUESTION.with_(seed=1))
    assert a.text == b.text
    assert a.token_logprobs == b.token_logprobs


async def test_seeded_sampling_is_reproducible(backend: LlamaCppBackend) -> None:
    req = QUESTION.with_(temperature=0.9, seed=42)
    a, b = await backend.generate(req), await backend.generate(req)
    assert a.text == b.text


async def test_logprobs_one_per_completion_token(backend: LlamaCppBackend) -> None:
    g = await backend.generate(QUESTION)
    assert g.token_logprobs is not None
    assert len(g.token_logprobs) == g.completion_tokens
    assert all(lp <= 0.0 for lp in g.token_logprobs)
    assert any(lp < 0.0 for lp in g.token_logprobs)


async def test_max_tokens_is_respected(backend: LlamaCppBackend) -> None:
    g = await backend.generate(GenerationRequest(prompt="Count: one, two, three,", max_tokens=5))
    assert g.completion_tokens == 5
    assert g.finish_reason == "length"


async def test_stop_sequence_cuts_the_text(backend: LlamaCppBackend) -> None:
    full = await backend.generate(QUESTION)
    assert "=" in full.text, full.text
    g = await backend.generate(QUESTION.with_(stop=("=",)))
    assert g.finish_reason == "stop"
    assert "=" not in g.text
    assert full.text.startswith(g.text)


async def test_streaming_yields_the_same_text(backend: LlamaCppBackend) -> None:
    pieces: list[str] = []
    final: Generation | None = None
    async for item in backend.stream(QUESTION):
        if isinstance(item, Delta):
            pieces.append(item.text)
        else:
            final = item
    assert final is not None
    assert "".join(pieces) == final.text
    assert len(pieces) > 1


async def test_streamed_text_never_leaks_a_stop_sequence(backend: LlamaCppBackend) -> None:
    pieces = [i.text async for i in backend.stream(QUESTION.with_(stop=(" = ",))) if isinstance(i, Delta)]
    assert " = " not in "".join(pieces)


async def test_concurrent_calls_all_complete(backend: LlamaCppBackend) -> None:
    prompts = [f"Write the number {i} in words." for i in range(6)]
    results = await asyncio.gather(
        *(backend.generate(GenerationRequest(messages=(Message("user", p),), max_tokens=12)) for p in prompts)
    )
    assert len(results) == 6
    for g in results:
        assert g.text and g.completion_tokens <= 12
        assert g.token_logprobs is not None and len(g.token_logprobs) == g.completion_tokens


async def test_prompt_longer_than_context_is_refused(backend: LlamaCppBackend) -> None:
    with pytest.raises(ContextLengthError, match="maximum context length is 1024"):
        await backend.generate(GenerationRequest(prompt="word " * 2000, max_tokens=4))


async def test_deadline_is_enforced(backend: LlamaCppBackend) -> None:
    req = GenerationRequest(prompt="1, 2, 3, 4, 5,", max_tokens=500, deadline=time.monotonic() + 0.3)
    t0 = time.monotonic()
    with pytest.raises(DeadlineError):
        await backend.generate(req)
    assert time.monotonic() - t0 < 2.0


async def test_abandoned_stream_frees_its_slot(backend: LlamaCppBackend) -> None:
    for _ in range(6):  # more than n_parallel: slots must come back
        stream = backend.stream(GenerationRequest(prompt="Once upon a time", max_tokens=400))
        async for item in stream:
            assert isinstance(item, Delta)
            break
        await stream.aclose()
    await asyncio.sleep(0.2)
    assert backend.engine.active == 0
    g = await backend.generate(QUESTION)
    assert g.text


async def test_full_queue_is_refused_at_once(backend: LlamaCppBackend) -> None:
    reqs = [GenerationRequest(prompt="Once upon a time", max_tokens=30) for _ in range(30)]
    results = await asyncio.gather(*(backend.generate(r) for r in reqs), return_exceptions=True)
    refused = [r for r in results if isinstance(r, OverloadedError)]
    done = [r for r in results if isinstance(r, Generation)]
    assert refused, "a queue of 8 must refuse part of a burst of 30"
    assert len(refused) + len(done) == 30
