"""The anchors' setup, Mixtral -> GPT-4 verified after generation (`evals.frontier.verified`), and
the cached cross_tier readings of published answers (`evals.frontier.scoring`): what each signal
reads and costs, the learned estimator fit on a calibration half alone, and the scoring command
resumed and refusing a cache made by another model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from evals.frontier import verified
from evals.frontier.cascade import local_table, priced
from evals.frontier.published import GPT4, MIXTRAL, load
from evals.frontier.scoring import load_scores
from evals.frontier.tiers import write_run
from evals.store import RunStore
from evals.suites import get_suite
from router.cli import main
from tests.support.evals import write_config

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "evals/data/routellm"


def _subset(tmp: Path, ids: list[str]) -> Path:
    out = tmp / "data"
    out.mkdir(exist_ok=True)
    (out / "meta.json").write_bytes((DATA / "meta.json").read_bytes())
    rows = [json.loads(line) for line in (DATA / "gsm8k.jsonl").read_text(encoding="utf-8").splitlines()]
    (out / "gsm8k.jsonl").write_text("\n".join(json.dumps(r) for r in rows if r["id"] in ids) + "\n")
    return out


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    root = write_run(load("gsm8k", DATA), get_suite("gsm8k"), tmp_path_factory.mktemp("runs"))
    local, _ = local_table([RunStore(REPO / "evals/results/gsm8k")])
    return local, priced(RunStore(root), "gpt-4-1106-preview")


def test_the_signals_read_mixtrals_text_and_pay_for_the_local_work(tables: tuple[object, object]) -> None:
    local, frontier = tables
    texts = {it.id: it.tiers[0].text for it in frontier.items}  # type: ignore[attr-defined]
    readers = {s.label: s for s in verified.reader_signals(texts)}
    # gsm8k/0: "16 - 3 = 13 ... 9 * $2 = $<<9*2=18>>18 #### 18": every step holds, a number is stated
    assert readers[verified.STEPS].scores["gsm8k/0"] == 1.0 and readers[verified.MATH].scores["gsm8k/0"] == 1.0
    assert all(c == 0.0 for s in readers.values() for c in s.cost.values()) and not readers[verified.STEPS].local
    agree = verified.agreement_signal(verified.AGREES_SMALL, texts, local)  # type: ignore[arg-type]
    small = {it.id: it.tiers[0] for it in local.items}  # type: ignore[attr-defined]
    answered = [i for i in texts if i in small]
    assert len(answered) == 200 and agree.local
    # the committed run holds 200 of the 1,319 items: elsewhere no small answer, no score, no cost
    assert all(agree.scores[i] is None and agree.cost[i] == 0.0 for i in texts if i not in small)
    assert all(agree.cost[i] == small[i].cost_usd for i in answered)
    table = verified.verified_table(frontier, [*readers.values(), agree])  # type: ignore[arg-type]
    free = verified.verified_table(frontier, [*readers.values(), agree], local_scale=0.0)  # type: ignore[arg-type]
    assert [t.name for t in table.tiers] == [MIXTRAL, GPT4] and len(table.items) == 1319
    at = next(k for k, it in enumerate(table.items) if it.id in small)
    it, it0 = table.items[at], free.items[at]
    assert it.tiers[0].verify_cost_usd[verified.AGREES_SMALL] == small[it.id].cost_usd > 0
    assert it0.tiers[0].verify_cost_usd[verified.AGREES_SMALL] == 0.0
    assert it.tiers[1].cost_usd == it0.tiers[1].cost_usd > 0  # GPT-4 is not local work


def test_combinations_follow_the_live_rule_and_pay_for_both() -> None:
    a = verified.Signal("a", {"x": 1.0, "y": None, "z": 0.2}, {"x": 1.0, "y": 1.0, "z": 1.0}, False)
    b = verified.Signal("b", {"x": 0.5, "y": None, "z": None}, {"x": 2.0, "y": 2.0, "z": 2.0}, True)
    made = {s.label: s for s in verified.combined([a, b])}
    assert made["min(a, b)"].scores == {"x": 0.5, "y": None, "z": 0.2}  # an abstention is ignored
    assert made["mean(a, b)"].scores == {"x": 0.75, "y": None, "z": 0.2}
    assert made["min(a, b)"].cost == {"x": 3.0, "y": 3.0, "z": 3.0} and made["min(a, b)"].local


def test_the_learned_estimator_never_sees_a_held_out_label() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 5))
    right = x[:, 0] + rng.normal(size=300) > 0
    calibration = rng.random(300) < 0.5
    before = verified.fit_scores(x, right, calibration)
    scrambled = right.copy()
    scrambled[~calibration] = rng.random(int((~calibration).sum())) < 0.5
    assert np.array_equal(verified.fit_scores(x, scrambled, calibration), before)
    # and it learned something: its scores rank the held-out answers
    from evals import measures

    auroc = measures.auroc(right[~calibration], before[~calibration])
    assert auroc is not None and auroc > 0.7


@pytest.mark.slow  # loads the test model
def test_the_scoring_command_caches_resumes_and_refuses_another_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)
    data = _subset(tmp_path, ["gsm8k/0", "gsm8k/1", "gsm8k/2"])
    out = tmp_path / "scores"
    args = ["eval", "frontier-score", "--config", str(config), "--data", str(data), "--out", str(out)]
    assert main([*args, "--limit", "2"]) == 0
    published, suite = load("gsm8k", data), get_suite("gsm8k")
    first = load_scores(out, published, suite)
    assert sorted(first.records) == ["gsm8k/0", "gsm8k/1"] and first.scorer == "large"
    rec = first.records["gsm8k/0"]
    assert {"mean", "min", "q10", "q25", "top1_share"} <= set(rec.details)
    assert rec.cost_tier == "large" and rec.cost_prompt_tokens > 0 and rec.cost_seconds > 0
    lines = (out / "scores.jsonl").read_text().splitlines()
    assert main(args) == 0  # resumed: only gsm8k/2 is read now
    assert len((out / "scores.jsonl").read_text().splitlines()) == len(lines) + 1
    assert sorted(load_scores(out, published, suite).records) == ["gsm8k/0", "gsm8k/1", "gsm8k/2"]
    # scores made by another model are never mixed with these
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["scorer"]["model"] = "llamacpp:another@0"
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert main(args) != 0
    assert "use another --out" in capsys.readouterr().err
    assert len((out / "scores.jsonl").read_text().splitlines()) == len(lines) + 1  # nothing written
