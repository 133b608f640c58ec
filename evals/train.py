"""Training the learned verifier and the pre-router on stored eval results (`tierroute eval train`).

What they learn from, per (item, tier) of one or more runs: the prompt the tier was sent, its
answer (logprobs, length, finish reason), the stored scores of the eval's verifiers, and the
grader's verdict (see `router.learned.features` for the features; training and serving
share that code). One model per tier and estimator: a logistic regression whose strength is
chosen by cross-validated log-loss, then recalibrated by Platt scaling on its cross-validated
logits. By default one model per tier serves all the runs given (their suites pooled);
``--suite-specific`` fits one per run instead.

Hygiene. The split is `evals.calibrate.split`'s, by seed and item id, so a held-out item here is
held out in every sweep, calibration and report with the same seed. Models are fit on
calibration items only; held-out items are only predicted, by the final model (the one in the
artifact). Thresholds are chosen on calibration items as well, and for that every calibration
item is scored by a model that never saw it: its out-of-fold prediction (5 folds, each fold's
model doing its own inner cross-validation). So no threshold is chosen on scores a model fit on
the same items, and no held-out item touches a model or a threshold.

Only verifiers that cost no generation are features by default: the learned verifier computes
its features' verifiers itself when serving, and `self_consistency` or `judge` would add their
generations to every request (``--with-costly-verifiers`` allows them).

This module runs a training: the split, the artifacts, the predictions, the comparison. What the
estimators learn from is `evals.training_data`, one model's fit `evals.fitting`, and the report
`evals.train_report`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evals.calibrate import Target, in_calibration
from evals.fitting import fit_model, out_of_fold
from evals.learned_comparison import (
    LEARNED,
    MANIFEST,
    PREDICTIONS,
    PREROUTER,
    attach,
    compare,
    load_predictions,
    pooled,
)
from evals.train_report import TrainResult, write_report
from evals.training_data import RunData, feature_verifiers, fill_scores
from router.errors import ConfigError
from router.learned.estimators import LinearModel, dump_estimator
from router.learned.features import FeatureSpec

DEFAULT_TARGET = Target("min-pgr", 0.8)


def train(
    runs: Sequence[RunData],
    out: Path,
    *,
    seed: int = 0,
    fraction: float = 0.5,
    suite_specific: bool = False,
    include_costly: bool = False,
    deciding_tiers: bool = False,
    n_buckets: int = 1024,
    target: Target = DEFAULT_TARGET,
    command: str = "",
    splits: int = 0,
) -> TrainResult:
    """Train, write the artifacts, predictions and report into `out`. With `splits`, also train
    and compare on that many other calibration splits (seeds seed+1, ...), into a scratch
    directory (artifacts and predictions only), and report how often each target is met: with a
    hundred held-out items a point of accuracy is one item, and one split alone says little."""
    if not runs:
        raise ConfigError("give at least one run")
    names = [t.name for t in runs[0].table.tiers]
    for r in runs[1:]:
        if [t.name for t in r.table.tiers] != names:
            raise ConfigError(f"runs {runs[0].name} and {r.name} have different tiers; pick the same with --tiers")
    import sklearn.linear_model  # noqa: F401 - load BLAS before limiting it: a later-loaded library is not limited
    from threadpoolctl import threadpool_limits

    fit = functools.partial(
        _train,
        runs,
        names,
        fraction=fraction,
        suite_specific=suite_specific,
        include_costly=include_costly,
        deciding_tiers=deciding_tiers,
        n_buckets=n_buckets,
        target=target,
        command=command,
    )
    with threadpool_limits(1):  # thousands of small fits: threads only fight over the matrices
        result = fit(out, seed=seed)
        for other in range(seed + 1, seed + 1 + splits):
            with tempfile.TemporaryDirectory() as scratch:
                again = fit(Path(scratch), seed=other)
            for cmp in [*again.comparisons, *([again.pooled] if again.pooled else [])]:
                result.splits.append((other, cmp.table.suite, cmp.checks(short=True)))
    write_report(result, command=command)  # once, with the other splits' checks when there are any
    return result


def _train(
    runs: Sequence[RunData],
    names: list[str],
    out: Path,
    *,
    seed: int,
    fraction: float,
    suite_specific: bool,
    include_costly: bool,
    deciding_tiers: bool,
    n_buckets: int,
    target: Target,
    command: str,
) -> TrainResult:
    out.mkdir(parents=True, exist_ok=True)
    groups = [[r] for r in runs] if suite_specific else [list(runs)]
    artifacts: list[dict[str, Any]] = []
    predictions: list[dict[str, Any]] = []
    members: dict[str, list[str]] = {}
    for group in groups:
        refs = feature_verifiers(group, include_costly=include_costly, deciding_tiers=deciding_tiers)
        for r in group:
            fill_scores(r, refs)
        spec_v = FeatureSpec(answer=True, verifiers=tuple(refs), n_buckets=n_buckets)
        spec_p = FeatureSpec(answer=False, n_buckets=n_buckets)
        suffix = f"-{group[0].table.suite}" if suite_specific else ""
        models: dict[str, dict[str, LinearModel]] = {"verifier": {}, "prerouter": {}}
        # what does not depend on the tier: the prompt's row, the split, the key
        rows = [(r, it) for r in group for it in r.table.items]
        keys = [(r.name, it.id) for r, it in rows]
        xp_a = np.array([spec_p.vector(r.requests[it.id]) for r, it in rows])
        cal_a = np.array([in_calibration(it.id, seed, fraction) for _, it in rows], dtype=bool)
        if not cal_a.any() or cal_a.all():
            raise ConfigError(f"{len(cal_a)} items are too few to split into calibration and held-out items")
        for ti, tier in enumerate(names):
            # with deciding_tiers the last tier gets no learned verifier: its features may not exist there
            verifies = not (deciding_tiers and len(names) > 1 and ti == len(names) - 1)
            xv_a = np.array(
                [
                    spec_v.vector(
                        r.requests[it.id],
                        r.generations[(it.id, ti)],
                        {ref.label: it.tiers[ti].scores[ref.label] for ref in refs},
                    )
                    for r, it in rows
                ]
                if verifies
                else []
            )
            y_a = np.array([it.tiers[ti].correct for _, it in rows], dtype=int)
            preds: dict[str, np.ndarray | None] = {}
            for kind, x, spec in (("verifier", xv_a, spec_v), ("prerouter", xp_a, spec_p)):
                if kind == "verifier" and not verifies:
                    preds[kind] = None
                    continue
                n_dense = len(spec.dense_names)
                model = fit_model(x[cal_a], y_a[cal_a], n_dense, seed=seed)
                models[kind][tier] = model
                p = np.empty(len(y_a))
                p[cal_a] = out_of_fold(x[cal_a], y_a[cal_a], n_dense, seed=seed)
                p[~cal_a] = model.probability(x[~cal_a])
                preds[kind] = p
            learned_p, pre_p = preds["verifier"], preds["prerouter"]
            assert pre_p is not None  # every tier has a pre-router
            for j, (run, item) in enumerate(keys):
                predictions.append(
                    {
                        "run": run,
                        "item": item,
                        "tier": tier,
                        "split": "calibration" if cal_a[j] else "held-out",
                        LEARNED: None if learned_p is None else round(float(learned_p[j]), 12),
                        PREROUTER: round(float(pre_p[j]), 12),
                    }
                )
        trained_on = {
            "runs": [r.name for r in group],
            "suites": [r.table.suite for r in group],
            "seed": seed,
            "fraction": fraction,
            "rows_per_tier": sum(len(r.table.items) for r in group),
            "fit_on": "calibration split only",
        }
        for kind, spec, stem in (("verifier", spec_v, "learned"), ("prerouter", spec_p, "prerouter")):
            blob = dump_estimator(kind, spec, models[kind], trained_on)
            path = out / f"{stem}{suffix}.json"
            path.write_bytes(blob)
            sha = hashlib.sha256(blob).hexdigest()
            artifacts.append(
                {
                    "kind": kind,
                    "group": group[0].table.suite if suite_specific else "pooled",
                    "file": path.name,
                    "sha256": sha,
                    "version": f"{kind}@{sha[:12]}",
                    "runs": [r.name for r in group],
                    "tiers": names,
                }
            )
        for r in group:
            members[r.name] = [ref.label for ref in refs]
    manifest = {
        "format": 1,
        "seed": seed,
        "fraction": fraction,
        "suite_specific": suite_specific,
        "runs": [{"name": r.name, "suite": r.table.suite, "items": len(r.table.items)} for r in runs],
        "tiers": names,
        "feature_verifiers": members,
        "artifacts": artifacts,
        "target": str(target),
        "command": command,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    with open(out / PREDICTIONS, "w", encoding="utf-8") as f:
        for row in predictions:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    stored = load_predictions(out)
    tables = [attach(r.table, stored, seed=seed, fraction=fraction) for r in runs]
    comparisons = [compare(t, target, seed=seed, fraction=fraction) for t in tables]
    pooled_cmp = None
    notes = []
    if len(tables) > 1 and not suite_specific:
        pooled_cmp = compare(pooled(tables), target, seed=seed, fraction=fraction)
    elif len(tables) > 1:
        notes.append(
            "Suite-specific estimators: the thresholds below are per suite; serve each with its suite's traffic."
        )
    return TrainResult(out, artifacts, comparisons, pooled_cmp, members, suite_specific, notes)
