"""Live accuracy estimates: a scripted tier with a known error rate, estimated from its shadow
pairs, falls inside its 95% Wilson interval at (about) the nominal coverage."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from router.quality.live import wilson
from tests.support.shadow import serve, service, settings

RUNS = 200
REQUESTS = 160  # per run; shadow rate 0.5, so about 80 pairs each
ERROR_RATE = 0.15
MIN_COVERAGE = 0.90  # for a nominal 95% interval: what 200 runs must show at least


@pytest.mark.slow
async def test_the_live_estimate_covers_a_known_accuracy_at_the_stated_rate(tmp_path: Path) -> None:
    s = settings(tmp_path, rate=0.5)
    covered, pairs = 0, []
    for seed in range(RUNS):
        rng = random.Random(seed)  # the tier's errors; the sampler draws from its own seed
        svc = service(s, lambda i, rng=rng: rng.random() >= ERROR_RATE, 10_000 + seed)
        await svc.start()
        try:
            await serve(svc, REQUESTS)
        finally:
            await svc.close()
        tally = svc.tallies[("small", 0.5)]
        assert tally.tried == tally.accepted == REQUESTS  # wrong answers accepted at the same confidence
        low, high = tally.interval or (0.0, 1.0)
        covered += low <= 1 - ERROR_RATE <= high
        pairs.append(tally.pairs)
    assert covered / RUNS >= MIN_COVERAGE, covered
    assert 60 < sum(pairs) / RUNS < 100  # the sampling rate held


@pytest.mark.parametrize(("k", "n"), [(0, 10), (10, 10), (5, 10), (85, 100), (1, 1000)])
def test_wilson_stays_in_the_unit_interval_and_holds_the_estimate(k: int, n: int) -> None:
    low, high = wilson(k, n)
    assert 0.0 <= low <= k / n <= high <= 1.0
    assert wilson(0, 0) == (0.0, 1.0)


def test_wilson_matches_a_textbook_value() -> None:
    # 81 of 100 at 95%: (0.7222, 0.8749), as computed by statsmodels' proportion_confint(method='wilson')
    low, high = wilson(81, 100)
    assert (round(low, 4), round(high, 4)) == (0.7222, 0.8749)
