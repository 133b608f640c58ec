"""The pre-router: its policies in the sweep, its calibration, and the live cascade's skip path
(with scripted backends, in the style of tests/router/test_cascade.py)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from evals.calibrate import Target, calibrate_preroute, split
from evals.sweep import CONFIG, CascadePolicy, ItemOutcome, PreRoutePolicy, ResultTable, TierInfo, TierOutcome, evaluate
from router.api.extension import attempt_json, summary
from router.cascade import Cascade
from router.config import CascadeSettings, PriceSettings, TierSettings
from router.errors import ConfigError
from router.generation import GenerationRequest, Message
from router.learned.estimators import LinearModel, dump_estimator
from router.learned.features import FeatureSpec, gram_bucket
from router.ledger.entries import LedgerEntry
from router.models.wheels import sha256_file
from tests.support.scripted import ScriptedBackend, tier

PRICE = PriceSettings(usd_per_hour=3.6)


def outcome(correct: bool, v: float, pre: float, cost: float) -> TierOutcome:
    return TierOutcome(
        correct=correct,
        cost_usd=cost,
        latency_s=1.0,
        busy_s=1.0,
        prompt_tokens=1,
        completion_tokens=1,
        scores={"v": v, CONFIG: v, "pre": pre},
        verify_cost_usd={"v": 0.0001},
        verify_s={"v": 0.1},
    )


def table(items: list[ItemOutcome]) -> ResultTable:
    tiers = [TierInfo("small", "m", PRICE, "", 0.5, True), TierInfo("large", "M", PRICE, "", 0.5, True)]
    return ResultTable(run="t", suite="t", source="", tiers=tiers, items=items, verifiers=[CONFIG, "v"])


# ---- the policies ------------------------------------------------------------------------------------------


def test_preroute_policies_route_by_hand() -> None:
    # small: wrong, its verifier says 0.9, its pre-router 0.2; large: right
    item = ItemOutcome("a", "", (outcome(False, 0.9, 0.2, 0.001), outcome(True, 1.0, 1.0, 0.01)))
    only = PreRoutePolicy("pre", (0.5,))
    assert only.route(item).ran == (1,) and only.route(item).answered == 1  # skipped small: it never ran
    assert PreRoutePolicy("pre", (0.1,)).route(item).ran == (0,)  # not skipped, answers unverified
    then = PreRoutePolicy("pre", (0.1,), "v", (0.95,))
    r = then.route(item)
    # ran, verified, rejected, escalated; the last tier's configured verifiers run on its answer too
    assert (r.ran, r.verified, r.answered) == ((0, 1), ((0, "v"), (1, "config")), 1)
    assert PreRoutePolicy("pre", (0.1,), "v", (0.5,)).route(item).answered == 0
    assert only.name == "pre-route only" and then.name == "pre-route then verify[v]"
    # the last tier always answers, whatever its pre-router says
    low = ItemOutcome("b", "", (outcome(True, 0.9, 0.0, 0.001), outcome(True, 1.0, 0.0, 0.01)))
    assert PreRoutePolicy("pre", (0.5,)).route(low).answered == 1


def test_a_skipped_tier_costs_nothing() -> None:
    items = [ItemOutcome("a", "", (outcome(False, 0.9, 0.2, 0.001), outcome(True, 1.0, 1.0, 0.01)))]
    skip = evaluate(PreRoutePolicy("pre", (0.5,), "v", (0.5,)), table(items))
    verify = evaluate(CascadePolicy("v", (0.5,)), table(items))
    assert skip.cost_per_1k == pytest.approx(10.0) and skip.accuracy == 1.0
    assert verify.cost_per_1k == pytest.approx(1000 * 0.0011) and verify.accuracy == 0.0


def test_skip_threshold_zero_is_verify_only() -> None:
    t = synthetic()
    for th in (0.0, 0.3, 0.7):
        a = evaluate(PreRoutePolicy("pre", (0.0,), "v", (th,)), t)
        b = evaluate(CascadePolicy("v", (th,)), t)
        assert (a.accuracy, a.cost_per_1k, a.escalation_rate) == (b.accuracy, b.cost_per_1k, b.escalation_rate)


# ---- calibration -------------------------------------------------------------------------------------------


def synthetic(n: int = 300, seed: int = 2, small_cost: float = 0.01) -> ResultTable:
    """Small is right with probability `pre` (what the prompt tells), and its verifier sees it
    only through noise; large is right 90% of the time. Skipping small pays only when it is
    dear enough against large: a skipped answer it would have been right with sends the item
    to large."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        pre = rng.random()
        right = rng.random() < pre
        v = min(1.0, max(0.0, (0.7 if right else 0.3) + rng.gauss(0, 0.25)))
        items.append(
            ItemOutcome(f"i{i}", "", (outcome(right, v, pre, small_cost), outcome(rng.random() < 0.9, 1.0, 1.0, 0.02)))
        )
    return table(items)


