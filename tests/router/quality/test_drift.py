"""Drift alarms: a tier that starts answering wrong at the same confidence is caught within a
stated number of requests, and stable tiers raise (almost) none over long runs. Fixed seeds."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from router.quality.drift import BernoulliCusum, DriftMonitor, H, shifted
from tests.support.shadow import serve, service, settings

pytestmark = pytest.mark.slow  # loads a model, starts processes or spends seconds of CPU

CHANGE_AT = 600  # requests the small tier serves at its usual 10% error rate
DETECT_WITHIN = 150  # requests after it turns 70% wrong (at rate 0.5: about 75 shadow pairs)


@pytest.mark.parametrize("seed", range(5))
async def test_a_tier_that_degrades_raises_the_agreement_alarm_within_the_bound(tmp_path: Path, seed: int) -> None:
    rng = random.Random(1000 + seed)
    degraded = False
    svc = service(settings(tmp_path, rate=0.5), lambda i: rng.random() >= (0.7 if degraded else 0.1), seed)
    await svc.start()
    try:
        await serve(svc, CHANGE_AT)
        assert svc.drift.alarms == []  # learned its baseline from the first 200 pairs, stayed quiet
        pairs_before = svc.tallies[("small", 0.5)].pairs
        degraded = True
        caught: list[int] = []
        await serve(svc, DETECT_WITHIN, start=CHANGE_AT, each=lambda i: caught.append(i) if svc.drift.alarms else None)
        assert caught, "no alarm within the bound"
        alarm = svc.drift.alarms[0]
        assert (alarm.tier, alarm.task, alarm.signal, alarm.direction) == ("small", "maths", "agreement", "down")
        assert caught[0] - CHANGE_AT < DETECT_WITHIN and alarm.n > pairs_before
        assert alarm.recent < 0.6 < alarm.baseline
        # the same confidence: the acceptance rate did not move, and its detectors said nothing
        assert all(a.signal == "agreement" for a in svc.drift.alarms)
        assert svc.metrics.shadow.alarm.labels("small", "maths", "agreement", "down")._value.get() == 1.0
    finally:
        await svc.close()


async def test_a_stable_tier_raises_no_alarm_over_a_long_run(tmp_path: Path) -> None:
    rng = random.Random(7)
    svc = service(settings(tmp_path, rate=1.0), lambda i: rng.random() >= 0.1, seed=7)
    await svc.start()
    try:
        await serve(svc, 4000)
        assert svc.tallies[("small", 0.5)].pairs == 4000
        assert svc.drift.alarms == []
    finally:
        await svc.close()


def test_stable_streams_have_bounded_false_alarms() -> None:
    """20 seeds x 10,000 observations of each signal (agreement: one detector; acceptance: two),
    at a weak (0.6) and a good (0.9) baseline: 1.2 million detector-observations. Simulated,
    the learned-baseline guard gives about 6 alarms at 0.6 and none at 0.9; the bound allows 12,
    i.e. at most one false alarm per 100,000 detector-observations."""
    alarms = 0
    for p0 in (0.6, 0.9):
        for seed in range(20):
            rng = random.Random(seed)
            m = DriftMonitor(lambda *a: None, lambda tier: 200)
            for i in range(10_000):
                m.observe("small", "maths", "agreement", rng.random() < p0, float(i))
                m.observe("small", "maths", "acceptance", rng.random() < p0, float(i))
            alarms += len(m.alarms)
    assert alarms <= 12


def test_acceptance_is_watched_both_ways_and_a_stated_baseline_needs_no_warmup() -> None:
    for direction, after in (("down", 0.5), ("up", 0.99)):
        rng = random.Random(3)
        m = DriftMonitor(lambda tier, signal, task: 0.85, lambda tier: 200)
        for i in range(400):
            m.observe("small", "code", "acceptance", rng.random() < (0.85 if i < 100 else after), float(i))
        assert m.alarms, direction
        assert m.alarms[0].direction == direction and m.alarms[0].baseline == pytest.approx(0.85)
        assert 100 < m.alarms[0].n < 100 + (60 if direction == "down" else 200)


def test_an_alarm_stays_raised_until_the_rate_comes_back() -> None:
    c = BernoulliCusum(0.9, shifted(0.9, "down"))
    raised = [c.update(False) for _ in range(20)]
    assert raised.count(True) == 1 and c.alarmed and c.s >= H
    while c.s > 0:
        assert not c.update(True)
    assert not c.alarmed
