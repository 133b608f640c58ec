"""The local tier on the real SmolLM2-135M model."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from router.backends.llama.backend import LlamaCppBackend
from router.config import LlamaCppSettings
from router.errors import ContextLengthError, DeadlineError, ModelError, OverloadedError, UnavailableError
from router.generation import Delta, Generation, GenerationRequest, Message
from tests.support.model import started

QUESTION = GenerationRequest(messages=(Message("user", "What is 17 * 3?"),), max_tokens=24)


@pytest.fixture(scope="module")
async def backend(smol_path: Path):
    settings = LlamaCppSettings(model=str(smol_path), n_ctx=1024, n_threads=1, n_parallel=4, max_queue=8)
    async with started("small", smol_path, settings) as b:
        yield b


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
    deadline = time.monotonic() + 5  # within a step or two, however busy the machine
    while backend.engine.active and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert backend.engine.active == 0
    g = await backend.generate(QUESTION)
    assert g.text


async def test_full_queue_is_refused_at_once(backend: LlamaCppBackend) -> None:
    # 10 tokens each: the burst is tokenized and queued within milliseconds, while the 12 taken
    # first need a prefill and ten decode steps before any slot frees, so the queue is full when
    # the burst's tail arrives (30 tokens each did the same at three times the CPU)
    reqs = [GenerationRequest(prompt="Once upon a time", max_tokens=10) for _ in range(30)]
    results = await asyncio.gather(*(backend.generate(r) for r in reqs), return_exceptions=True)
    refused = [r for r in results if isinstance(r, OverloadedError)]
    done = [r for r in results if isinstance(r, Generation)]
    assert refused, "a queue of 8 must refuse part of a burst of 30"
    assert len(refused) + len(done) == 30


# ---- failures: one sequence's, and the engine's ---------------------------------------------------


async def test_seeds_across_the_signed_64_bit_range(backend: LlamaCppBackend) -> None:
    for seed in (-1, -(2**63), 2**63 - 1):
        g = await backend.generate(QUESTION.with_(seed=seed, temperature=0.8, max_tokens=4))
        assert g.completion_tokens > 0
    a = await backend.generate(QUESTION.with_(seed=-1, temperature=0.8, max_tokens=8))
    b = await backend.generate(QUESTION.with_(seed=2**64 - 1, temperature=0.8, max_tokens=8))
    assert a.text == b.text  # -1 is read as the unsigned seed with the same bits


async def test_a_failing_sequence_fails_alone(backend: LlamaCppBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two requests whose own sampling fails (a NaN temperature that got past no API, and a fault
    injected into sampling from here) fail; the requests decoded beside them finish."""
    engine = backend.engine
    real = engine._sample_row

    def sample_row(row, temperature, top_p, rng):  # type: ignore[no-untyped-def]
        if temperature == 0.77:
            raise FloatingPointError("injected sampling fault")
        return real(row, temperature, top_p, rng)

    monkeypatch.setattr(engine, "_sample_row", sample_row)
    bad = [QUESTION.with_(temperature=float("nan")), QUESTION.with_(temperature=0.77)]
    good = [QUESTION.with_(temperature=0.5, seed=i, max_tokens=12) for i in range(3)]
    results = await asyncio.gather(*(backend.generate(r) for r in bad + good), return_exceptions=True)
    assert all(isinstance(r, ModelError) for r in results[:2]), results[:2]
    assert all(isinstance(r, Generation) and r.completion_tokens > 0 for r in results[2:]), results[2:]
    assert backend.ready and engine.restarts == 0
    assert (await backend.generate(QUESTION)).text


async def test_a_prompt_too_long_for_any_tokenizer_is_refused_untokenized(backend: LlamaCppBackend) -> None:
    calls = []
    real = backend.engine.tokenize
    backend.engine.tokenize = lambda *a, **k: calls.append(1) or real(*a, **k)  # type: ignore[method-assign]
    try:
        huge = "a" * (backend.max_prompt_chars + 1)
        for request in (
            GenerationRequest(prompt=huge, max_tokens=4),
            GenerationRequest(messages=(Message("user", huge),), max_tokens=4),
        ):
            with pytest.raises(ContextLengthError):
                await backend.generate(request)
        assert calls == []
    finally:
        del backend.engine.tokenize