@pytest.mark.slow
def test_preroute_then_verify_stays_within_the_drop_on_calibration_items() -> None:
    c = calibrate_preroute(synthetic(), "pre", Target.parse("min-pgr=0.8"), verifier="v", seed=0, max_drop=0.01)
    assert c.policy == "pre-route then verify[v]"
    assert c.calibration.accuracy >= c.reference_calibration.accuracy - 0.01 - 1e-12
    assert c.calibration.cost_per_1k <= c.reference_calibration.cost_per_1k
    assert c.skip_below["small"] > 0  # on this data skipping the hopeless prompts pays
    assert 0 < c.skip_rate < 1
    assert c.accuracy_drop == pytest.approx(c.reference_held_out.accuracy - c.held_out.accuracy)


def test_preroute_only_meets_its_target_on_calibration_items() -> None:
    c = calibrate_preroute(synthetic(), "pre", Target.parse("min-accuracy=0.8"), seed=0)
    assert c.policy == "pre-route only" and c.thresholds == {} and c.reference_held_out is None
    assert c.met and c.calibration.accuracy >= 0.8


@pytest.mark.slow
def test_held_out_items_never_influence_the_preroute_thresholds() -> None:
    t = synthetic()
    target = Target.parse("min-pgr=0.8")
    before = calibrate_preroute(t, "pre", target, verifier="v", seed=0)
    held = {i.id for i in split(t, seed=0)[1].items}
    rng = random.Random(5)
    scrambled = [
        ItemOutcome(
            it.id,
            "",
            tuple(
                replace(o, correct=rng.random() < 0.5, scores={"v": rng.random(), CONFIG: 0.0, "pre": rng.random()})
                for o in it.tiers
            ),
        )
        if it.id in held
        else it
        for it in t.items
    ]
    after = calibrate_preroute(replace(t, items=scrambled), "pre", target, verifier="v", seed=0)
    assert (after.skip_below, after.thresholds) == (before.skip_below, before.thresholds)
    assert after.calibration == before.calibration


# ---- the live cascade's skip path ----------------------------------------------------------------------------


def prerouter_file(tmp: Path, tiers: tuple[str, ...] = ("small",)) -> tuple[Path, str]:
    """P(right) high for prompts with the word 'easy', low otherwise."""
    spec = FeatureSpec(answer=False, n_buckets=32)
    n = len(spec.names)
    coef = np.zeros(n)
    coef[len(spec.dense_names) + gram_bucket("easy", 32)] = 20.0
    m = LinearModel([0.0] * n, [1.0] * n, coef.tolist(), -5.0, 1.0, 0.0, {"kind": "test"})
    path = tmp / "prerouter.json"
    path.write_bytes(dump_estimator("prerouter", spec, {t: m for t in tiers}, {}))
    return path, sha256_file(path)


def ask(text: str) -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", text),), max_tokens=16)


def pre_routed(tmp: Path) -> tuple[Cascade, ScriptedBackend, ScriptedBackend, str]:
    """small (pre-routed at 0.5, verified by a digit check) then large; both answer "42"."""
    path, sha = prerouter_file(tmp)
    small, large = ScriptedBackend("small", lambda r: "42"), ScriptedBackend("large", lambda r: "42")
    cascade = Cascade(
        [
            tier("small", small, prerouter={"artifact": path, "sha256": sha, "threshold": 0.5}, regex=r"\d"),
            tier("large", large),
        ],
        CascadeSettings(),
    )
    return cascade, small, large, sha


async def test_a_tier_predicted_to_fail_is_skipped(tmp_path: Path) -> None:
    cascade, small, large, sha = pre_routed(tmp_path)
    result = await cascade.run(ask("A hard one: what is 6 * 7?"))
    assert small.requests == [] and len(large.requests) == 1
    assert result.final.tier == "large" and result.escalated
    first = result.attempts[0]
    assert first.skipped and not first.accepted and first.generation is None and first.cost_usd == 0.0
    assert first.reason.startswith("skipped by pre-router p=0.007 < 0.5 (prerouter@")
    d = attempt_json(first)
    assert d["skipped"] is True
    assert d["prerouter"] == {
        "version": f"prerouter@{sha[:12]}",
        "probability": pytest.approx(0.006693, abs=1e-6),
        "threshold": 0.5,
    }
    assert result.cost_usd == pytest.approx(result.attempts[1].cost_usd)
    json.dumps(summary(result))  # the tierroute object stays JSON
    entry = LedgerEntry.from_result("r1", "k", result, latency_s=0.1)
    assert [a.decision for a in entry.attempts] == ["skipped", "accepted"]  # passed over, not rejected


async def test_a_tier_predicted_to_succeed_runs_and_says_so(tmp_path: Path) -> None:
    cascade, _, large, _ = pre_routed(tmp_path)
    result = await cascade.run(ask("An easy one: what is 6 * 7?"))
    assert result.final.tier == "small" and not result.escalated and large.requests == []
    d = attempt_json(result.attempts[0])
    assert d["skipped"] is False and d["prerouter"]["probability"] > 0.5


