"""Scoring a given answer by prefill on the real SmolLM2-135M model (`score_continuation`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from router.backends.base import ContinuationScore
from router.backends.llama.backend import LlamaCppBackend
from router.config import LlamaCppSettings
from router.errors import ContextLengthError, DeadlineError, RequestError
from router.generation import GenerationRequest, Message

QUESTION = GenerationRequest(messages=(Message("user", "What is 17 * 3? Explain briefly."),), max_tokens=40)
ANSWER = "17 * 3 is 51, because 17 + 17 + 17 = 51. So the answer is 51."


@pytest.fixture(scope="module")
async def backend(smol_path: Path):
    # a small batch: a long answer is prefilled over several steps, as a busy engine would
    b = LlamaCppBackend(
        "scorer",
        smol_path,
        LlamaCppSettings(model=str(smol_path), n_ctx=512, n_threads=1, n_batch=32, n_parallel=3, max_queue=8),
        256,
    )
    await b.start()
    yield b
    await b.close()


def _direct(smol_path: Path, tokens: list[int], score_from: int) -> tuple[np.ndarray, np.ndarray]:
    """The same numbers from llama-cpp-python's own Llama class, logits for every position. The
    engine's context leaves flash attention to llama.cpp's default (on, on this CPU); without it the
    logprobs of this 4-bit model drift by up to 0.4, so the reference uses it too, and the engine's
    micro-batch size (the kernels' accumulation order depends on it)."""
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(smol_path),
        n_ctx=512,
        n_threads=1,
        logits_all=True,
        flash_attn=True,
        n_batch=32,
        n_ubatch=32,
        verbose=False,
    )
    try:
        llm.eval(tokens)
        scores = np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()
    rows = scores[score_from - 1 : len(tokens) - 1]
    targets = np.array(tokens[score_from:])
    peak = rows.max(axis=1)
    lse = peak + np.log(np.exp(rows - peak[:, None]).sum(axis=1))
    return rows[np.arange(len(targets)), targets] - lse, rows.argmax(axis=1) == targets


async def test_matches_a_direct_computation(backend: LlamaCppBackend, smol_path: Path) -> None:
    tokens, score_from = await asyncio.to_thread(backend.scoring_tokens, QUESTION, ANSWER)
    s = await backend.score_continuation(QUESTION, ANSWER)
    assert isinstance(s, ContinuationScore)
    assert s.prompt_tokens == len(tokens) and s.continuation_tokens == len(tokens) - score_from
    assert s.seconds > 0
    want_lp, want_top = await asyncio.to_thread(_direct, smol_path, tokens, score_from)
    assert np.allclose(s.token_logprobs, want_lp, atol=1e-3), np.abs(np.array(s.token_logprobs) - want_lp).max()
    assert s.top1 == tuple(bool(v) for v in want_top)


async def test_long_answer_over_many_steps_matches_a_short_batch(backend: LlamaCppBackend) -> None:
    # more candidate tokens than SCORE_ROWS_PER_STEP and than n_batch: chunked in several steps
    answer = " ".join(f"{i} plus one is {i + 1}." for i in range(20))
    s = await backend.score_continuation(QUESTION, answer)
    assert s.continuation_tokens > 64
    again = await backend.score_continuation(QUESTION, answer)  # its prompt prefix now comes from the cache
    assert np.allclose(s.token_logprobs, again.token_logprobs, atol=1e-3)


async def test_own_greedy_answer_is_all_top_choices(backend: LlamaCppBackend) -> None:
    g = await backend.generate(QUESTION)
    assert g.text.strip()
    s = await backend.score_continuation(QUESTION, g.text)
    assert s.continuation_tokens > 5
    assert all(s.top1), s.top1
    # the same numbers as generation's own logprobs where the tokenization round-trips
    assert g.token_logprobs is not None
    if s.continuation_tokens == len(g.token_logprobs):
        assert np.allclose(s.token_logprobs, g.token_logprobs, atol=1e-3)


