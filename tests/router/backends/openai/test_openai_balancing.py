"""The routing strategies, asked directly with a seeded random source: what each picks, and that
weighted random follows its weights."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import pytest

from router.backends.openai.balancing import STRATEGIES, LeastOutstanding, OrderedFailover, WeightedRandom


@dataclass
class Dep:
    weight: float = 1.0
    outstanding: int = 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_random_follows_its_weights_within_a_few_percent(seed: int) -> None:
    deps = [Dep(weight=1), Dep(weight=3), Dep(weight=6)]
    rng = random.Random(seed)
    picks = Counter(WeightedRandom().pick(deps, rng) for _ in range(1000))
    shares = [picks[i] / 1000 for i in range(3)]
    assert shares == pytest.approx([0.1, 0.3, 0.6], abs=0.04)


def test_weighted_random_ignores_load() -> None:
    deps, rng = [Dep(outstanding=50), Dep(outstanding=0)], random.Random(7)
    picks = Counter(WeightedRandom().pick(deps, rng) for _ in range(1000))
    assert abs(picks[0] - picks[1]) < 100


def test_least_outstanding_takes_the_least_loaded_and_splits_ties_by_weight() -> None:
    rng = random.Random(3)
    assert LeastOutstanding().pick([Dep(outstanding=3), Dep(outstanding=1), Dep(outstanding=2)], rng) == 1
    tied = [Dep(weight=1), Dep(weight=4, outstanding=1), Dep(weight=3)]
    picks = Counter(LeastOutstanding().pick(tied, rng) for _ in range(1000))
    assert picks[1] == 0  # busier, whatever its weight
    assert picks[2] / 1000 == pytest.approx(0.75, abs=0.05)


def test_ordered_failover_takes_the_first_it_is_offered() -> None:
    assert OrderedFailover().pick([Dep(outstanding=9), Dep()], random.Random(0)) == 0


def test_every_strategy_the_config_names_is_registered() -> None:
    from typing import get_args

    from router.config import OpenAIBackendSettings

    named = get_args(OpenAIBackendSettings.model_fields["strategy"].annotation)
    assert set(named) == set(STRATEGIES)