async def test_the_last_tier_is_never_skipped(tmp_path: Path) -> None:
    path, sha = prerouter_file(tmp_path, ("small", "large"))
    pre = {"artifact": path, "sha256": sha, "threshold": 0.5}
    small, large = ScriptedBackend("small", lambda r: "42"), ScriptedBackend("large", lambda r: "42")
    cascade = Cascade([tier("small", small, prerouter=pre), tier("large", large, prerouter=pre)], CascadeSettings())
    result = await cascade.run(ask("hard"))
    assert result.final.tier == "large" and result.attempts[1].prerouter is None
    direct = await cascade.run(ask("hard"), model="small")  # the client named the tier: it answers
    assert direct.final.tier == "small" and not direct.attempts[0].skipped


def test_a_tampered_prerouter_stops_start_up(tmp_path: Path) -> None:
    path, sha = prerouter_file(tmp_path)
    path.write_text(path.read_text().replace('"intercept":-5.0', '"intercept":5.0'))
    with pytest.raises(ConfigError, match=r"tiers \(small\)\.prerouter: .*SHA-256 .* is not the configured"):
        tier("small", ScriptedBackend("small", str), prerouter={"artifact": path, "sha256": sha, "threshold": 0.5})


def test_prerouter_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="sha256"):
        TierSettings(
            name="s",
            backend="llamacpp",
            llamacpp={"model": "x.gguf"},
            price=PRICE,
            prerouter={"artifact": "p.json", "sha256": "abc", "threshold": 0.5},
        )
    with pytest.raises(ValueError, match="threshold"):
        TierSettings(
            name="s",
            backend="llamacpp",
            llamacpp={"model": "x.gguf"},
            price=PRICE,
            prerouter={"artifact": "p.json", "sha256": "0" * 64, "threshold": 1.5},
        )
    with pytest.raises(ValueError, match="extra"):
        TierSettings(
            name="s",
            backend="llamacpp",
            llamacpp={"model": "x.gguf"},
            price=PRICE,
            prerouter={"artifact": "p.json", "sha256": "0" * 64, "threshold": 0.5, "typo": 1},
        )


# ---- the matched comparison -----------------------------------------------------------------------------------


def test_the_learned_cascade_is_also_compared_at_the_single_verifiers_accuracy() -> None:
    """The learned cascade is calibrated a second time for min-accuracy at the best single
    verifier's calibration-split accuracy: the level, and so its thresholds, come from calibration
    items only; with a learned score that ranks perfectly it then costs less at no lower accuracy."""
    from evals.learned_comparison import LEARNED, PREROUTER, compare

    rng = random.Random(3)
    items = []
    for i in range(80):
        right = rng.random() < 0.6
        noisy = min(1.0, max(0.0, (0.7 if right else 0.4) + rng.uniform(-0.35, 0.35)))
        small = TierOutcome(
            correct=right,
            cost_usd=0.001,
            latency_s=1.0,
            busy_s=1.0,
            prompt_tokens=1,
            completion_tokens=1,
            scores={"v": noisy, CONFIG: noisy, LEARNED: 0.9 if right else 0.1, PREROUTER: 0.5},
            verify_cost_usd={},
            verify_s={},
        )
        large = TierOutcome(
            correct=True,
            cost_usd=0.01,
            latency_s=1.0,
            busy_s=1.0,
            prompt_tokens=1,
            completion_tokens=1,
            scores={"v": 1.0, CONFIG: 1.0, LEARNED: 1.0, PREROUTER: 1.0},
            verify_cost_usd={},
            verify_s={},
        )
        items.append(ItemOutcome(f"i{i}", "", (small, large)))
    tiers = [TierInfo("small", "m", PRICE, "", 0.5, True), TierInfo("large", "M", PRICE, "", 0.5, True)]
    t = ResultTable(run="t", suite="t", source="", tiers=tiers, items=items, verifiers=[CONFIG, "v", LEARNED])
    cmp = compare(t, Target("min-pgr", 0.8), seed=0, fraction=0.5)
    assert cmp.best_single == "v" and cmp.matched is not None
    assert cmp.matched.target == Target("min-accuracy", cmp.verify_only["v"].calibration.accuracy)
    m, ref = cmp.matched.held_out, cmp.verify_only["v"].held_out
    assert m.accuracy >= ref.accuracy and m.cost_per_1k < ref.cost_per_1k
    check = next(c for c in cmp.checks() if c[0].startswith("learned cascade cheaper"))
    assert check[1] is True and "matched" in check[2]
    # held-out verdicts turned around: the level and the matched thresholds stay as they were
    flipped = [
        it
        if in_cal(it.id)
        else ItemOutcome(it.id, "", (replace(it.tiers[0], correct=not it.tiers[0].correct), it.tiers[1]))
        for it in items
    ]
    again = compare(replace(t, items=flipped), Target("min-pgr", 0.8), seed=0, fraction=0.5)
    assert again.matched is not None
    assert (again.matched.target, again.matched.thresholds) == (cmp.matched.target, cmp.matched.thresholds)


def in_cal(item_id: str) -> bool:
    from evals.calibrate import in_calibration

    return in_calibration(item_id, 0, 0.5)
