"""Verifying is priced at the tier that did the work: a small tier that runs `self_consistency` on
itself and `judge` on the large tier is charged the small tier's hourly price for the samples and
the large tier's token price for the judge, each on its own (they were once summed and priced at
one tier's price)."""

from __future__ import annotations

import pytest

from router.cascade import Cascade, Tier
from router.config import CascadeSettings, PriceSettings, TierSettings
from router.generation import GenerationRequest
from router.plugins import VerifierRegistry
from router.verification import VerifierContext, VerifierCost, VerifierSet, WeightedVerifier
from tests.support.scripted import ScriptedBackend

SMALL = PriceSettings(usd_per_hour=3.6)  # $0.001 per busy second
LARGE = PriceSettings(usd_per_1m_input_tokens=1000.0, usd_per_1m_output_tokens=2000.0)  # $0.001 / $0.002 a token


def _tier(
    name: str, backend: ScriptedBackend, price: PriceSettings, verifiers: list[WeightedVerifier], threshold: float
) -> Tier:
    settings = TierSettings(name=name, backend="scripted", price=price, threshold=threshold)
    return Tier(settings, backend, VerifierSet(verifiers))


async def test_each_verifier_is_priced_at_its_own_tier() -> None:
    small = ScriptedBackend("small", lambda r: "The answer is 42.", prompt_tokens=10, completion_tokens=5, busy_s=0.25)
    large = ScriptedBackend(
        "large",
        lambda r: "Looks right.\nSCORE: 9" if r.messages else "The answer is 42.",
        prompt_tokens=30,
        completion_tokens=6,
        busy_s=None,
    )
    backends = {"small": small, "large": large}
    reg = VerifierRegistry.from_entry_points()
    ctx = VerifierContext(tier="small", backend=small, backends=backends)
    members = [
        WeightedVerifier(reg.create("self_consistency", {"k": 2}, ctx), 1.0),
        WeightedVerifier(reg.create("judge", {"tier": "large"}, ctx), 1.0),
    ]
    cascade = Cascade(
        [_tier("small", small, SMALL, members, threshold=0.5), _tier("large", large, LARGE, [], threshold=0.5)],
        CascadeSettings(),
    )
    result = await cascade.run(GenerationRequest(prompt="What is 6 * 7?", max_tokens=16))
    attempt = result.attempts[0]
    assert attempt.accepted and result.final.tier == "small"

    sc, judge = attempt.scores["self_consistency"].cost, attempt.scores["judge"].cost
    assert sc.parts() == (VerifierCost(20, 10, 0.5, "small"),)  # two samples of the small tier
    assert judge.parts() == (VerifierCost(30, 6, pytest.approx(judge.seconds), "large"),)
    expected = 0.5 * 0.001 + (30 * 0.001 + 6 * 0.002)
    assert attempt.verifier_cost_usd == pytest.approx(expected)
    assert result.cost_usd == pytest.approx(0.25 * 0.001 + expected)


def test_costs_of_different_tiers_add_up_apart() -> None:
    a = VerifierCost(1, 2, 0.5, "small") + VerifierCost(3, 4, 1.0, "large") + VerifierCost(5, 6, 0.25, "small")
    assert sorted(a.parts(), key=lambda p: str(p.tier)) == [
        VerifierCost(3, 4, 1.0, "large"),
        VerifierCost(6, 8, 0.75, "small"),
    ]
    assert a.tokens == 21
    assert (VerifierCost() + VerifierCost()).parts() == ()