async def test_a_wrong_answer_scores_lower(backend: LlamaCppBackend) -> None:
    right = await backend.score_continuation(QUESTION, ANSWER)
    wrong = await backend.score_continuation(QUESTION, "Purple elephants 8822 zq whisk the ledger.")
    assert np.mean(wrong.token_logprobs) < np.mean(right.token_logprobs)


async def test_scoring_beside_generation(backend: LlamaCppBackend) -> None:
    """Scoring jobs and generating sequences share decode steps; neither disturbs the other."""
    alone = await backend.generate(QUESTION)
    score_alone = await backend.score_continuation(QUESTION, ANSWER)
    results = await asyncio.gather(
        backend.generate(QUESTION),
        backend.score_continuation(QUESTION, ANSWER),
        backend.score_continuation(QUESTION.with_(messages=(Message("user", "Say hi."),)), ANSWER),
    )
    assert results[0].text == alone.text
    assert np.allclose(results[1].token_logprobs, score_alone.token_logprobs, atol=1e-3)


async def test_too_long_answer_is_refused(backend: LlamaCppBackend) -> None:
    with pytest.raises(ContextLengthError):
        await backend.score_continuation(QUESTION, "word " * 600)
    with pytest.raises(RequestError):
        await backend.score_continuation(QUESTION, "")
    assert (await backend.score_continuation(QUESTION, ANSWER)).continuation_tokens > 0  # still serving


async def test_deadline_and_cancellation(backend: LlamaCppBackend) -> None:
    with pytest.raises(DeadlineError):
        await backend.score_continuation(QUESTION.with_(deadline=time.monotonic() - 1), ANSWER)
    task = asyncio.create_task(backend.score_continuation(QUESTION, "word " * 300))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # a new answer (a remembered one would not reach the engine): the cancelled slot is free by then
    assert (await backend.score_continuation(QUESTION, ANSWER + " Done.")).continuation_tokens > 0
    for _ in range(100):  # the engine frees a finished or cancelled job's slot at its next step
        if backend.engine.active == 0:
            break
        await asyncio.sleep(0.05)
    assert backend.engine.active == 0


async def test_the_same_answer_scored_twice_is_prefilled_once(backend: LlamaCppBackend) -> None:
    asked = GenerationRequest(messages=(Message("user", "Name a colour of the sky."),), deadline=time.monotonic() + 120)
    jobs = 0
    real = backend._score_tokens

    async def counting(*args: object) -> ContinuationScore:
        nonlocal jobs
        jobs += 1
        return await real(*args)  # type: ignore[arg-type]

    backend._score_tokens = counting  # type: ignore[method-assign]
    try:
        a, b = await asyncio.gather(
            backend.score_continuation(asked, "It is blue, mostly."),
            backend.score_continuation(asked, "It is blue, mostly."),
        )
        c = await backend.score_continuation(asked, "It is blue, mostly.")
        other = await backend.score_continuation(asked, "Grey, when it rains.")
    finally:
        del backend._score_tokens
    assert jobs == 2  # one for the repeated answer (two at once, then again), one for the other
    assert a == b == c and a.seconds > 0  # each asker is told the full cost of the score
    assert other.token_logprobs != a.token_logprobs


async def test_answers_scored_before_anyone_started_the_tier_wait_for_its_one_load(smol_path: Path) -> None:
    # an eval scoring a stored run: the scoring tier generated nothing, so nothing started it
    cold = LlamaCppBackend(
        "cold", smol_path, LlamaCppSettings(model=str(smol_path), n_ctx=512, n_threads=1, n_parallel=3), 256
    )
    try:
        scores = await asyncio.gather(*(cold.score_continuation(QUESTION, f"{ANSWER} ({k})") for k in range(4)))
    finally:
        await cold.close()
    assert all(s.continuation_tokens > 0 for s in scores)
