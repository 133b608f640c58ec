"""The policy sweep on a scripted run whose outcomes are known by construction (see helpers):
small is right on even questions and says 'sure' on 0, 4 (right) and 3 (wrong); large is right
on all but question 5. Small costs $0.001 per item (1 busy second at $3.6/hour); large costs
10 prompt tokens * $0.001 + 4 completion tokens * $0.002 = $0.018 per item."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from evals.store import RunStore
from evals.sweep import (
    CONFIG,
    CascadePolicy,
    ItemOutcome,
    OraclePolicy,
    ResultTable,
    Route,
    SingleTier,
    TierInfo,
    TierOutcome,
    evaluate,
    evaluate_cascades,
    load_table,
    random_escalation,
    summarize,
    sweep,
    threshold_grid,
)
from router.config import PriceSettings
from tests.support.evals import plan_for, run, scripted

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def table(tmp_path: Path):
    root = tmp_path / "runs" / "sums"
    await run(plan_for(tmp_path), root, scripted())
    return load_table(RunStore(root))


def test_table(table) -> None:
    assert [t.name for t in table.tiers] == ["small", "large"]
    assert len(table.items) == 8 and not table.incomplete
    assert table.verifiers == [CONFIG, "keyword", "length"]
    item = next(i for i in table.items if i.id == "q0")
    assert item.tiers[0].cost_usd == pytest.approx(0.001)
    assert item.tiers[1].cost_usd == pytest.approx(0.018)
    assert item.tiers[0].scores["keyword"] == 0.9 and item.tiers[0].scores[CONFIG] == 0.9


def test_single_tiers(table) -> None:
    small, large = evaluate(SingleTier(0), table), evaluate(SingleTier(1), table)
    assert (small.accuracy, small.cost_per_1k) == (pytest.approx(0.5), pytest.approx(1.0))
    assert (large.accuracy, large.cost_per_1k) == (pytest.approx(7 / 8), pytest.approx(18.0))
    assert large.savings == pytest.approx(0.0)


def test_cascade_at_a_threshold(table) -> None:
    r = evaluate(CascadePolicy("keyword", (0.5,)), table, 0.5)
    # accepted from small: q0, q4 (right), q3 (wrong); the other five go to large, all right but q5
    assert r.accuracy == pytest.approx(6 / 8)
    assert r.escalation_rate == pytest.approx(5 / 8)
    assert r.top_rate == pytest.approx(5 / 8)
    assert r.cost_per_1k == pytest.approx(1000 * (0.001 + 5 / 8 * 0.018))
    assert r.savings == pytest.approx(1 - 12.25 / 18)
    assert r.answered == pytest.approx((3 / 8, 5 / 8))


def test_the_configured_cascade_uses_the_tier_threshold(table) -> None:
    # the config's small tier has verifier keyword and threshold 0.5: the same routing
    r = evaluate(CascadePolicy(CONFIG, (table.tiers[0].threshold,)), table)
    assert r.accuracy == pytest.approx(6 / 8)


def test_oracle_and_random(table) -> None:
    o = evaluate(OraclePolicy(), table)
    assert o.accuracy == pytest.approx(7 / 8)
    assert o.cost_per_1k == pytest.approx(1000 * (4 * 0.001 + 4 * 0.018) / 8)
    r = random_escalation(table, 0.5)
    assert r.accuracy == pytest.approx(0.5 * 0.5 + 0.5 * 7 / 8)
    assert r.cost_per_1k == pytest.approx(1.0 + 0.5 * 18.0)
    assert (random_escalation(table, 0).accuracy, random_escalation(table, 1).accuracy) == (0.5, 7 / 8)


def test_sweep_runs_from_accept_all_to_escalate_all(table) -> None:
    curve = sweep(table, "keyword")
    assert curve[0].param == 0 and curve[0].escalation_rate == 0
    assert curve[-1].escalation_rate == 1 and curve[-1].accuracy == pytest.approx(7 / 8)
    s = summarize(table, "keyword")
    # thresholds 0 (x=0, acc .5), 0.2 (same), 0.9 (x=5/8, acc 6/8), inf (x=1, acc 7/8)
    # PGR: 0, 2/3 at 5/8, 1 at 1 -> area 5/8 * 1/3 + 3/8 * (2/3 + 1) / 2
    assert s.apgr == pytest.approx(5 / 8 * (1 / 3) + 3 / 8 * (5 / 6))
    assert s.cpt[0.5] == pytest.approx(0.5 / (2 / 3) * 5 / 8)
    # keyword ranks: right answers q0, q2, q4, q6 (0.9, 0.2, 0.9, 0.2); wrong q1, q3, q5, q7 (0.2, 0.9, 0.2, 0.2)
    # pairs right>wrong: 0.9 beats three 0.2s and ties one 0.9, twice; 0.2 ties three and loses one, twice
    assert s.auroc[0] == pytest.approx((2 * (3 + 0.5) + 2 * (1.5)) / 16)


def test_a_policy_is_any_route_function(table) -> None:
    """The seam for learned routers: a pre-router that sends odd questions straight to large."""

    class PreRouter:
        name = "prerouter"

        def route(self, item) -> Route:
            t = 1 if int(item.id[1:]) % 2 else 0
            return Route(t, (t,))

    r = evaluate(PreRouter(), table)
    assert r.accuracy == pytest.approx(7 / 8)
    assert r.cost_per_1k == pytest.approx(1000 * (4 * 0.001 + 4 * 0.018) / 8)


async def test_repricing_needs_no_rerun(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "sums"
    await run(plan_for(tmp_path), root, scripted())
    cheap = PriceSettings(usd_per_1m_input_tokens=0.0, usd_per_1m_output_tokens=1000.0)
    t = load_table(RunStore(root), prices={"large": cheap})
    assert evaluate(SingleTier(1), t).cost_per_1k == pytest.approx(1000 * 4 * 0.001)


def test_an_estimator_joins_the_sweep_as_a_score_column(table) -> None:
    """A learned verifier, fit elsewhere, is one more column: here one that knows the truth."""
    perfect = {it.id: [float(t.correct) for t in it.tiers] for it in table.items}
    t = table.with_scores("perfect", perfect)
    assert "perfect" in t.verifiers and "perfect" not in table.verifiers
    r = evaluate(CascadePolicy("perfect", (0.5,)), t)
    assert r.accuracy == pytest.approx(7 / 8)  # as good as the oracle, paying small on every item
    assert summarize(t, "perfect").auroc[0] == pytest.approx(1.0)
    assert table.items[0].tiers[0].text.startswith(("sure", "the answer"))


def _three_tiers(n: int, seed: int) -> ResultTable:
    """Three tiers with abstentions (None), ties, verifier costs and the configured check on some
    last-tier answers: every way a cascade route can differ."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        tiers = []
        for t in range(3):
            score = None if rng.random() < 0.15 else rng.choice([0.0, 0.5, 1.0, rng.random()])
            scores = {"v": score} | ({CONFIG: rng.random()} if t < 2 or rng.random() < 0.5 else {})
            tiers.append(
                TierOutcome(
                    correct=rng.random() < 0.4 + 0.25 * t,
                    cost_usd=rng.random() * 10**-t,
                    latency_s=rng.random() * (t + 1),
                    busy_s=1.0,
                    prompt_tokens=1,
                    completion_tokens=1,
                    scores=scores,
                    verify_cost_usd={"v": rng.random() * 1e-4, CONFIG: rng.random() * 1e-5},
                    verify_s={"v": rng.random() / 10},
                )
            )
        items.append(ItemOutcome(f"i/{i}", "", tuple(tiers)))
    price = PriceSettings(usd_per_hour=1.0)
    infos = [TierInfo(name, name, price, "", 0.5, True) for name in ("a", "b", "c")]
    return ResultTable(run="syn", suite="syn", source="", tiers=infos, items=items, verifiers=[CONFIG, "v"])


