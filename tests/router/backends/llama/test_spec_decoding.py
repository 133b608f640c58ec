"""Speculative decoding in the local engine, on the real SmolLM2-135M drafting for itself.

A model drafting for itself agrees with itself: greedy drafts are all accepted, sampled ones too
(p == q keeps every token), so these tests see the most drafting, and any output that differs from
plain decoding is a bug in the verification, the KV bookkeeping or the per-sequence state.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from router.backends.llama.backend import LlamaCppBackend, draft_problem
from router.backends.llama.engine import LlamaEngine
from router.config import LlamaCppSettings
from router.errors import ModelError
from router.generation import Delta, Generation, GenerationRequest, Message, ResponseFormat

PROMPTS = [
    "Write a short poem about the sea.",
    "List three prime numbers and explain why each is prime.",
    "What is the capital of France? Answer in one sentence, then say something about its history.",
    "Count from one to twenty in words.",
]


COMPARED = 24  # tokens of the answers compared with the plain model's


def _ask(text: str, **kw: object) -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", text),), max_tokens=int(kw.pop("max_tokens", 48)), **kw)  # type: ignore[arg-type]


def _settings(path: Path, **kw: object) -> LlamaCppSettings:
    return LlamaCppSettings(model=str(path), n_ctx=2048, n_threads=1, n_parallel=4, max_queue=16, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
async def plain(smol_path: Path):
    b = LlamaCppBackend("plain", smol_path, _settings(smol_path), 512)
    await b.start()
    yield b
    await b.close()


@pytest.fixture(scope="module")
async def drafted(smol_path: Path):
    b = LlamaCppBackend(
        "drafted", smol_path, _settings(smol_path, draft_max=6, draft_p_min=0.0, draft_max_batch=8), 512, smol_path
    )
    await b.start()
    yield b
    await b.close()


@pytest.fixture(scope="module")
async def plain_answers(plain: LlamaCppBackend) -> list[Generation]:
    """The plain model's greedy answer to each prompt, one stream at a time, computed once for the
    tests that compare drafted answers with it (with top-5 logprobs: the answer and its own
    logprobs are those of a request without them). COMPARED tokens each: four drafting steps a
    sequence, enough for drafts mixed up between steps or sequences to show (48 cost twice the
    CPU, for this tier decodes at about 20 ms a token)."""
    return [await plain.generate(_ask(t, top_logprobs=5, max_tokens=COMPARED)) for t in PROMPTS]


def _accepted(g: Generation, source: str = "model") -> tuple[int, int]:
    found = {s: (t, a) for s, t, a in g.drafts}
    return found.get(source, (0, 0))


async def test_greedy_drafted_answers_are_the_plain_answers(
    plain_answers: list[Generation], drafted: LlamaCppBackend
) -> None:
    before = drafted.draft_counts()["model"]
    for text, a in zip(PROMPTS[:2], plain_answers, strict=False):
        b = await drafted.generate(_ask(text, max_tokens=COMPARED))
        assert b.text == a.text
        assert b.completion_tokens == a.completion_tokens
        assert b.finish_reason == a.finish_reason
        assert a.token_logprobs is not None and b.token_logprobs is not None
        assert b.token_logprobs == pytest.approx(a.token_logprobs, abs=1e-3)
        tokens, accepted = _accepted(b)
        # a model agrees with itself: nearly every drafted token is kept, and most of the answer
        # came from drafts (each step adds a token of its own after the kept draft)
        assert tokens >= b.completion_tokens // 2
        assert accepted >= 0.95 * tokens
        assert _accepted(a) == (0, 0)
    after = drafted.draft_counts()["model"]
    assert after[0] > before[0] and after[1] > before[1]


async def test_several_sequences_draft_in_the_same_steps(
    plain_answers: list[Generation], drafted: LlamaCppBackend
) -> None:
    """Sequences drafting side by side keep their own KV and state. llama.cpp's numbers depend on
    what else shares a decode step (plain continuous batching alone moves a logprob by up to ~0.1
    here, so a near tie can go the other way): each answer must be the plain single-stream answer
    up to a near tie of the plain model, where it takes one of the two likeliest tokens, never a
    token the model was sure against, which is what mixed-up KV or state would give."""
    expected = plain_answers
    steps = drafted.engine.steps
    got = await asyncio.gather(*(drafted.generate(_ask(t, top_logprobs=5, max_tokens=COMPARED)) for t in PROMPTS))
    for want, g in zip(expected, got, strict=True):
        assert want.top_logprobs is not None and g.top_logprobs is not None
        diverged = next(
            (i for i, (a, b) in enumerate(zip(want.top_logprobs, g.top_logprobs, strict=False)) if a.token != b.token),
            None,
        )
        if diverged is None:
            assert g.text == want.text
            continue
        top = want.top_logprobs[diverged].top
        near = [token for token, lp in top if top[0][1] - lp < 0.5]  # the plain model's near ties here
        assert len(near) > 1, (diverged, want.top_logprobs[diverged], g.top_logprobs[diverged])
        assert g.top_logprobs[diverged].token in near, (diverged, want.top_logprobs[diverged], g.top_logprobs[diverged])
    # the draft context's numbers move with the batch as the target's do: near ties split them
    assert all(_accepted(g)[0] > 0 and _accepted(g)[1] >= 0.75 * _accepted(g)[0] for g in got), [g.drafts for g in got]
    # together, in fewer steps than one token a step would need for the longest answer alone
    assert drafted.engine.steps - steps < max(g.completion_tokens for g in got)


async def test_streamed_drafted_text_is_the_whole_answer(drafted: LlamaCppBackend) -> None:
    pieces, final = [], None
    async for item in drafted.stream(_ask(PROMPTS[3], max_tokens=40)):
        if isinstance(item, Delta):
            pieces.append(item.text)
        else:
            final = item
    assert final is not None and "".join(pieces) == final.text


async def test_length_limit_holds_with_drafts(plain: LlamaCppBackend, drafted: LlamaCppBackend) -> None:
    for n in (1, 2, 5, 13):
        a = await plain.generate(_ask(PROMPTS[1], max_tokens=n))
        b = await drafted.generate(_ask(PROMPTS[1], max_tokens=n))
        assert b.completion_tokens == a.completion_tokens <= n
        assert b.text == a.text


async def test_stop_strings_cut_drafted_text_as_plain(plain: LlamaCppBackend, drafted: LlamaCppBackend) -> None:
    req = _ask(PROMPTS[3], max_tokens=60, stop=("five",))
    a, b = await plain.generate(req), await drafted.generate(req)
    assert b.text == a.text and b.finish_reason == a.finish_reason


async def test_sampling_with_a_self_draft_keeps_every_draft(drafted: LlamaCppBackend) -> None:
    """p == q: the rejection rule keeps each token (min(1, p/q) = 1), so sampled answers draft
    as much as greedy ones; seeded answers stay reproducible (24 tokens: three drafting steps)."""
    req = _ask(PROMPTS[0], temperature=0.8, seed=7, max_tokens=24)
    a, b = await drafted.generate(req), await drafted.generate(req)
    assert a.text == b.text
    tokens, accepted = _accepted(a)
    assert tokens > 0 and accepted >= 0.95 * tokens


async def test_grammar_and_penalties_do_not_draft(drafted: LlamaCppBackend) -> None:
    fmt = await drafted.generate(
        _ask("Give a JSON object with a key a.", response_format=ResponseFormat("json_object"))
    )
    pen = await drafted.generate(_ask(PROMPTS[0], presence_penalty=0.5))
    assert fmt.drafts == () and pen.drafts == ()
    assert fmt.constrained and fmt.text.strip().startswith("{")


async def _until(condition, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_cancelling_mid_draft_frees_the_sequence_in_both_contexts(drafted: LlamaCppBackend) -> None:
    import llama_cpp as lc

    engine = drafted.engine
    stream = drafted.stream(_ask(PROMPTS[3], max_tokens=200))
    got = 0
    async for item in stream:
        if isinstance(item, Delta):
            got += 1
            if got == 3:
                break
    await stream.aclose()  # type: ignore[attr-defined]
    await _until(lambda: engine.active == 0 and engine.queue_depth == 0, 30)
    await asyncio.sleep(0.1)  # the engine thread is idle: its memories can be read
    for seq_id in range(engine.n_parallel):
        assert lc.llama_memory_seq_pos_max(engine._mem, seq_id) == -1
        assert lc.llama_memory_seq_pos_max(engine._dmem, seq_id) == -1
    # and the slot serves the next request, drafting again
    g = await drafted.generate(_ask(PROMPTS[1], max_tokens=16))
    assert g.completion_tokens > 0 and _accepted(g)[0] > 0


def test_a_draft_model_of_another_vocabulary_is_refused(smol_path: Path) -> None:
    qwen = smol_path.parent / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if not qwen.exists():
        pytest.skip("the Qwen2.5-Coder 0.5B model is not in the model cache")
    why = draft_problem(LlamaCppSettings(model=str(smol_path), draft_model=str(qwen), allow_unpinned=True), None)
    assert why is not None
    assert smol_path.name in why and qwen.name in why and "vocabulary" in why
    assert (
        draft_problem(LlamaCppSettings(model=str(smol_path), draft_model=str(smol_path), allow_unpinned=True), None)
        is None
    )
    engine = LlamaEngine(smol_path, n_ctx=512, n_threads=1, draft_model_path=qwen, name="mismatch")
    with pytest.raises(ModelError, match="vocabulary"):
        engine.start()


def test_the_default_pair_shares_a_vocabulary(smol_path: Path) -> None:
    small = smol_path.parent / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    large = smol_path.parent / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    if not (small.exists() and large.exists()):
        pytest.skip("the Qwen2.5-Coder models are not in the model cache")
    assert draft_problem(LlamaCppSettings(model=str(large), draft_model=str(small), allow_unpinned=True), None) is None


def test_config_check_names_the_draft_model_of_another_vocabulary(tmp_path: Path, smol_path: Path) -> None:
    from router.config import load_settings
    from router.engine import check_resources
    from tests.support.config import smol_config
    from tests.support.model import SMOL

    qwen = "qwen2.5-coder-0.5b-instruct-q4_k_m"
    if not (smol_path.parent / f"{qwen}.gguf").exists():
        pytest.skip("the Qwen2.5-Coder 0.5B model is not in the model cache")
    cfg = smol_config(tmp_path, large="none")
    body = cfg.read_text().replace(f'model = "{SMOL}"', f'model = "{SMOL}"\ndraft_model = "{qwen}"', 1)
    cfg.write_text(body)
    problems = check_resources(load_settings(cfg))
    assert len(problems) == 1, problems
    assert problems[0].startswith("tiers[0] (small).llamacpp.draft_model:")
    assert qwen in problems[0] and "smollm2" in problems[0]


async def test_the_draft_model_stands_down_while_a_batch_decodes(smol_path: Path) -> None:
    """draft_max_batch=1: a batch already reads the weights once for all its sequences, so the
    draft model drafts only for a sequence decoding alone. Four answers decoding side by side
    (without the cap each would draft, as the test above shows) leave at least one undrafted.
    16 tokens each: the first steps already draft alone and not in the batch."""
    b = LlamaCppBackend("gated", smol_path, _settings(smol_path, draft_max=6, draft_p_min=0.0), 512, smol_path)
    await b.start()
    try:
        alone = await b.generate(_ask(PROMPTS[0], max_tokens=16))
        assert _accepted(alone)[0] > 0
        got = await asyncio.gather(*(b.generate(_ask(PROMPTS[0], max_tokens=16)) for _ in range(4)))
        assert any(_accepted(g)[0] == 0 for g in got), [g.drafts for g in got]
    finally:
        await b.close()
