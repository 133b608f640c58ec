"""Escalation that reuses the rejected answer: the next local tier reads it as its first draft.

On the real SmolLM2-135M. The backend tests give a rejected answer that follows the target's own
greedy answer for a while and then diverges: the agreed prefix is kept in one pass, the rest is
refused, and the answer is the one the tier gives from scratch. The end-to-end test runs the
service with two local tiers of one vocabulary and a verifier that rejects every small answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from router.api.app import create_app
from router.backends.llamacpp import LlamaCppBackend
from router.config import LlamaCppSettings, load_settings
from router.generation import Delta, Generation, GenerationRequest, Message
from tests.support.config import smol_config
from tests.support.servers import UvicornThread

pytestmark = pytest.mark.slow  # loads a model, starts processes or spends seconds of CPU

ASK = "Explain in a few sentences why the sky is blue."
REJECT_ALL = '[[tiers.verifiers]]\nname = "format"\nparams = { regex = "^NEVER-MATCHES$" }\n'


def _ask(text: str = ASK, **kw: object) -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", text),), max_tokens=int(kw.pop("max_tokens", 48)), **kw)  # type: ignore[arg-type]


def _settings(path: Path, **kw: object) -> LlamaCppSettings:
    return LlamaCppSettings(model=str(path), n_ctx=2048, n_threads=1, n_parallel=4, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
async def large(smol_path: Path):
    b = LlamaCppBackend("large", smol_path, _settings(smol_path), 512)
    await b.start()
    yield b
    await b.close()


@pytest.fixture(scope="module")
async def small(smol_path: Path):
    b = LlamaCppBackend("small", smol_path, _settings(smol_path), 512)
    await b.start()
    yield b
    await b.close()


def _drafts(g: Generation, source: str) -> tuple[int, int]:
    return {s: (t, a) for s, t, a in g.drafts}.get(source, (0, 0))


async def test_a_rejected_answer_that_diverges_midway_gives_the_answer_from_scratch(
    large: LlamaCppBackend, small: LlamaCppBackend
) -> None:
    assert large.reuses(small) and not large.reuses(large)
    scratch = await large.generate(_ask())
    half = len(scratch.text) // 2
    rejected = scratch.text[:half] + " Bananas are purple, and so is every cloud above the moon."
    steps = large.engine.steps
    reused = await large.generate_reusing(_ask(), rejected)
    assert reused.text == scratch.text
    assert reused.completion_tokens == scratch.completion_tokens
    assert reused.token_logprobs == pytest.approx(scratch.token_logprobs, abs=1e-3)
    tokens, accepted = _drafts(reused, "rejected")
    agreed = len(large.engine.tokenize(scratch.text[:half], add_special=False, parse_special=False))
    # the agreed prefix is kept (give or take the token the cut splits), the divergent rest is not
    assert agreed - 2 <= accepted < tokens
    assert accepted < reused.completion_tokens
    # prompt and the agreed prefix in one pass: far fewer steps than one a token
    assert large.engine.steps - steps <= reused.completion_tokens - accepted + 5


async def test_a_rejected_answer_that_differs_at_first_is_found_again(large: LlamaCppBackend) -> None:
    """A reworded opening does not waste the rest: the answer's last tokens find their place in
    the rejected answer, which drafts from there."""
    scratch = await large.generate(_ask(max_tokens=48))
    rejected = "Certainly, here is my answer for you. " + scratch.text
    reused = await large.generate_reusing(_ask(max_tokens=48), rejected)
    assert reused.text == scratch.text
    assert _drafts(reused, "rejected")[1] >= reused.completion_tokens // 2


async def test_reuse_under_sampling_still_answers(large: LlamaCppBackend) -> None:
    scratch = await large.generate(_ask())
    req = _ask(temperature=0.7, seed=3)
    a, b = await large.generate_reusing(req, scratch.text), await large.generate_reusing(req, scratch.text)
    assert a.text and a.text == b.text  # seeded: reproducible
    assert _drafts(a, "rejected")[0] > 0


async def test_an_answer_that_agrees_entirely_is_taken_in_a_few_steps(large: LlamaCppBackend) -> None:
    scratch = await large.generate(_ask(max_tokens=40))
    steps = large.engine.steps
    pieces, final = [], None
    async for item in large.stream_reusing(_ask(max_tokens=40), scratch.text):
        if isinstance(item, Delta):
            pieces.append(item.text)
        else:
            final = item
    assert final is not None and final.text == scratch.text == "".join(pieces)
    tokens, accepted = _drafts(final, "rejected")
    assert accepted >= tokens - 1 and accepted >= final.completion_tokens - 2
    assert large.engine.steps - steps <= 4


async def test_reuse_then_the_draft_model_carries_on(smol_path: Path, large: LlamaCppBackend) -> None:
    drafted = LlamaCppBackend("drafted", smol_path, _settings(smol_path, draft_p_min=0.0), 512, smol_path)
    await drafted.start()
    try:
        scratch = await large.generate(_ask(max_tokens=48))
        rejected = scratch.text[: len(scratch.text) // 3] + " Zebra zebra zebra."
        g = await drafted.generate_reusing(_ask(max_tokens=48), rejected)
        assert g.text == scratch.text
        assert _drafts(g, "rejected")[1] > 0 and _drafts(g, "model")[1] > 0
    finally:
        await drafted.close()


async def test_reuse_can_be_turned_off(smol_path: Path, small: LlamaCppBackend) -> None:
    off = LlamaCppBackend("off", smol_path, _settings(smol_path, reuse_rejected=False), 512)
    await off.start()
    try:
        assert not off.reuses(small)
    finally:
        await off.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openai.OpenAI, str]]:
    tmp = tmp_path_factory.mktemp("reuse")
    cfg = smol_config(tmp, threshold=0.5, verifiers=REJECT_ALL, large="local")
    # one thread a tier: two engines of two threads each crawl on a shared two-core machine
    cfg.write_text(cfg.read_text().replace("n_threads = 2", "n_threads = 1"))
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0), srv.url


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


@pytest.mark.parametrize("stream", [False, True])
def test_the_escalated_answer_reuses_the_small_tiers_and_is_the_large_tiers_own(
    service: tuple[openai.OpenAI, str], stream: bool
) -> None:
    import httpx

    client, url = service
    messages = [{"role": "user", "content": ASK}]
    direct = client.chat.completions.create(model="large", messages=messages, max_tokens=32)  # type: ignore[arg-type]
    before = httpx.get(f"{url}/metrics").text
    if stream:
        chunks = list(client.chat.completions.create(model="auto", messages=messages, max_tokens=32, stream=True))  # type: ignore[arg-type]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        ext = chunks[-1].model_extra["tierroute"]  # type: ignore[index]
    else:
        r = client.chat.completions.create(model="auto", messages=messages, max_tokens=32)  # type: ignore[arg-type]
        text, ext = r.choices[0].message.content or "", r.model_extra["tierroute"]  # type: ignore[index]
    after = httpx.get(f"{url}/metrics").text
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
        grew = _metric(after, name, tier="large", source="rejected") - _metric(
            before, name, tier="large", source="rejected"
        )
        assert grew == large["drafts"]["rejected"][key]
    assert _metric(after, "tierroute_draft_tokens_total", tier="small", source="model") == 0
