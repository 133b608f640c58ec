"""The decision rule's table form agrees with the rule itself: `answering_tiers` over many items is
`accepts` tier by tier, first acceptance wins, an abstention (None, NaN in the table) accepts
nothing, and an item no tier accepts is answered by the last."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from router import policy


def test_answering_tiers_is_accepts_item_by_item() -> None:
    rng = random.Random(0)
    for tiers in (1, 2, 3):
        rows = [
            [None if rng.random() < 0.2 else rng.choice([0.0, 0.5, 1.0, rng.random()]) for _ in range(tiers)]
            for _ in range(300)
        ]
        thresholds = [rng.choice([0.0, 0.5, 1.0, rng.random()]) for _ in range(tiers)]
        table = np.array([[math.nan if v is None else v for v in row] for row in rows], dtype=float)
        got = policy.answering_tiers(table, thresholds).tolist()
        want = [next((t for t, v in enumerate(row) if policy.accepts(v, thresholds[t])), tiers) for row in rows]
        assert got == want
    # one tier only: nothing to accept, the last answers
    assert policy.answering_tiers(np.zeros((4, 0)), []).tolist() == [0, 0, 0, 0]
    # a threshold short is refused, never broadcast over the other tiers
    with pytest.raises(ValueError, match="one per tier"):
        policy.answering_tiers(np.zeros((4, 2)), [0.5])


def test_many_settings_at_once_are_each_setting_alone() -> None:
    rng = random.Random(1)
    for tiers in (1, 2, 3):
        table = np.array(
            [[math.nan if rng.random() < 0.2 else rng.random() for _ in range(tiers)] for _ in range(200)], dtype=float
        )
        settings = np.array([[rng.choice([0.0, 1.0, rng.random()]) for _ in range(tiers)] for _ in range(17)])
        many = policy.answering_tiers(table, settings)
        assert many.shape == (17, 200)
        for g, ths in enumerate(settings):
            assert many[g].tolist() == policy.answering_tiers(table, list(ths)).tolist()
    assert policy.answering_tiers(np.zeros((4, 0)), np.zeros((3, 0))).tolist() == [[0] * 4] * 3
    with pytest.raises(ValueError, match="one per tier"):
        policy.answering_tiers(np.zeros((4, 2)), np.zeros((3, 1)))
