"""The cascade's decisions, with scripted backends standing in where faults must be injected."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from router.backends.base import Backend
from router.cascade import Answering, Cascade, Final, Tier
from router.config import CascadeSettings, PriceSettings
from router.errors import UnavailableError, UnknownModelError, UpstreamError
from router.generation import Delta, Generation, GenerationRequest, Message
from tests.support.scripted import ScriptedBackend, tier

REQ = GenerationRequest(messages=(Message("user", "What is 6 * 7?"),), max_tokens=32)
TOKENS = PriceSettings(usd_per_1m_input_tokens=1000.0, usd_per_1m_output_tokens=2000.0)


def cascade(*tiers: Tier, on_unavailable: str = "error") -> Cascade:
    return Cascade(list(tiers), CascadeSettings(on_unavailable=on_unavailable))


async def test_accepts_the_small_answer_when_it_passes() -> None:
    small = ScriptedBackend("small", lambda r: "The answer is 42.")
    large = ScriptedBackend("large", lambda r: "42")
    result = await cascade(tier("small", small, regex=r"\d+"), tier("large", large, price=TOKENS)).run(REQ)
    assert result.final.tier == "small" and not result.escalated
    assert large.requests == []
    assert result.cost_usd == pytest.approx(0.25 * 0.001)  # 0.25 s busy at $3.6/hour
    # counterfactual: the same prompt and answer length at the top tier's token prices
    assert result.counterfactual_usd == pytest.approx((10 * 1000 + 5 * 2000) / 1e6)


async def test_escalates_a_rejected_answer_and_says_why() -> None:
    small = ScriptedBackend("small", lambda r: "I am not sure.")
    large = ScriptedBackend("large", lambda r: "42")
    result = await cascade(tier("small", small, regex=r"\d+"), tier("large", large, price=TOKENS)).run(REQ)
    assert result.final.tier == "large" and result.escalated
    first, second = result.attempts
    assert not first.accepted and first.score == 0.0
    assert "score 0.000 < threshold 0.50" in first.reason and "format" in first.reason
    assert second.accepted and result.generation.text == "42"
    assert result.cost_usd == pytest.approx(first.cost_usd + second.cost_usd)
    assert result.counterfactual_usd == pytest.approx(second.cost_usd)


async def test_threshold_is_inclusive() -> None:
    small = ScriptedBackend("small", lambda r: "42")
    result = await cascade(
        tier("small", small, regex=r"\d", threshold=1.0), tier("large", ScriptedBackend("large", str))
    ).run(REQ)
    assert result.final.tier == "small"


async def test_last_tier_is_accepted_even_when_it_fails_its_verifiers() -> None:
    large = ScriptedBackend("large", lambda r: "no digits")
    result = await cascade(
        tier("small", ScriptedBackend("small", lambda r: "nope"), regex=r"\d"), tier("large", large, regex=r"\d")
    ).run(REQ)
    assert result.final.tier == "large" and result.final.accepted
    assert result.final.reason == "last tier: accepted without passing"


async def test_a_lower_tier_that_is_down_escalates() -> None:
    def down(r: GenerationRequest) -> str:
        raise UpstreamError("connection refused", retry_after=5)

    result = await cascade(
        tier("small", ScriptedBackend("small", down)), tier("large", ScriptedBackend("large", lambda r: "42"))
    ).run(REQ)
    assert result.final.tier == "large"
    assert result.attempts[0].error and "UpstreamError" in result.attempts[0].error


async def test_top_tier_down_is_an_error_by_default() -> None:
    def down(r: GenerationRequest) -> str:
        raise UpstreamError("retries spent", retry_after=7)

    c = cascade(
        tier("small", ScriptedBackend("small", lambda r: "?"), regex=r"\d"),
        tier("large", ScriptedBackend("large", down)),
    )
    with pytest.raises(UnavailableError) as info:
        await c.run(REQ)
    assert info.value.retry_after == 7


async def test_best_effort_returns_the_best_lower_answer_unverified() -> None:
    def down(r: GenerationRequest) -> str:
        raise UpstreamError("retries spent")

    c = cascade(
        tier("small", ScriptedBackend("small", lambda r: "maybe 41"), regex=r"^\d+$"),
        tier("large", ScriptedBackend("large", down)),
        on_unavailable="best_effort",
    )
    result = await c.run(REQ)
    assert result.final.tier == "small" and result.unverified
    assert result.generation.text == "maybe 41"


class CutStream(Backend):
    """Streams some text, then fails: an upstream that drops mid-answer."""

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        yield Delta("The answer")
        raise UpstreamError("stream cut")


async def test_no_fallback_is_spliced_after_streamed_text() -> None:
    c = cascade(
        tier("small", ScriptedBackend("small", lambda r: "maybe"), regex=r"^\d+$"),
        tier("large", CutStream("large")),
        on_unavailable="best_effort",
    )
    seen: list[object] = []
    with pytest.raises(UpstreamError):
        async for item in c.stream(REQ):
            seen.append(item)
    texts = [i.text for i in seen if isinstance(i, Delta)]
    assert texts == ["The answer"]  # the small tier's "maybe" never follows it
    assert [i.tier for i in seen if isinstance(i, Answering)] == ["large"]


async def test_held_back_text_is_released_only_after_acceptance() -> None:
    c = cascade(
        tier("small", ScriptedBackend("small", lambda r: "rejected text"), regex=r"^\d+$"),
        tier("large", ScriptedBackend("large", lambda r: "42")),
    )
    items = [i async for i in c.stream(REQ)]
    assert [type(i) for i in items] == [Answering, Delta, Final]
    assert items[1].text == "42"  # type: ignore[union-attr]


async def test_forcing_a_tier_and_unknown_models() -> None:
    small = ScriptedBackend("small", lambda r: "x")
    large = ScriptedBackend("large", lambda r: "42")
    c = cascade(tier("small", small, regex=r"\d"), tier("large", large))
    result = await c.run(REQ, model="small")
    assert [a.tier for a in result.attempts] == ["small"] and result.final.accepted
    assert large.requests == []
    with pytest.raises(UnknownModelError):
        await c.run(REQ, model="medium")


async def test_tier_caps_max_tokens_and_sets_a_deadline() -> None:
    small = ScriptedBackend("small", lambda r: "42")
    t = tier("small", small)
    t.settings = t.settings.model_copy(update={"max_tokens": 8, "timeout_s": 5})
    await cascade(t).run(REQ.with_(max_tokens=100))
    sent = small.requests[0]
    assert sent.max_tokens == 8 and sent.deadline is not None
