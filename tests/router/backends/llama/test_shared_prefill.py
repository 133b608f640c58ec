"""One prefill, two uses: the `cross_tier` scoring pass of a rejected answer serves its reuse.

On the real SmolLM2-135M. When the next tier scored the rejected answer (prompt + answer, in one
prefill) and the answer escalates there, a greedy answer starts with the answer's tokens the
scoring found to be the model's own argmax, their KV taken from the prefix cache: the engine reads
the agreed start once, for scoring, not again for reuse. The answer is the one the reuse path
gives without the scoring, and the one the tier gives from scratch. Where the tokens differ (a
clipped candidate), under sampling, or when the KV is gone, the reuse path runs as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from router.backends.llama.backend import LlamaCppBackend
from router.generation import Delta, Generation, GenerationRequest
from tests.support.local_tiers import ASK, ask, ask_auto, drafts, engine_settings, started, two_tier_service

pytestmark = pytest.mark.slow  # loads a model, starts processes or spends seconds of CPU


def _agreed(top1: tuple[bool, ...]) -> int:
    return next((i for i, top in enumerate(top1) if not top), len(top1))


@pytest.fixture(scope="module")
async def large(smol_path: Path):
    async with started("large", smol_path, engine_settings(smol_path)) as b:
        yield b


async def _read(backend: LlamaCppBackend, request: GenerationRequest, rejected: str) -> tuple[Generation, int]:
    """The reuse answer and the tokens the engine read for it."""
    before = backend.engine.tokens_read
    g = await backend.generate_reusing(request, rejected)
    return g, backend.engine.tokens_read - before


@pytest.fixture(scope="module")
async def scratch(large: LlamaCppBackend) -> Generation:
    """The tier's own greedy answer to ASK (48 tokens), computed once for the three tests that
    start from it."""
    return await large.generate(ask())


async def test_a_scored_rejected_answer_is_not_read_again(large: LlamaCppBackend, scratch: Generation) -> None:
    request = ask()
    half = len(scratch.text) // 2
    rejected = scratch.text[:half] + " Bananas are purple, and so is every cloud above the moon."
    today, read_today = await _read(large, request, rejected)  # not scored yet: the reuse path as it was
    assert drafts(today, "scored") == (0, 0) and drafts(today, "rejected")[1] > 0

    scored = await large.score_continuation(request, rejected)
    agreed = _agreed(scored.top1)
    assert 10 <= agreed < scored.continuation_tokens  # the cut parts them midway
    shared, read_shared = await _read(large, request, rejected)
    assert shared.text == today.text == scratch.text
    assert shared.completion_tokens == scratch.completion_tokens
    # the agreed start's logprobs are the scoring pass's; after it the KV the decode reads was laid
    # out by another pass (other cells, other summation order), and this 4-bit model's logits move
    # by a few hundredths where that differs: the tokens, which are the contract, do not
    assert shared.token_logprobs[:agreed] == pytest.approx(scratch.token_logprobs[:agreed], abs=1e-3)
    assert shared.token_logprobs == pytest.approx(scratch.token_logprobs, abs=0.25)
    # the agreed start came from the scoring pass: counted apart, refused token included
    assert drafts(shared, "scored") == (agreed + 1, agreed)
    # and was not read again: one token of it (the last, for the next token's logits) at most
    assert read_shared <= shared.completion_tokens - agreed + drafts(shared, "rejected")[0]
    assert read_shared + agreed - 1 <= read_today


async def test_a_stop_string_inside_the_scored_start_ends_the_answer_there(large: LlamaCppBackend) -> None:
    base = await large.generate(ask(max_tokens=40))
    words = base.text.split()
    stop = " " + words[len(words) // 2]  # a word in the middle of the answer
    request = ask(max_tokens=40, stop=(stop,))
    plain = await large.generate(request)
    assert plain.finish_reason == "stop" and len(plain.text) < len(base.text)
    await large.score_continuation(request, base.text)
    shared, read = await _read(large, request, base.text)
    assert (shared.text, shared.finish_reason) == (plain.text, "stop")
    assert drafts(shared, "scored")[1] >= shared.completion_tokens
    assert read == 0  # the answer ended inside what the scoring had read: nothing decoded


async def test_a_candidate_scored_in_other_tokens_is_read_as_a_draft_as_before(
    large: LlamaCppBackend, scratch: Generation
) -> None:
    request = ask()
    rejected = scratch.text[: 2 * len(scratch.text) // 3] + " The moon is made of green cheese, they say."
    await large.score_continuation(request, rejected[: len(rejected) - 7])  # clipped, as max_chars does
    g, _ = await _read(large, request, rejected)
    assert g.text == scratch.text
    assert drafts(g, "scored") == (0, 0) and drafts(g, "rejected")[1] > 0


async def test_sampling_keeps_the_reuse_path(large: LlamaCppBackend, scratch: Generation) -> None:
    request = ask(temperature=0.7, seed=5)
    await large.score_continuation(request, scratch.text)
    a, b = await large.generate_reusing(request, scratch.text), await large.generate_reusing(request, scratch.text)
    assert a.text and a.text == b.text
    assert drafts(a, "scored") == (0, 0) and drafts(a, "rejected")[0] > 0


async def test_without_the_scored_kv_the_reuse_path_runs(smol_path: Path, large: LlamaCppBackend) -> None:
    """A tier with no prefix cache keeps nothing of the scoring pass: the answer is read as a draft."""
    async with started("bare", smol_path, engine_settings(smol_path, prefix_cache_slots=0)) as bare:
        request = ask(max_tokens=40)
        scratch = await bare.generate(request)
        rejected = scratch.text[: len(scratch.text) // 2] + " Zebra zebra zebra."
        await bare.score_continuation(request, rejected)
        g, _ = await _read(bare, request, rejected)
        assert g.text == scratch.text
        assert drafts(g, "scored") == (0, 0) and drafts(g, "rejected")[1] > 0


async def test_streaming_gives_the_scored_start_first(large: LlamaCppBackend) -> None:
    # (a prompt without near ties in its answer: "Name three colours of the rainbow ..." ends at
    # one, " a" against " created" 0.1 apart, which KV laid out by another pass can tip)
    request = ask(max_tokens=40, text="Why do leaves change colour in autumn?")
    scratch = await large.generate(request)
    await large.score_continuation(request, scratch.text)
    pieces, final = [], None
    async for item in large.stream_reusing(request, scratch.text):
        if isinstance(item, Delta):
            pieces.append(item.text)
        else:
            final = item
    assert final is not None and final.text == scratch.text == "".join(pieces)
    assert drafts(final, "scored")[1] >= final.completion_tokens - 1


CROSS_TIER = (
    '[[tiers.verifiers]]\nname = "cross_tier"\nparams = { tier = "large" }\n'
    '[[tiers.verifiers]]\nname = "format"\nparams = { regex = "^NEVER-MATCHES$" }\n'
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openai.OpenAI, str]]:
    # cross_tier (the large tier reads the small answer) and a format check that fails: every
    # small answer is scored by the large tier and rejected
    with two_tier_service(tmp_path_factory.mktemp("shared"), threshold=0.99, verifiers=CROSS_TIER) as service:
        yield service


@pytest.mark.parametrize("stream", [False, True])
def test_the_escalated_answer_starts_where_the_scoring_left_it(
    service: tuple[openai.OpenAI, str], stream: bool
) -> None:
    client, _ = service
    messages = [{"role": "user", "content": f"{ASK} ({'streamed' if stream else 'whole'})"}]
    direct = client.chat.completions.create(model="large", messages=messages, max_tokens=32)  # type: ignore[arg-type]
    text, ext = ask_auto(client, messages, stream=stream)
    assert text == direct.choices[0].message.content
    small, large = ext["attempts"]
    assert small["accepted"] is False and large["accepted"] is True
    scored = small["scores"]["cross_tier"]["details"]
    assert scored["tier"] == "large" and scored["tokens"] == small["completion_tokens"]
    # the same model on both tiers: the scoring agreed with the small answer, which the large tier
    # took from that pass without reading it again
    assert large["drafts"]["scored"]["accepted"] >= min(small["completion_tokens"], large["completion_tokens"]) - 2
    assert large["draft_accepted"] >= large["drafts"]["scored"]["accepted"]
