"""Escalation that reuses the rejected answer: the next local tier reads it as its first draft.

On the real SmolLM2-135M. The backend tests give a rejected answer that follows the target's own
greedy answer for a while and then diverges: the agreed prefix is kept in one pass, the rest is
refused, and the answer is the one the tier gives from scratch. The end-to-end test runs the
service with two local tiers of one vocabulary and a verifier that rejects every small answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from router.backends.llama.backend import LlamaCppBackend
from router.generation import Delta, Generation
from tests.support.local_tiers import ASK, ask, ask_auto, drafts, engine_settings, started, two_tier_service
from tests.support.metrics import samples, value

pytestmark = pytest.mark.slow  # loads a model, starts processes or spends seconds of CPU

REJECT_ALL = '[[tiers.verifiers]]\nname = "format"\nparams = { regex = "^NEVER-MATCHES$" }\n'


@pytest.fixture(scope="module")
async def large(smol_path: Path):
    async with started("large", smol_path, engine_settings(smol_path)) as b:
        yield b


@pytest.fixture(scope="module")
async def small(smol_path: Path):
    async with started("small", smol_path, engine_settings(smol_path)) as b:
        yield b


@pytest.fixture(scope="module")
async def scratch(large: LlamaCppBackend) -> Generation:
    """The large tier's own greedy answer to ASK (48 tokens), computed once: the tests that
    compare a reused answer with it asked for the same greedy answer four times."""
    return await large.generate(ask())


async def test_a_rejected_answer_that_diverges_midway_gives_the_answer_from_scratch(
    large: LlamaCppBackend, small: LlamaCppBackend, scratch: Generation
) -> None:
    assert large.reuses(small) and not large.reuses(large)
    half = len(scratch.text) // 2
    rejected = scratch.text[:half] + " Bananas are purple, and so is every cloud above the moon."
    steps = large.engine.steps
    reused = await large.generate_reusing(ask(), rejected)
    assert reused.text == scratch.text
    assert reused.completion_tokens == scratch.completion_tokens
    assert reused.token_logprobs == pytest.approx(scratch.token_logprobs, abs=1e-3)
    tokens, accepted = drafts(reused, "rejected")
    agreed = len(large.engine.tokenize(scratch.text[:half], add_special=False, parse_special=False))
    # the agreed prefix is kept (give or take the token the cut splits), the divergent rest is not
    assert agreed - 2 <= accepted < tokens
    assert accepted < reused.completion_tokens
    # prompt and the agreed prefix in one pass: far fewer steps than one a token
    assert large.engine.steps - steps <= reused.completion_tokens - accepted + 5


async def test_a_rejected_answer_that_differs_at_first_is_found_again(
    large: LlamaCppBackend, scratch: Generation
) -> None:
    """A reworded opening does not waste the rest: the answer's last tokens find their place in
    the rejected answer, which drafts from there."""
    rejected = "Certainly, here is my answer for you. " + scratch.text
    reused = await large.generate_reusing(ask(max_tokens=48), rejected)
    assert reused.text == scratch.text
    assert drafts(reused, "rejected")[1] >= reused.completion_tokens // 2


async def test_reuse_under_sampling_still_answers(large: LlamaCppBackend, scratch: Generation) -> None:
    req = ask(temperature=0.7, seed=3)
    a, b = await large.generate_reusing(req, scratch.text), await large.generate_reusing(req, scratch.text)
    assert a.text and a.text == b.text  # seeded: reproducible
    assert drafts(a, "rejected")[0] > 0


async def test_an_answer_that_agrees_entirely_is_taken_in_a_few_steps(large: LlamaCppBackend) -> None:
    scratch = await large.generate(ask(max_tokens=40))
    steps = large.engine.steps
    pieces, final = [], None
    async for item in large.stream_reusing(ask(max_tokens=40), scratch.text):
        if isinstance(item, Delta):
            pieces.append(item.text)
        else:
            final = item
    assert final is not None and final.text == scratch.text == "".join(pieces)
    tokens, accepted = drafts(final, "rejected")
    assert accepted >= tokens - 1 and accepted >= final.completion_tokens - 2
    assert large.engine.steps - steps <= 4


async def test_reuse_then_the_draft_model_carries_on(smol_path: Path, scratch: Generation) -> None:
    async with started("drafted", smol_path, engine_settings(smol_path, draft_p_min=0.0), smol_path) as drafted:
        rejected = scratch.text[: len(scratch.text) // 3] + " Zebra zebra zebra."
        g = await drafted.generate_reusing(ask(max_tokens=48), rejected)
        assert g.text == scratch.text
        assert drafts(g, "rejected")[1] > 0 and drafts(g, "model")[1] > 0


async def test_reuse_can_be_turned_off(smol_path: Path, small: LlamaCppBackend) -> None:
    async with started("off", smol_path, engine_settings(smol_path, reuse_rejected=False)) as off:
        assert not off.reuses(small)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openai.OpenAI, str]]:
    with two_tier_service(tmp_path_factory.mktemp("reuse"), threshold=0.5, verifiers=REJECT_ALL) as service:
        yield service


@pytest.mark.parametrize("stream", [False, True])
def test_the_escalated_answer_reuses_the_small_tiers_and_is_the_large_tiers_own(
    service: tuple[openai.OpenAI, str], stream: bool
) -> None:
    import httpx

    client, url = service
    messages = [{"role": "user", "content": ASK}]
    direct = client.chat.completions.create(model="large", messages=messages, max_tokens=32)  # type: ignore[arg-type]
    before = samples(httpx.get(f"{url}/metrics").text)
    text, ext = ask_auto(client, messages, stream=stream)
    after = samples(httpx.get(f"{url}/metrics").text)
    assert text == direct.choices[0].message.content
    small, large = ext["attempts"]
    assert small["accepted"] is False and large["accepted"] is True
    assert small["draft_tokens"] == 0 and small["drafts"] == {}
    # the same model on both tiers: its rejected answer is the large tier's own, kept whole
    assert large["drafts"]["rejected"]["tokens"] > 0
    assert large["draft_accepted"] == large["drafts"]["rejected"]["accepted"] >= large["completion_tokens"] - 2
    assert large["draft_tokens"] == large["drafts"]["rejected"]["tokens"]
    assert "scored" not in large["drafts"]  # no cross_tier scoring here: nothing to start from
    for name, key in (
        ("tierroute_draft_tokens_total", "tokens"),
        ("tierroute_draft_accepted_tokens_total", "accepted"),
    ):
        grew = value(after, name, tier="large", source="rejected") - value(
            before, name, tier="large", source="rejected"
        )
        assert grew == large["drafts"]["rejected"][key]
    assert value(after, "tierroute_draft_tokens_total", tier="small", source="model") == 0
