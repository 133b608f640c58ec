"""The measures (`evals.measures`) against small cases computed by hand."""

from __future__ import annotations

import math

import pytest

from evals import measures


def test_cost_per_1k_and_savings() -> None:
    assert measures.cost_per_1k([0.001, 0.003]) == pytest.approx(2.0)
    assert measures.savings(2.0, 8.0) == pytest.approx(0.75)
    assert measures.savings(1.0, 0.0) is None


def test_percentiles() -> None:
    assert measures.percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert measures.percentile([0, 10], 95) == pytest.approx(9.5)
    assert measures.percentile([], 50) is None


def test_pgr() -> None:
    assert measures.pgr(0.6, 0.4, 0.8) == pytest.approx(0.5)
    assert measures.pgr(0.5, 0.5, 0.5) is None


def test_apgr_of_the_random_line_is_one_half() -> None:
    assert measures.apgr([(0, 0.4), (0.5, 0.6), (1, 0.8)], 0.4, 0.8) == pytest.approx(0.5)


def test_apgr_by_hand() -> None:
    # PGR: 0 at x=0, 1 at x=0.5, 1 at x=1 -> area 0.25 + 0.5 = 0.75
    assert measures.apgr([(1, 0.8), (0, 0.4), (0.5, 0.8)], 0.4, 0.8) == pytest.approx(0.75)
    # over a partial x range it is normalised by the range (RouteLLM's definition)
    assert measures.apgr([(0, 0.4), (0.5, 0.8)], 0.4, 0.8) == pytest.approx(0.5)
    # above the strong model: PGR above 1 counts
    assert measures.apgr([(0, 0.4), (0.5, 1.0), (1, 0.8)], 0.4, 0.8) == pytest.approx(
        (0.5 * 1.5 / 2) + 0.5 * (1.5 + 1) / 2
    )


def test_apgr_full_completes_the_curve_to_the_whole_range() -> None:
    # a sweep from 0 to 1 is unchanged
    assert measures.apgr_full([(0, 0.4), (0.5, 0.8), (1, 0.8)], 0.4, 0.8) == pytest.approx(0.75)
    # a verifier that abstains on 60% of answers: its sweep starts at x = 0.6, where it recovers the
    # whole gap. Over its own range that reads 1.0; over 0..1 the line from (0, weak) to it counts
    covered = [(0.6, 0.8), (1, 0.8)]
    assert measures.apgr(covered, 0.4, 0.8) == pytest.approx(1.0)
    assert measures.apgr_full(covered, 0.4, 0.8) == pytest.approx(0.6 / 2 + 0.4)
    # a sweep that never reaches x = 1 is completed there too, at the strong model's accuracy
    assert measures.apgr_full([(0, 0.4), (0.5, 0.4)], 0.4, 0.8) == pytest.approx(0.25)
    assert measures.apgr_full([], 0.4, 0.8) is None
    assert measures.apgr_full([(0.5, 0.6)], 0.5, 0.5) is None


def test_cpt_interpolates_along_the_curve() -> None:
    pts = [(0, 0.4), (0.2, 0.5), (0.6, 0.8), (1, 0.8)]  # PGR 0, .25, 1, 1
    assert measures.cpt(pts, 0.4, 0.8, 0.5) == pytest.approx(0.2 + (0.5 - 0.25) / 0.75 * 0.4)
    assert measures.cpt(pts, 0.4, 0.8, 0.25) == pytest.approx(0.2)
    assert measures.cpt(pts, 0.4, 0.8, 0.95) == pytest.approx(0.2 + (0.95 - 0.25) / 0.75 * 0.4)
    assert measures.cpt([(0, 0.4), (1, 0.6)], 0.4, 0.8, 0.8) is None  # never reached
    assert measures.cpt([(0, 0.9), (1, 0.8)], 0.4, 0.8, 0.8) == 0.0  # reached with no strong calls


def test_nondecreasing_hull() -> None:
    hull = measures.nondecreasing_hull([(1, 0.4), (2, 0.5), (3, 0.9), (4, 0.7), (2.5, 0.3)])
    # (2, 0.5) lies under the chord from (1, 0.4) to (3, 0.9); after the best point the hull is flat
    assert hull.tolist() == [[1.0, 0.4], [3.0, 0.9]]


def test_aiq_by_hand() -> None:
    # the straight line between the single models: mean of 0.4 and 0.8
    assert measures.aiq([(1, 0.4), (2, 0.8)], 1, 2) == pytest.approx(0.6)
    # reaching 0.8 at half the cost range, flat after: 0.5 * 0.6 + 0.5 * 0.8
    assert measures.aiq([(1, 0.4), (1.5, 0.8), (3, 0.8)], 1, 2) == pytest.approx(0.7)
    # nothing is reachable below the router's cheapest point
    assert measures.aiq([(1.5, 0.6), (2, 0.8)], 1, 2) == pytest.approx(0.35)
    # a dominated point changes nothing
    assert measures.aiq([(1, 0.4), (2, 0.8), (1.5, 0.5)], 1, 2) == pytest.approx(0.6)
    assert measures.aiq([(1, 0.4)], 1, 1) is None


def test_auroc_by_hand() -> None:
    # positives 0.9, 0.4; negatives 0.5, 0.1 -> pairs ranked right: (0.9>0.5), (0.9>0.1), (0.4>0.1) = 3/4
    assert measures.auroc([1, 1, 0, 0], [0.9, 0.4, 0.5, 0.1]) == pytest.approx(0.75)
    assert measures.auroc([1, 0], [0.5, 0.5]) == pytest.approx(0.5)  # ties count half
    assert measures.auroc([1, 1], [0.2, 0.3]) is None


def test_ece_and_brier_by_hand() -> None:
    # bins: 0.9 -> |1 - .9|, 0.1 -> |0 - .1|, 0.8 -> |1 - .8|, 0.3 -> |0 - .3|; each a quarter
    assert measures.ece([1, 0, 1, 0], [0.9, 0.1, 0.8, 0.3]) == pytest.approx((0.1 + 0.1 + 0.2 + 0.3) / 4)
    # two items in one bin: mean score .65, accuracy .5
    assert measures.ece([1, 0], [0.61, 0.69]) == pytest.approx(0.15)
    assert measures.ece([1], [1.0]) == pytest.approx(0.0)  # a score of 1 lands in the last bin
    assert measures.brier([1, 0], [0.75, 0.5]) == pytest.approx((0.0625 + 0.25) / 2)


def test_reliability_points() -> None:
    mean, frac = measures.reliability([1, 0, 1, 1], [0.92, 0.95, 0.15, 0.12])
    assert mean == pytest.approx([0.135, 0.935])
    assert frac == pytest.approx([1.0, 0.5])
    assert not any(math.isnan(x) for x in mean + frac)
