"""Training the learned estimators on a small stored run (see learned_helpers): what is written,
that the served verifier reproduces the stored predictions exactly, that held-out items touch
neither a model nor a threshold, and the estimators in the sweep, calibration and report."""

from __future__ import annotations

import io
import json
import random
import shutil
from contextlib import redirect_stdout
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from evals import measures
from evals.calibrate import in_calibration
from evals.fitting import fit_model, log_loss, out_of_fold
from evals.learned_comparison import LEARNED, PREROUTER, attach, compare, load_predictions
from evals.train import DEFAULT_TARGET, TrainResult, train
from evals.training_data import feature_verifiers, load_run
from router.cli import main
from router.config import VerifierSpec
from router.errors import ConfigError
from router.learned.estimators import PreRouter
from tests.support.learned import make_run
from verifiers.base import Registry, VerifierContext
from verifiers.learned import LearnedVerifier

pytestmark = pytest.mark.slow  # loads a model, starts processes or spends seconds of CPU

BUCKETS = 64


@pytest.fixture(scope="module")
async def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TrainResult, str]:
    """The module's one training, through the command as a user runs it, with one other split
    (`--splits 1`: a whole training again, whose checks the report adds): every test reads these
    artifacts, and the command's test its output. What `train` returned is read back from what it
    wrote, as `_train` itself computes the comparison (each training costs seconds of CPU)."""
    tmp = tmp_path_factory.mktemp("learned")
    root = await make_run(tmp)
    est = tmp / "est"
    printed = io.StringIO()
    with redirect_stdout(printed):
        code = main(
            ["eval", "train", "--run", str(root), "--out", str(est), "--buckets", str(BUCKETS), "--splits", "1"]
        )
    assert code == 0
    manifest = json.loads((est / "estimators.json").read_text())
    table = attach(load_run(root).table, load_predictions(est), seed=0, fraction=0.5)
    comparison = compare(table, DEFAULT_TARGET, seed=0, fraction=0.5)
    result = TrainResult(est, manifest["artifacts"], [comparison], None, manifest["feature_verifiers"], False)
    return root, result, printed.getvalue()


def artifact(result: TrainResult, kind: str) -> tuple[Path, str]:
    a = next(a for a in result.artifacts if a["kind"] == kind)
    return result.out / a["file"], a["sha256"]


