"""Calibration: the split is fixed by seed and item id, thresholds are chosen on calibration items
only, and the held-out report is what those thresholds do on the other items."""

from __future__ import annotations

import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from evals.calibrate import (
    Target,
    baseline_hint,
    calibrate,
    choose,
    goal,
    in_calibration,
    split,
    toml_snippet,
    write_thresholds,
)
from evals.sweep import CONFIG, CascadePolicy, ItemOutcome, evaluate
from router.config import DEFAULT_CONFIG, load_settings
from router.errors import ConfigError
from tests.support.evals import synthetic


def test_split_is_fixed_by_seed_and_item_id() -> None:
    table = synthetic()
    calib, held = split(table, seed=3)
    ids_c, ids_h = {i.id for i in calib.items}, {i.id for i in held.items}
    assert ids_c.isdisjoint(ids_h) and ids_c | ids_h == {i.id for i in table.items}
    assert 70 < len(ids_c) < 130
    assert {i.id for i in split(table, seed=3)[0].items} == ids_c  # fixed
    assert {i.id for i in split(table, seed=4)[0].items} != ids_c  # a new seed, a new split
    # an item's side does not depend on which other items are in the run
    fewer = table.subset(sorted(ids_c)[:10] + sorted(ids_h)[:10])
    assert {i.id for i in split(fewer, seed=3)[0].items} == set(sorted(ids_c)[:10])
    assert all(in_calibration(i, 3, 0.5) for i in ids_c)


@pytest.mark.slow
def test_held_out_items_never_influence_the_thresholds() -> None:
    table = synthetic()
    target = Target.parse("min-accuracy=0.8")
    before = calibrate(table, "v", target, seed=0)
    _, held = split(table, seed=0)
    held_ids = {i.id for i in held.items}
    # scramble everything about the held-out items: outcomes and scores
    rng = random.Random(99)
    scrambled = [
        ItemOutcome(
            it.id,
            it.group,
            tuple(replace(t, correct=rng.random() < 0.5, scores={"v": rng.random(), CONFIG: 0.0}) for t in it.tiers),
        )
        if it.id in held_ids
        else it
        for it in table.items
    ]
    after = calibrate(replace(table, items=scrambled), "v", target, seed=0)
    assert after.thresholds == before.thresholds
    assert after.calibration == before.calibration
    assert after.held_out != before.held_out  # the report moved; the choice did not


@pytest.mark.slow
def test_targets() -> None:
    table = synthetic()
    ths, r, met = choose(table, "v", Target("min-accuracy", 0.8))
    assert met and r.accuracy >= 0.8
    # nothing cheaper meets it: lowering the threshold to the next candidate falls short or costs more
    ths2, r2, met2 = choose(table, "v", Target("max-escalation", 0.3))
    assert met2 and r2.escalation_rate <= 0.3
    _, r3, met3 = choose(table, "v", Target("max-cost", 1000 * (0.001 + 0.5 * 0.01)))
    assert met3 and r3.cost_per_1k <= 6.0 + 1e-9
    _, r4, met4 = choose(table, "v", Target("min-accuracy", 0.99))
    assert not met4  # unreachable: the nearest miss, the most accurate
    weak = sum(i.tiers[0].correct for i in table.items) / len(table.items)
    strong = sum(i.tiers[1].correct for i in table.items) / len(table.items)
    _, r5, met5 = choose(table, "v", Target("min-pgr", 0.5))
    assert met5 and r5.accuracy >= weak + 0.5 * (strong - weak) - 1e-12
    # 95% of the top tier's accuracy: the cheapest setting at or above 0.95 * strong, by hand
    _, r6, met6 = choose(table, "v", Target("min-relative", 0.95))
    assert met6 and r6.accuracy >= 0.95 * strong - 1e-12
    assert goal(Target("min-relative", 0.95), weak, strong) == 0.95 * strong
    assert goal(Target("min-relative", 0.95), 0.2, 0.8) == pytest.approx(0.76)
    cheaper = [
        evaluate(CascadePolicy("v", (t,)), table)
        for t in sorted({i.tiers[0].scores["v"] for i in table.items if i.tiers[0].scores["v"] is not None})
    ]
    assert all(c.cost_per_1k >= r6.cost_per_1k - 1e-12 for c in cheaper if c.accuracy >= 0.95 * strong - 1e-12)