async def test_an_engine_that_keeps_failing_restarts_then_gives_up_without_touching_a_freed_model(
    smol_path: Path,
) -> None:
    """Faults injected into the shared decode step (the engine's _step, replaced from here). Each
    fails the request in flight as unavailable; the first is followed by a restart, the second
    (max_restarts=1) leaves the tier down for good. A thread tokenizing all along only ever gets
    tokens or UnavailableError: never a read of a freed vocabulary."""
    b = LlamaCppBackend(
        "flaky", smol_path, LlamaCppSettings(model=str(smol_path), n_ctx=512, n_threads=1, n_parallel=2), 16
    )
    b.engine.max_restarts = 1
    b.engine.restart_backoff_s = 0.2
    await b.start()

    def broken(running: object) -> None:
        raise RuntimeError("injected decode failure")

    outcomes: list[str] = []
    stop = threading.Event()

    def tokenize_all_along() -> None:
        while not stop.is_set():
            try:
                b.engine.tokenize("hello world " * 50, add_special=True, parse_special=False)
                outcomes.append("tokens")
            except UnavailableError:
                outcomes.append("unavailable")

    hammer = threading.Thread(target=tokenize_all_along)
    hammer.start()
    try:
        assert (await b.generate(QUESTION)).text  # healthy first
        b.engine._step = broken  # type: ignore[method-assign]
        with pytest.raises(UnavailableError):
            await b.generate(QUESTION)
        assert not b.ready and b.alive  # restarting
        with pytest.raises(UnavailableError):
            await b.generate(QUESTION)
        await _until(lambda: b.ready, 60)
        assert b.engine.restarts == 1
        with pytest.raises(UnavailableError):
            await b.generate(QUESTION)  # the second failure in a row
        await _until(lambda: not b.alive, 30)
        assert not b.ready and b.engine.state == "failed"
        with pytest.raises(UnavailableError, match="down"):
            await b.generate(QUESTION)
        with pytest.raises(UnavailableError):
            b.engine.tokenize("x", add_special=True, parse_special=False)
    finally:
        stop.set()
        hammer.join()
        await b.close()
    assert "tokens" in outcomes and "unavailable" in outcomes


async def _until(condition: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def _resident_share(path: Path) -> float:
    """The share of a file's pages in the page cache (mincore over a read-only map of it)."""
    import ctypes
    import mmap

    size = path.stat().st_size
    page = mmap.PAGESIZE
    # a private map (copy on write, never written): ctypes needs a writable buffer for its address
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        libc = ctypes.CDLL(None, use_errno=True)
        pages = (size + page - 1) // page
        vec = (ctypes.c_ubyte * pages)()
        buf = (ctypes.c_char * size).from_buffer(m)
        try:
            assert libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec) == 0
        finally:
            del buf
        return sum(b & 1 for b in vec) / pages


def test_a_model_file_is_read_ahead_before_llama_cpp_maps_it(tmp_path: Path) -> None:
    """A cold model file is read in large sequential reads, not faulted in page by page by the
    load: after `read_ahead` its pages are in the page cache (a missing file is left to llama.cpp)."""
    import os

    from router.backends.llama.native import read_ahead

    model = tmp_path / "cold.gguf"
    model.write_bytes(os.urandom(8 << 20))
    with open(model, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if _resident_share(model) > 0.5:
        pytest.skip("this file system keeps the file cached whatever it is advised")
    read_ahead(model)
    deadline = time.monotonic() + 10
    while _resident_share(model) < 0.99 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _resident_share(model) >= 0.99
    read_ahead(tmp_path / "missing.gguf")  # no error: llama.cpp says what is wrong with it
