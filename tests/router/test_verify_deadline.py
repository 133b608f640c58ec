"""A verifier that hangs does not hold the request: past the tier's `verify_timeout_s` the answer
counts as unverified, is not accepted, and the request goes up to the next tier."""

from __future__ import annotations

import asyncio
import time

from router.cascade import Cascade, Tier
from router.config import CascadeSettings, PriceSettings, TierSettings
from router.generation import Generation, GenerationRequest
from router.verification import Score, VerifierSet, WeightedVerifier
from tests.support.scripted import ScriptedBackend

PRICE = PriceSettings(usd_per_hour=3.6)


class Hangs:
    name = "hangs"

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        await asyncio.sleep(3600)
        return Score(1.0, "never")


async def test_a_hanging_verifier_is_cut_off_and_the_request_escalates() -> None:
    small = ScriptedBackend("small", lambda r: "small answer")
    large = ScriptedBackend("large", lambda r: "large answer")
    tiers = [
        Tier(
            TierSettings(name="small", backend="scripted", price=PRICE, threshold=0.0, verify_timeout_s=0.2),
            small,
            VerifierSet([WeightedVerifier(Hangs(), 1.0)]),
        ),
        Tier(TierSettings(name="large", backend="scripted", price=PRICE), large, VerifierSet([])),
    ]
    started = time.monotonic()
    result = await Cascade(tiers, CascadeSettings()).run(GenerationRequest(prompt="Hi", max_tokens=8))
    assert time.monotonic() - started < 5
    first = result.attempts[0]
    assert not first.accepted and first.score is None
    assert "deadline" in first.reason
    assert result.final.tier == "large" and result.generation.text == "large answer"