def test_target_parsing() -> None:
    assert Target.parse("max-cost=0.05") == Target("max-cost", 0.05)
    assert Target.parse("min-relative=0.95") == Target("min-relative", 0.95)
    for bad in ("accuracy=0.5", "min-accuracy", "min-accuracy=x", "min-accuracy=90"):
        with pytest.raises(ConfigError):
            Target.parse(bad)


def test_write_thresholds_keeps_the_rest_of_the_config(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    shutil.copy(DEFAULT_CONFIG, path)
    before = path.read_text()
    write_thresholds(path, {"small": 0.62})
    after = path.read_text()
    assert load_settings(path).tier("small").threshold == pytest.approx(0.62)
    diff = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
    assert diff == [("threshold = 0.91", "threshold = 0.62")]
    # a tier without a threshold line gets one after its name
    write_thresholds(path, {"large": 0.3})
    assert load_settings(path).tier("large").threshold == pytest.approx(0.3)
    assert load_settings(path).tier("small").threshold == pytest.approx(0.62)
    with pytest.raises(ConfigError):
        write_thresholds(path, {"nope": 0.1})


def test_write_thresholds_into_a_task_policy(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    shutil.copy(DEFAULT_CONFIG, path)
    # the shipped maths policy keeps its verifiers when its threshold is written
    write_thresholds(path, {"small": 0.88}, task="maths")
    shipped = load_settings(path).tier("small").tasks["maths"]
    assert shipped.threshold == pytest.approx(0.88)
    assert [v.name for v in shipped.verifiers or []] == ["arithmetic", "confidence"]
    # without it (the config as it was before the arithmetic check)
    text = DEFAULT_CONFIG.read_text()
    start, end = text.index("\n[tiers.tasks.maths]\n"), text.index("\n# `cross_tier` ranks GSM8K answers")
    path.write_text(text[:start] + text[end:])
    before = load_settings(path)
    # the small tier has no maths policy yet: one is added, holding only the threshold
    write_thresholds(path, {"small": 0.77}, task="maths")
    after = load_settings(path)
    small = after.tier("small")
    assert small.tasks["maths"].threshold == pytest.approx(0.77)
    assert small.tasks["maths"].verifiers is None and small.tasks["maths"].combine is None  # the tier's own
    assert small.threshold == before.tier("small").threshold  # other tasks keep theirs
    assert small.tasks["open_ended"] == before.tier("small").tasks["open_ended"]
    assert after.tier("large") == before.tier("large")
    # again: the policy's threshold line is replaced, nothing added
    lines = path.read_text().count("\n")
    write_thresholds(path, {"small": 0.66}, task="maths")
    assert load_settings(path).tier("small").tasks["maths"].threshold == pytest.approx(0.66)
    assert path.read_text().count("\n") == lines
    # a policy that already has verifiers keeps them; the last tier gets a table of its own
    write_thresholds(path, {"small": 0.3, "large": 0.2}, task="open_ended")
    final = load_settings(path)
    assert final.tier("small").tasks["open_ended"].threshold == pytest.approx(0.3)
    assert [v.name for v in final.tier("small").tasks["open_ended"].verifiers or []] == ["instructions", "degeneration"]
    assert final.tier("large").tasks["open_ended"].threshold == pytest.approx(0.2)
    assert final.tier("large").llamacpp == before.tier("large").llamacpp


@pytest.mark.slow
def test_the_snippet_names_the_drift_baseline_the_calibration_implies() -> None:
    table = synthetic()
    cal = calibrate(table, "v", Target.parse("min-accuracy=0.8"), seed=0)
    calib, _ = split(table, seed=0)
    accepted = sum(it.tiers[0].scores["v"] >= cal.thresholds["small"] for it in calib.items) / len(calib.items)
    hint = baseline_hint(cal, "maths")
    assert f"baseline_accept = {{ maths = {accepted:.3f} }}" in hint
    assert f'baseline_accept = {{ "*" = {accepted:.3f} }}' in toml_snippet(cal)
    # a tier that accepts everything or nothing gives a detector no baseline to move from
    everything = calibrate(table, "v", Target.parse("max-escalation=0"), seed=0)
    assert everything.calibration.answered[0] == 1.0 and baseline_hint(everything) == ""