def test_training_writes_artifacts_predictions_and_report(trained) -> None:
    root, result, _ = trained
    names = {p.name for p in result.out.iterdir()}
    assert {
        "learned.json",
        "prerouter.json",
        "predictions.jsonl",
        "estimators.json",
        "README.md",
        "training.json",
    } <= names
    manifest = json.loads((result.out / "estimators.json").read_text())
    assert manifest["seed"] == 0 and manifest["fraction"] == 0.5
    assert manifest["feature_verifiers"]["marked"] == ['confidence[stat="mean"]', "confidence_min", "math_answer"]
    rows = [json.loads(line) for line in (result.out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 160 * 2
    assert all(r["split"] == ("calibration" if in_calibration(r["item"], 0, 0.5) else "held-out") for r in rows)
    md = (result.out / "README.md").read_text()
    _, sha = artifact(result, "verifier")
    for phrase in (
        "Held-out quality",
        "pre-route then verify[learned]",
        "verify only[learned]",
        "Targets",
        'name = "learned"',
        f'sha256 = "{sha}"',
        "[tiers.prerouter]",
    ):
        assert phrase in md, phrase


async def test_held_out_predictions_are_what_the_service_computes(trained) -> None:
    """Training and serving share the features: the verifier built from the artifact, computing
    its own feature verifiers, gives every held-out item the stored prediction."""
    root, result, _ = trained
    run = load_run(root)
    preds = load_predictions(result.out)
    path, sha = artifact(result, "verifier")
    pre_path, pre_sha = artifact(result, "prerouter")
    for ti, tier in enumerate(("small", "large")):
        verifier = LearnedVerifier.load(path, sha, VerifierContext(tier=tier, registry=Registry.from_entry_points()))
        prerouter = PreRouter.load(pre_path, pre_sha, tier, 0.5)
        held = [it for it in run.table.items if not in_calibration(it.id, 0, 0.5)]
        for it in held:
            row = preds.rows[("marked", it.id, tier)]
            score = await verifier.score(run.requests[it.id], run.generations[(it.id, ti)])
            assert score.value == pytest.approx(row[LEARNED], abs=1e-9)
            assert prerouter.probability(run.requests[it.id]) == pytest.approx(row[PREROUTER], abs=1e-9)


def test_the_estimators_learn_something(trained) -> None:
    _, result, _ = trained
    cmp = result.comparisons[0]
    learned, pre = cmp.quality_of(LEARNED), cmp.quality_of(PREROUTER)
    assert learned.auroc > 0.8  # the logprobs separate right from wrong
    assert pre.auroc > 0.7  # 'Easy' prompts are answered right more often
    assert learned.brier < 0.2


async def test_held_out_items_touch_no_model_and_no_threshold(trained, tmp_path: Path) -> None:
    root, result, _ = trained
    copy = tmp_path / "runs" / "marked"
    shutil.copytree(root, copy)
    lines = []
    for line in (copy / "grades.jsonl").read_text().splitlines():
        g = json.loads(line)
        if not in_calibration(g["item"], 0, 0.5):
            g["correct"] = not g["correct"]  # every held-out verdict turned around
        lines.append(json.dumps(g))
    (copy / "grades.jsonl").write_text("\n".join(lines) + "\n")
    again = train([load_run(copy)], tmp_path / "est", n_buckets=BUCKETS)
    assert [a["sha256"] for a in again.artifacts] == [a["sha256"] for a in result.artifacts]
    before, after = result.comparisons[0], again.comparisons[0]
    assert after.verify_only[LEARNED].thresholds == before.verify_only[LEARNED].thresholds
    pv_b, pv_a = before.preroute_verify[LEARNED], after.preroute_verify[LEARNED]
    assert (pv_a.skip_below, pv_a.thresholds) == (pv_b.skip_below, pv_b.thresholds)
    cal = lambda r: {k: v for k, v in load_predictions(r.out).rows.items() if v["split"] == "calibration"}  # noqa: E731
    assert cal(again) == cal(result)


def test_out_of_fold_predictions_do_not_remember_their_rows() -> None:
    """Random labels, more features than rows: a model scoring rows it was fit on ranks them
    almost perfectly; out-of-fold scores are at chance, as scores of unseen items must be."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 150))
    y = rng.integers(0, 2, size=120)
    from sklearn.linear_model import LogisticRegression

    # (fit_model's own cross-validation picks a constant model for random labels, so the
    # memorising model is a weakly regularised logistic regression)
    memorised = LogisticRegression(C=100.0, max_iter=5000).fit(x, y).decision_function(x)
    assert measures.auroc(y, memorised) > 0.9
    assert abs(measures.auroc(y, out_of_fold(x, y, 150, seed=0)) - 0.5) < 0.15


def test_the_log_loss_is_sklearns_to_the_bit() -> None:
    """fit_model chooses by this loss and stores it: it must be sklearn's exactly, not nearly,
    or a near tie could choose another model than the committed estimators were trained with."""
    from sklearn.metrics import log_loss as sklearn_log_loss

    from router.learned.estimators import sigmoid

    rng = np.random.default_rng(0)
    for i in range(300):
        n = int(rng.integers(2, 300))
        y = rng.integers(0, 2, n)
        p = sigmoid(rng.normal(0.0, float(rng.choice([0.1, 1.0, 10.0, 60.0])), n))
        if i % 5 == 0:  # certain, right or wrong: clipped as sklearn clips
            p[: n // 3] = rng.choice([0.0, 1.0], n // 3)
        assert log_loss(y, p) == sklearn_log_loss(y, p, labels=[0, 1])


def test_with_one_outcome_the_model_is_the_base_rate() -> None:
    x = np.random.default_rng(1).normal(size=(30, 4))
    m = fit_model(x, np.ones(30, dtype=int), n_dense=4)
    assert m.info["kind"] == "constant"
    assert float(m.probability(x[0])) == pytest.approx(31 / 32)


def test_verifiers_that_generate_are_not_features_by_default(trained) -> None:
    root, _, _ = trained
    run = load_run(root)
    table = run.table.with_scores("self_consistency", {it.id: [0.5, 0.5] for it in run.table.items})
    manifest = {
        **table.manifest,
        "verifiers": [
            *table.manifest["verifiers"],
            {"name": "self_consistency", "params": {}, "label": "self_consistency"},
        ],
    }
    run = replace(run, table=replace(table, manifest=manifest))
    assert "self_consistency" not in [v.label for v in feature_verifiers([run])]
    assert "self_consistency" in [v.label for v in feature_verifiers([run], include_costly=True)]


def test_another_split_is_refused(trained) -> None:
    root, result, _ = trained
    preds = load_predictions(result.out)
    with pytest.raises(ConfigError, match="seed 0, fraction 0.5"):
        attach(load_run(root).table, preds, seed=1, fraction=0.5)


def test_the_learned_column_pays_for_its_feature_verifiers(trained) -> None:
    root, result, _ = trained
    table = attach(load_run(root).table, load_predictions(result.out), seed=0, fraction=0.5)
    assert LEARNED in table.verifiers and PREROUTER not in table.verifiers
    t = table.items[0].tiers[0]
    members = ('confidence[stat="mean"]', "confidence_min", "math_answer")
    assert t.verify_s[LEARNED] == pytest.approx(max(t.verify_s[m] for m in members))
    assert PREROUTER in t.scores


async def test_cli_train_then_sweep_calibrate_and_report(trained, tmp_path: Path, capsys) -> None:
    """`eval train` (run once, by the module's fixture) and the commands that read its estimators."""
    root, result, out = trained
    est = result.out
    assert "verifier@" in out and "prerouter@" in out and "[tiers.prerouter]" in out
    readme = (est / "README.md").read_text()
    # one other split (each is a whole training again; `--splits N` gives seeds 1..N)
    assert "--splits 1" in readme and "## The same on other splits" in readme and "| seed 1 | met |" in readme
    assert [s["seed"] for s in json.loads((est / "training.json").read_text())["other_splits"]] == [1]
    assert main(["eval", "sweep", str(root), "--estimators", str(est), "--verifier", LEARNED]) == 0
    out = capsys.readouterr().out
    assert "marked / learned" in out and "pre-route only" in out
    assert (
        main(
            [
                "eval",
                "calibrate",
                "--run",
                str(root),
                "--target",
                "min-pgr=0.8",
                "--verifier",
                LEARNED,
                "--estimators",
                str(est),
            ]
        )
        == 0
    )
    assert "held-out" in capsys.readouterr().out
    report = tmp_path / "report"
    assert main(["eval", "report", str(root), "--out", str(report), "--estimators", str(est)]) == 0
    md = (report / "README.md").read_text()
    for phrase in (
        "learned estimators",
        "pre-route only",
        "pre-route then verify[learned]",
        "Held-out quality",
        "--estimators",
        "| learned |",
    ):
        assert phrase in md, phrase
    assert "learned estimators" in (report / "report.html").read_text()
    assert main(["eval", "report", str(root), "--out", str(report), "--estimators", str(est), "--seed", "3"]) == 1


def test_a_run_whose_prompts_changed_is_refused(trained, tmp_path: Path) -> None:
    root, _, _ = trained
    copy = tmp_path / "marked"
    shutil.copytree(root, copy)
    suite = Path(json.loads((copy / "manifest.json").read_text())["suite"]["source"].split(" (sha256")[0])
    edited = tmp_path / "edited.jsonl"
    rows = [json.loads(line) for line in suite.read_text().splitlines()]
    rows[random.Random(0).randrange(len(rows))]["prompt"] += " (now different)"
    edited.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="is not what the run asked"):
        load_run(copy, suite=str(edited))


async def test_pooled_suites_share_their_pure_verifiers(tmp_path: Path) -> None:
    """Two suites scored with different verifiers: pooled, the estimator reads both pure ones,
    computed at training for the suite that lacks it, as the service computes it for any prompt."""
    a = await make_run(
        tmp_path,
        60,
        "alpha",
        [VerifierSpec(name="confidence", params={"stat": "mean"}), VerifierSpec(name="math_answer")],
    )
    b = await make_run(
        tmp_path,
        60,
        "beta",
        [
            VerifierSpec(name="confidence", params={"stat": "mean"}),
            VerifierSpec(name="format", params={"regex": "answer", "name": "says_answer"}),
        ],
    )
    runs = [load_run(a), load_run(b)]
    assert [v.label for v in feature_verifiers(runs)] == ['confidence[stat="mean"]', "math_answer", "says_answer"]
    result = train(runs, tmp_path / "est", n_buckets=16)
    assert result.pooled is not None and len(result.artifacts) == 2
    preds = load_predictions(result.out)
    path, sha = artifact(result, "verifier")
    verifier = LearnedVerifier.load(path, sha, VerifierContext(tier="small", registry=Registry.from_entry_points()))
    run = load_run(b)
    for it in run.table.items:
        if not in_calibration(it.id, 0, 0.5):
            score = await verifier.score(run.requests[it.id], run.generations[(it.id, 0)])
            assert score.value == pytest.approx(preds.rows[("beta", it.id, "small")][LEARNED], abs=1e-9)
            assert score.details["features"]["math_answer"] == 1.0  # computed for beta, which never stored it
    md = (result.out / "README.md").read_text()
    assert md.count("```toml") == 1 and "alpha+beta" in md  # one config: the pooled thresholds


def test_a_verifier_scored_only_on_tiers_that_escalate_is_a_feature_with_deciding_tiers(
    trained, tmp_path: Path
) -> None:
    """`cross_tier` has nothing to score the last tier's answer with, so a run stores it for the
    first tier only: with --deciding-tiers it is a feature, and the learned verifier is trained for
    the first tier only (the last tier's column abstains) instead of the verifier being dropped."""
    root, _, _ = trained
    run = load_run(root)
    items = []
    for it in run.table.items:
        first, last = it.tiers
        first = replace(first, scores={**first.scores, "cross_tier": first.scores["confidence_min"]})
        items.append(replace(it, tiers=(first, last)))
    manifest = {
        **run.table.manifest,
        "verifiers": [
            *run.table.manifest["verifiers"],
            {"name": "cross_tier", "params": {"tier": "large"}, "label": "cross_tier"},
        ],
    }
    run = replace(run, table=replace(run.table, items=items, manifest=manifest))
    assert "cross_tier" not in [v.label for v in feature_verifiers([run], include_costly=True)]
    assert "cross_tier" in [v.label for v in feature_verifiers([run], include_costly=True, deciding_tiers=True)]
    # it reads with the large tier's model on every request: a feature only when costly ones are
    # allowed, even where this run's stored scores carry no cost
    assert "cross_tier" not in [v.label for v in feature_verifiers([run], deciding_tiers=True)]

    result = train([run], tmp_path / "est", n_buckets=BUCKETS, deciding_tiers=True, include_costly=True)
    blob = json.loads(next(result.out / a["file"] for a in result.artifacts if a["kind"] == "verifier").read_text())
    assert list(blob["models"]) == ["small"]
    table = attach(run.table, load_predictions(result.out), seed=0, fraction=0.5)
    assert all(it.tiers[0].scores[LEARNED] is not None for it in table.items)
    assert all(it.tiers[1].scores[LEARNED] is None for it in table.items)
