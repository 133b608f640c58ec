"""Top-k log-probabilities from the local engine, checked against llama-cpp-python's own logits
for the same tokens on the real SmolLM2-135M model."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from router.backends.llama.backend import LlamaCppBackend
from router.config import LlamaCppSettings
from router.generation import Delta, Generation, GenerationRequest, Message, TokenLogprob

PROMPT = GenerationRequest(prompt="The capital of France is", max_tokens=8)
K = 5


@pytest.fixture(scope="module")
async def backend(smol_path: Path):
    b = LlamaCppBackend(
        "small",
        smol_path,
        LlamaCppSettings(model=str(smol_path), n_ctx=512, n_threads=1, n_parallel=2, max_queue=8),
        512,
    )
    await b.start()
    yield b
    await b.close()


def reference_top(smol_path: Path, prompt_tokens: list[int], steps: int, k: int) -> list[list[tuple[str, float]]]:
    """Greedy decoding with llama-cpp-python's high-level API, every position's logits kept, and
    the top k computed here from them: an independent path to the same numbers."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(smol_path), n_ctx=256, n_threads=1, logits_all=True, verbose=False)
    try:
        llm.eval(prompt_tokens)
        out = []
        for _ in range(steps):
            row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            logprobs = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
            best = np.argsort(-logprobs)[:k]
            out.append([(llm.detokenize([int(t)]).decode("utf-8", errors="replace"), float(logprobs[t])) for t in best])
            llm.eval([int(best[0])])
        return out
    finally:
        llm.close()


async def test_greedy_top_k_matches_a_direct_computation(backend: LlamaCppBackend, smol_path: Path) -> None:
    g = await backend.generate(PROMPT.with_(top_logprobs=K))
    assert g.top_logprobs is not None and g.token_logprobs is not None
    assert len(g.top_logprobs) == g.completion_tokens == len(g.token_logprobs)
    assert "".join(t.token for t in g.top_logprobs) == g.text
    tokens = await asyncio.to_thread(backend.prompt_tokens, PROMPT)
    ref = await asyncio.to_thread(reference_top, smol_path, tokens, len(g.top_logprobs), K)
    for ours, theirs, sampled in zip(g.top_logprobs, ref, g.token_logprobs, strict=True):
        assert len(ours.top) == K
        # greedy: the likeliest alternative is the token that was generated, with its logprob
        assert ours.top[0] == (ours.token, ours.logprob)
        assert ours.logprob == sampled
        assert ours.top[0][0] == theirs[0][0]
        assert [lp for _, lp in ours.top] == sorted((lp for _, lp in ours.top), reverse=True)
        assert sum(np.exp(lp) for _, lp in ours.top) <= 1.0 + 1e-6
        # The reference decodes through another compute graph (one context, other batch shapes):
        # on a 4-bit model its logits differ by up to a few tenths of a nat, which reorders near
        # ties in the tail, never the likeliest tokens nor a logprob by more than that.
        assert len({p for p, _ in ours.top[:3]} & {p for p, _ in theirs[:3]}) >= 2
        theirs_by_piece = dict(theirs)
        shared = [(lp, theirs_by_piece[p]) for p, lp in ours.top if p in theirs_by_piece]
        assert len(shared) >= 3
        assert all(abs(a - b) < 0.35 for a, b in shared), shared


async def test_sampled_token_is_among_its_alternatives_or_below_them(backend: LlamaCppBackend) -> None:
    g = await backend.generate(PROMPT.with_(temperature=1.0, seed=3, top_logprobs=3, max_tokens=16))
    assert g.top_logprobs is not None
    for t in g.top_logprobs:
        assert len(t.top) == 3
        assert all(lp <= 0.0 for _, lp in t.top)
        # the sampled token is one of the k likeliest, or no likelier than the k-th
        assert (t.token, t.logprob) in t.top or t.logprob <= t.top[-1][1] + 1e-6


async def test_no_top_logprobs_unless_asked(backend: LlamaCppBackend) -> None:
    g = await backend.generate(PROMPT)
    assert g.top_logprobs is None
    pieces = [d async for d in backend.stream(PROMPT) if isinstance(d, Delta)]
    assert all(d.top_logprobs is None for d in pieces)


async def test_stream_pieces_carry_their_tokens(backend: LlamaCppBackend) -> None:
    req = GenerationRequest(messages=(Message("user", "Name three colours."),), max_tokens=20, top_logprobs=2)
    deltas: list[Delta] = []
    final: Generation | None = None
    async for item in backend.stream(req):
        if isinstance(item, Delta):
            deltas.append(item)
        else:
            final = item
    assert final is not None and final.top_logprobs is not None
    streamed: list[TokenLogprob] = [t for d in deltas for t in d.top_logprobs or ()]
    assert streamed == list(final.top_logprobs)
    assert "".join(t.token for t in streamed) == final.text


async def test_asking_for_top_k_costs_little(backend: LlamaCppBackend) -> None:
    """The default path computes nothing extra; with k=20 each token costs one partial sort of
    the row and 20 piece lookups, small against a decode step."""
    req = PROMPT.with_(max_tokens=32, stop=())

    async def timed(k: int) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            g = await backend.generate(req.with_(top_logprobs=k))
            best = min(best, (time.perf_counter() - t0) / max(1, g.completion_tokens))
        return best

    plain, with_top = await timed(0), await timed(20)
    # best of three each: generous, as a shared machine's noise is large against a 135M model's step
    assert with_top < plain * 2 + 0.005, (plain, with_top)


def test_a_request_refuses_more_than_twenty() -> None:
    with pytest.raises(ValueError, match="top_logprobs"):
        PROMPT.with_(top_logprobs=21)
    with pytest.raises(ValueError, match="top_logprobs"):
        PROMPT.with_(top_logprobs=-1)