def test_evaluate_cascades_gives_evaluates_results_to_the_bit() -> None:
    """The array pass that sweeps and calibrations use is `evaluate` of a `CascadePolicy`, equal
    to the last bit (committed reports are compared byte for byte), on three tiers with
    abstentions, on one tier, and on a committed run."""
    table = _three_tiers(97, seed=4)
    grid = [0.0, 0.25, 0.5, 0.7, 1.0, math.inf]
    for verifier in ("v", CONFIG):
        settings = [(ths, ths[0]) for ths in itertools.product(grid, grid)]
        fast = evaluate_cascades(table, verifier, settings)
        assert fast == [evaluate(CascadePolicy(verifier, ths), table, p) for ths, p in settings]
        assert repr(fast) == repr([evaluate(CascadePolicy(verifier, ths), table, p) for ths, p in settings])
    one = ResultTable(
        run="one",
        suite="one",
        source="",
        tiers=table.tiers[:1],
        items=[ItemOutcome(it.id, "", it.tiers[:1]) for it in table.items],
        verifiers=["v"],
    )
    assert evaluate_cascades(one, "v", [((0.5,), 0.5)]) == [evaluate(CascadePolicy("v", (0.5,)), one, 0.5)]
    committed = load_table(RunStore(REPO / "evals/results/gsm8k"))
    verifier = committed.verifiers[1]
    assert sweep(committed, verifier) == [
        evaluate(CascadePolicy(verifier, (th,)), committed, th) for th in threshold_grid(committed, verifier)
    ]
    with pytest.raises(ValueError, match="no complete items"):
        evaluate_cascades(ResultTable("e", "e", "", table.tiers, [], ["v"]), "v", [((0.5, 0.5), 0.5)])
