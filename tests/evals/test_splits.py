"""The split study and the price sensitivity (`evals.splits`), held to a hand computation on eight
items, and to the calibration the rest of the project uses: on the fixed split the study chooses
what `evals.calibrate.calibrate` chooses, setting by setting the many-settings weighing is
`evaluate` item by item, and a held-out label never moves a split's choice."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from evals import splits
from evals.calibrate import Target, calibrate, candidate_values, pick_setting, setting_grid
from evals.sweep import (
    CONFIG,
    CascadePolicy,
    ItemOutcome,
    ResultTable,
    TierInfo,
    TierOutcome,
    cascade_arrays,
    evaluate,
    weigh_settings,
)
from router.config import PriceSettings

REPO = Path(__file__).resolve().parents[2]


def outcome(correct: bool, score: float | None, cost: float) -> TierOutcome:
    return TierOutcome(
        correct=correct,
        cost_usd=cost,
        latency_s=1.0,
        busy_s=1.0,
        prompt_tokens=1,
        completion_tokens=1,
        scores={"v": score, "never": 0.0},
        verify_cost_usd={},
        verify_s={},
    )


# id: (small's score, small right, top right). Small costs 1 (local), the top tier 10 (hosted).
EIGHT = {
    "a": (0.9, True, True),
    "b": (0.8, True, True),
    "c": (0.6, False, True),
    "d": (0.3, False, True),
    "e": (0.95, True, True),
    "f": (0.7, True, False),
    "g": (0.5, False, True),
    "h": (0.2, False, True),
}


def eight(small_cost: float = 1.0) -> ResultTable:
    items = [
        ItemOutcome(i, "", (outcome(r0, s, small_cost), outcome(r1, None, 10.0))) for i, (s, r0, r1) in EIGHT.items()
    ]
    price = PriceSettings(usd_per_hour=1.0)
    tiers = [TierInfo("small", "m", price, "", 0.5, True), TierInfo("top", "M", price, "", 0.5, False)]
    return ResultTable(run="eight", suite="eight", source="", tiers=tiers, items=items, verifiers=["v", "never"])


# split 1 calibrates on a-d and holds out e-h; split 2 the other way round
MASKS = np.array([[True] * 4 + [False] * 4, [False] * 4 + [True] * 4])


def share(s: float) -> splits.TargetRule:
    return lambda first, top: Target("min-accuracy", s * top)


def test_the_split_study_is_the_hand_computation() -> None:
    """Split 1: GPT-4-like top right on all of a-d, so 95% asks 4 of 4; thresholds 0.3 and 0.6 let
    c through, 0.8 is the cheapest that does not (a, b small at 1; c, d both tiers at 11: 24 for four
    items). Held out at 0.8: e small (right), f, g, h escalate (f's top answer is wrong): 34 against
    the top tier's 40, 15% saved, at 3/4 = the top tier's own 3/4. Split 2: the top tier is right on
    3 of e-h, 95% of that is 0.7125, and 0.5 (e, f, g small, g wrong; h up) reaches 3/4 at 14, the
    cheapest. Held out on a-d: a, b, c small (c wrong), d up: 14 against 40, 65% saved at 3/4
    against the top tier's 4/4: under the target."""
    table, free = eight(), eight(small_cost=0.0)
    cascade = next(c for c in splits.priced_cascades(table, free) if c.verifier == "v")
    [o] = splits.calibrate_splits(cascade, MASKS, [share(0.95)])
    assert o.thresholds == ((0.8,), (0.5,))
    assert o.met.tolist() == [True, True]
    assert o.calibration_cost.tolist() == pytest.approx([1000 * 24 / 4, 1000 * 14 / 4])
    assert o.accuracy.tolist() == [0.75, 0.75] and o.top_accuracy.tolist() == [0.75, 1.0]
    assert o.cost.tolist() == pytest.approx([1000 * 34 / 4, 1000 * 14 / 4])
    assert o.top_cost.tolist() == pytest.approx([10_000, 10_000])
    assert o.saved.tolist() == pytest.approx([0.15, 0.65])
    assert o.ratio.tolist() == pytest.approx([1.0, 0.75])
    assert o.held_out_met.tolist() == [True, False] and o.missed_share == 0.5
    assert o.answered.tolist() == [[0.25, 0.75], [0.75, 0.25]]
    spread = o.saved_spread()
    assert spread.median == pytest.approx(0.40)  # the median of two is their mean
    assert (spread.low, spread.high) == pytest.approx((0.15 + 0.025 * 0.5, 0.65 - 0.025 * 0.5))


def test_the_price_sensitivity_is_the_hand_computation() -> None:
    """Every item runs the small tier, 4 local units per held-out half. At m times the local price
    split 1 costs 34 + 4(m - 1) against 40 (break-even m = 2.5) and split 2 14 + 4(m - 1) (m = 7.5);
    the median of the two savings is 1 - (48 + 8(m - 1)) / 80, zero at m = 5."""
    table, free = eight(), eight(small_cost=0.0)
    cascade = next(c for c in splits.priced_cascades(table, free) if c.verifier == "v")
    [o] = splits.calibrate_splits(cascade, MASKS, [share(0.95)])
    assert o.cost_local.tolist() == pytest.approx([1000.0, 1000.0]) and o.top_cost_local.tolist() == [0.0, 0.0]
    for m in (1.0, 2.6, 5.0, 10.0):
        assert o.saved_at(m).tolist() == pytest.approx([1 - (34 + 4 * (m - 1)) / 40, 1 - (14 + 4 * (m - 1)) / 40])
    assert o.saved_at(2.6)[0] == pytest.approx(-0.01) and o.saved_at(5.0)[1] == pytest.approx(0.25)
    assert o.break_even() == pytest.approx(5.0)
    # a policy that saves nothing at today's price has no break-even
    losing = replace(o, cost=o.top_cost * 1.1)
    assert losing.break_even() is None


def test_deploying_picks_the_cheapest_that_met_the_target_and_falls_back_to_the_top_tier() -> None:
    table, free = eight(), eight(small_cost=0.0)
    cascades = splits.priced_cascades(table, free)
    [(each, deployed)] = splits.study(cascades, MASKS, [share(0.95)], splits.cheapest_met)
    never = next(o for o in each if o.label == "never")
    # its score 0 meets the target only by escalating everything (threshold 1): 11 an item, dearer than v
    assert never.met.all() and never.thresholds == ((1.0,), (1.0,))
    assert never.calibration_cost.tolist() == pytest.approx([11_000, 11_000])
    assert deployed.deployed == ("v", "v") and deployed.saved.tolist() == pytest.approx([0.15, 0.65])
    # a target nothing meets on the calibration half: the top tier alone, nothing saved, its accuracy
    [(_, none)] = splits.study(cascades, MASKS, [lambda f, t: Target("min-accuracy", 1.01)], splits.cheapest_met)
    assert none.deployed == ("", "") and none.fallback_share == 1.0
    assert none.saved.tolist() == [0.0, 0.0] and none.answered.tolist() == [[0.0, 1.0], [0.0, 1.0]]
    assert none.ratio.tolist() == [1.0, 1.0]


def test_every_half_weighs_the_same_with_or_without_the_shared_universe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weighing every setting any half offers once (one matrix product over all halves) and
    weighing each half's own candidates on that half alone choose the same."""
    table, free = _random_table(300, tiers=3, seed=4), None
    masks = splits.split_masks([it.id for it in table.items], 20)
    shared = [splits.calibrate_splits(c, masks, [share(0.9)])[0] for c in splits.priced_cascades(table, free)]
    monkeypatch.setattr(splits, "UNIVERSE", 0)
    alone = [splits.calibrate_splits(c, masks, [share(0.9)])[0] for c in splits.priced_cascades(table, free)]
    for a, b in zip(shared, alone, strict=True):
        assert a.thresholds == b.thresholds and a.saved.tolist() == b.saved.tolist()


def _random_table(n: int, tiers: int = 2, seed: int = 0) -> ResultTable:
    rng = random.Random(seed)
    items = []
    for i in range(n):
        outs = []
        for t in range(tiers):
            s = None if rng.random() < 0.1 else rng.choice([0.0, 1.0, round(rng.random(), 2), rng.random()])
            right = rng.random() < (0.4 + 0.2 * t + 0.3 * (s or 0.0))
            o = outcome(right, s, 0.001 * (1 + 5 * t) * (1 + rng.random()))
            outs.append(replace(o, scores={"v": s, CONFIG: s}, verify_cost_usd={"v": 0.0001 * rng.random()}))
        items.append(ItemOutcome(f"item/{i}", "", tuple(outs)))
    price = PriceSettings(usd_per_hour=1.0)
    infos = [TierInfo(f"t{t}", "m", price, "", 0.5, True) for t in range(tiers)]
    return ResultTable(run="r", suite="s", source="", tiers=infos, items=items, verifiers=[CONFIG, "v"])


def test_weighing_many_settings_at_once_is_evaluate_setting_by_setting() -> None:
    table = _random_table(250, tiers=3, seed=1)
    arrays = cascade_arrays(table, "v")
    settings = setting_grid([candidate_values(arrays.scores[:, t], 7) for t in range(2)])
    rng = np.random.default_rng(0)
    masks = rng.random((3, 250)) < 0.5
    weighed = weigh_settings(arrays, settings, masks)
    for k, mask in enumerate(masks):
        half = table.subset([it.id for it, m in zip(table.items, mask, strict=True) if m])
        for g, ths in enumerate(settings):
            r = evaluate(CascadePolicy("v", tuple(ths)), half)
            assert weighed[k].accuracy[g] == r.accuracy and weighed[k].escalation[g] == r.escalation_rate
            assert weighed[k].cost_per_1k[g] == pytest.approx(r.cost_per_1k, rel=1e-9)


def test_pick_setting_is_the_rule_calibrate_states() -> None:
    acc = np.array([0.5, 0.9, 0.9, 0.95, 0.97])
    cost = np.array([1.0, 3.0, 2.0, 2.0, 5.0])
    esc = np.array([0.0, 0.3, 0.2, 0.25, 0.6])
    settings = np.array([[0.0], [0.2], [0.5], [0.4], [0.9]])
    # cheapest meeting 0.9; between the two at cost 2 the more accurate
    assert pick_setting(acc, cost, esc, settings, Target("min-accuracy", 0.9), 0.9) == (3, True)
    # nothing meets 0.99: the most accurate
    assert pick_setting(acc, cost, esc, settings, Target("min-accuracy", 0.99), 0.99) == (4, False)
    # an exact tie goes to the lowest threshold
    tie = pick_setting(
        np.array([0.9, 0.9]), np.array([2.0, 2.0]), esc[:2], np.array([[0.7], [0.3]]), Target("min-accuracy", 0.8), 0.8
    )
    assert tie == (1, True)
    assert pick_setting(acc, cost, esc, settings, Target("max-escalation", 0.25), 0.25) == (3, True)


def test_on_the_fixed_split_the_study_chooses_what_calibrate_chooses() -> None:
    table = _random_table(400, tiers=2, seed=7)
    masks = splits.split_masks([it.id for it in table.items], 1, 0.5, first=0)  # seed 0: the fixed split
    for c in splits.priced_cascades(table):
        for s in (0.9, 0.97):
            [o] = splits.calibrate_splits(c, masks, [share(s)])
            top = sum(it.tiers[1].correct for it in table.items if it.id in _ids(table, masks[0]))
            target = Target("min-accuracy", s * top / int(masks[0].sum()))
            cal = calibrate(table, c.verifier, target)
            assert o.thresholds[0] == tuple(cal.thresholds.values())
            assert o.met[0] == cal.met
            assert o.accuracy[0] == cal.held_out.accuracy
            assert o.saved[0] == pytest.approx(cal.held_out.savings)


def _ids(table: ResultTable, mask: np.ndarray) -> set[str]:
    return {it.id for it, m in zip(table.items, mask, strict=True) if m}


def test_split_masks_are_the_projects_split_by_seed() -> None:
    from evals.calibrate import in_calibration

    ids = [f"x/{i}" for i in range(50)]
    masks = splits.split_masks(ids, 5, 0.5, first=3)
    assert masks.shape == (5, 50)
    for k in range(5):
        assert masks[k].tolist() == [in_calibration(i, 3 + k, 0.5) for i in ids]
    assert len({tuple(m) for m in masks}) == 5


def test_the_bootstrap_interval_holds_the_figure() -> None:
    rng = np.random.default_rng(3)
    cost, top = rng.random(300), 1 + rng.random(300)
    right, top_right = (rng.random(300) < 0.8).astype(float), (rng.random(300) < 0.9).astype(float)
    ratio, ratio_ci, saved, saved_ci = splits.bootstrap(cost, right, top, top_right)
    assert saved == pytest.approx(1 - cost.sum() / top.sum()) and ratio == pytest.approx(
        right.mean() / top_right.mean()
    )
    assert saved_ci.low < saved < saved_ci.high and ratio_ci.low < ratio < ratio_ci.high
    assert splits.bootstrap(cost, right, top, top_right) == (ratio, ratio_ci, saved, saved_ci)


def test_a_spread_is_the_median_and_the_95_percent_range() -> None:
    s = splits.Spread.of(np.arange(201, dtype=float))
    assert (s.median, s.low, s.high) == (100.0, 5.0, 195.0)
    assert not math.isnan(s.median)
