"""`tierroute eval train`: fit the learned verifier and the pre-router on stored eval results.

What they learn from, per (item, tier) of one or more runs: the prompt the tier was sent, its
answer (logprobs, length, finish reason), the stored scores of the eval's verifiers, and the
grader's verdict (see `verifiers.learned_features` for the features; training and serving
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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from evals.calibrate import Target, in_calibration, split_options
from evals.estimators import (
    LEARNED,
    MANIFEST,
    PREDICTIONS,
    PREROUTER,
    Comparison,
    attach,
    compare,
    comparison_json,
    comparison_markdown,
    load_predictions,
    pooled,
)
from evals.store import RunStore, generation_key
from evals.sweep import ResultTable, load_table
from router.errors import ConfigError
from router.generation import Generation, GenerationRequest
from verifiers.learned import LinearModel, dump_estimator, score_or_zero, sigmoid
from router.features import FeatureSpec, VerifierRef

C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
GRAM_GAINS = (1.0, 4.0, 0.0)  # how much the hashed prompt grams may weigh; 0 drops them
FOLDS = 5
COSTLY = frozenset({"self_consistency", "judge"})  # verifiers that generate; see the module docstring
PURE = frozenset({"confidence", "format", "math_answer"})  # functions of request and answer alone, microseconds
_MAX_ITER = 5000


# ---- what a run holds ---------------------------------------------------------------------------------


@dataclass
class RunData:
    table: ResultTable
    requests: dict[str, GenerationRequest]  # item id -> the request every tier was sent (its messages)
    generations: dict[tuple[str, int], Generation]  # (item id, tier index) -> the stored answer
    costly: set[str]  # verifier labels whose stored scores paid for generations

    @property
    def name(self) -> str:
        return self.table.run


def load_run(path: Path, *, suite: str | None = None, cache_dir: Path | None = None,
             tiers: Sequence[str] | None = None) -> RunData:
    """A run's priced table, with the prompts rebuilt from its suite (checked against the hash
    the run recorded) and the stored generations."""
    store = RunStore(path)
    table = load_table(store, tiers=tiers)
    m = table.manifest
    suite_obj = _suite_of(m, suite)
    items = {it.id: it for it in suite_obj.load(cache_dir)}
    kept = {it.id for it in table.items}
    requests = {}
    generations = {}
    snaps = {t["name"]: t for t in m["tiers"]}
    for entry in m["items"]:
        if entry["id"] not in kept:
            continue
        item = items.get(entry["id"])
        if item is None or item.prompt_sha != entry["prompt_sha"]:
            raise ConfigError(
                f"run {store.name}: item {entry['id']} is not what the run asked (the suite's data or prompt format "
                "changed since); train on a run made with this version of the suite"
            )
        requests[item.id] = GenerationRequest(messages=item.messages, max_tokens=suite_obj.max_tokens,
                                              metadata={"task": suite_obj.task})
        for i, info in enumerate(table.tiers):
            rec = store.generations.records[generation_key(snaps[info.name]["fingerprint"], entry["prompt_sha"])]
            generations[(item.id, i)] = rec.to_generation()
    costly = {r.verifier for r in store.scores.records.values() if r.cost_prompt_tokens or r.cost_completion_tokens}
    return RunData(table, requests, generations, costly)


def _suite_of(manifest: dict[str, Any], explicit: str | None) -> Any:
    from evals.suites import get_suite

    if explicit:
        return get_suite(explicit)
    name = manifest["suite"]["name"]
    try:
        return get_suite(name)
    except ConfigError:
        # a JSONL suite is recorded by its file's stem; its source names the path
        path = str(manifest["suite"].get("source", "")).split(" (sha256", 1)[0]
        if path.endswith(".jsonl") and Path(path).is_file():
            return get_suite(path)
        raise ConfigError(f"run {manifest['name']}: cannot find suite '{name}'; name it with --suite") from None


def feature_verifiers(runs: Sequence[RunData], *, include_costly: bool = False) -> list[VerifierRef]:
    """The verifiers whose scores are features: every eval verifier scored on every item at
    every tier of every run (same name and params everywhere), so the learned verifier computes
    them at serve time exactly as they were stored; and, pooling suites, every pure one (see
    `PURE`) scored on any of them, computed for the other suites' answers by `fill_scores`.

    Why not the sandboxed `code_tests` too: pooled with GSM8K, a linear model cannot tell a
    HumanEval answer passing its doctests from a GSM8K answer that is runnable Python without
    tests (both score well): pooling the committed GSM8K and HumanEval runs with it, the
    estimator's held-out AUROC fell below the best single verifier's on GSM8K in five of seven
    splits (it beat it on HumanEval in all seven). Train with ``--suite-specific`` to use it
    where the suite was scored with it."""
    per_run = []
    for r in runs:
        refs = {}
        for v in r.table.manifest.get("verifiers", []):
            label, name = v["label"], v["name"]
            if label in (LEARNED, PREROUTER) or name == "learned":
                continue
            if not include_costly and (name in COSTLY or label in r.costly):
                continue
            if all(label in t.scores for it in r.table.items for t in it.tiers):
                refs[label] = VerifierRef(label, name, dict(v["params"]))
        per_run.append(refs)
    common = {k: ref for k, ref in per_run[0].items() if all(refs.get(k) == ref for refs in per_run[1:])} if per_run else {}
    for refs in per_run:
        for k, ref in refs.items():
            same = all(other.get(k, ref) == ref for other in per_run)  # one label, one definition
            if ref.name in PURE and k not in common and same:
                common[k] = ref
    return [common[k] for k in sorted(common)]


def fill_scores(run: RunData, refs: Sequence[VerifierRef]) -> None:
    """Score the run's stored answers with the feature verifiers it lacks, as the learned
    verifier will at serve time (the same verifier code on the same request and answer); their
    time joins the stored verifiers' in the learned verifier's latency."""
    import asyncio
    import time
    from concurrent.futures import ThreadPoolExecutor

    from verifiers.base import Registry, VerifierContext

    missing = [ref for ref in refs if any(ref.label not in t.scores for it in run.table.items for t in it.tiers)]
    if not missing:
        return
    reg = Registry.from_entry_points()

    async def one(verifier: Any, it: Any, ti: int) -> tuple[float, float]:
        t0 = time.monotonic()
        score = await score_or_zero(verifier, run.requests[it.id], run.generations[(it.id, ti)])
        return score.value, time.monotonic() - t0

    async def score_all() -> dict[tuple[str, int], dict[str, tuple[float, float]]]:
        out: dict[tuple[str, int], dict[str, tuple[float, float]]] = {}
        for ref in missing:
            made = [reg.create(ref.name, dict(ref.params), VerifierContext(tier=t.name)) for t in run.table.tiers]
            for it in run.table.items:
                for ti, t in enumerate(it.tiers):
                    if ref.label not in t.scores:
                        out.setdefault((it.id, ti), {})[ref.label] = await one(made[ti], it, ti)
        return out

    with ThreadPoolExecutor(1) as pool:  # a loop of its own, whether or not the caller runs one
        computed = pool.submit(asyncio.run, score_all()).result()
    items = []
    for it in run.table.items:
        tiers = []
        for ti, t in enumerate(it.tiers):
            new = computed.get((it.id, ti), {})
            tiers.append(replace(
                t, scores={**t.scores, **{k: v for k, (v, _) in new.items()}},
                verify_cost_usd={**t.verify_cost_usd, **{k: 0.0 for k in new}},
                verify_s={**t.verify_s, **{k: round(sec, 4) for k, (_, sec) in new.items()}},
            ))
        items.append(replace(it, tiers=tuple(tiers)))
    run.table = replace(run.table, items=items)


# ---- fitting ----------------------------------------------------------------------------------------------


def _constant(mean: np.ndarray, scale: np.ndarray, y: np.ndarray, why: str) -> LinearModel:
    pos, n = int(y.sum()), len(y)
    return LinearModel(mean, scale, np.zeros(len(mean)), 0.0, 0.0, math.log((pos + 1) / (n - pos + 1)),
                       {"kind": "constant", "why": why, "rows": n, "positives": pos})


def _folds(y: np.ndarray, k: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import KFold, StratifiedKFold

    minority = int(min(y.sum(), len(y) - y.sum()))
    if minority >= k:
        return list(StratifiedKFold(k, shuffle=True, random_state=seed).split(np.zeros(len(y)), y))
    return list(KFold(k, shuffle=True, random_state=seed).split(np.zeros(len(y))))


def fit_model(x: np.ndarray, y: np.ndarray, n_dense: int, *, seed: int = 0) -> LinearModel:
    """Standardise the dense columns; choose, by `FOLDS`-fold cross-validated log-loss, the
    regularisation strength and how much the hashed prompt grams may weigh: as they are, scaled
    up (a gram's normalised count is small, so the penalty holds its weight down more than a
    standardised column's), or not at all (on a few hundred rows they may only add noise; the
    model then has zero weight there); fit Platt's map on the cross-validated logits; refit on
    all rows. With fewer than two rows of either outcome, the smoothed base rate."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    y = np.asarray(y, dtype=int)
    width = x.shape[1]
    mean = np.zeros(width)
    scale = np.ones(width)
    if len(y):
        mean[:n_dense] = x[:, :n_dense].mean(axis=0)
        sd = x[:, :n_dense].std(axis=0)
        scale[:n_dense] = np.where(sd > 1e-12, sd, 1.0)
    minority = int(min(y.sum(), len(y) - y.sum()))
    if minority < 2:
        return _constant(mean, scale, y, "fewer than two right or two wrong answers to learn from")
    k = min(FOLDS, minority)
    folds = _folds(y, k, seed)
    gains = (1.0,) if n_dense == width else GRAM_GAINS
    best: tuple[float, float, float, np.ndarray] | None = None
    for gain in gains:
        cols = width if gain > 0 else n_dense
        z = (x[:, :cols] - mean[:cols]) / _with_gain(scale, n_dense, gain)[:cols]
        for c in C_GRID:
            d = np.empty(len(y))
            for tr, te in folds:
                if y[tr].min() == y[tr].max():
                    d[te] = 0.0
                    continue
                clf = LogisticRegression(C=c, max_iter=_MAX_ITER).fit(z[tr], y[tr])
                d[te] = clf.decision_function(z[te])
            loss = float(log_loss(y, sigmoid(d), labels=[0, 1]))
            if best is None or loss < best[0] - 1e-12:
                best = (loss, c, gain, d)
    assert best is not None
    loss, c, gain, d = best
    platt = LogisticRegression(C=100.0, max_iter=_MAX_ITER).fit(d.reshape(-1, 1), y)
    a, b = float(platt.coef_[0, 0]), float(platt.intercept_[0])
    if a <= 0:  # the cross-validated logits rank no better than chance: claim nothing beyond the base rate
        return _constant(mean, scale, y, "cross-validated scores do not rank the answers")
    cols = width if gain > 0 else n_dense
    scale = _with_gain(scale, n_dense, gain)
    clf = LogisticRegression(C=c, max_iter=_MAX_ITER).fit((x[:, :cols] - mean[:cols]) / scale[:cols], y)
    coef = np.zeros(width)
    coef[:cols] = clf.coef_[0]
    return LinearModel(mean, scale, coef, float(clf.intercept_[0]), a, b,
                       {"kind": "logistic", "C": c, "gram_gain": gain, "cv_log_loss": round(loss, 6),
                        "rows": len(y), "positives": int(y.sum())})


def _with_gain(scale: np.ndarray, n_dense: int, gain: float) -> np.ndarray:
    """The scale with the gram columns divided by `gain` (so multiplied by it once standardised);
    a gain of 0 leaves them at 1: they are then dropped, with zero weight."""
    out = scale.copy()
    if gain > 0:
        out[n_dense:] = scale[n_dense:] / gain
    return out


def out_of_fold(x: np.ndarray, y: np.ndarray, n_dense: int, *, seed: int = 0) -> np.ndarray:
    """Each row's prediction by a model (fit as `fit_model` fits) that did not see it."""
    y = np.asarray(y, dtype=int)
    k = min(FOLDS, len(y))
    if k < 2:
        return np.full(len(y), 0.5)
    p = np.empty(len(y))
    for tr, te in _folds(y, k, seed):
        p[te] = fit_model(x[tr], y[tr], n_dense, seed=seed).probability(x[te])
    return p


# ---- one training -----------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    out: Path
    artifacts: list[dict[str, Any]]
    comparisons: list[Comparison]
    pooled: Comparison | None
    feature_verifiers: dict[str, list[str]]
    suite_specific: bool
    notes: list[str] = field(default_factory=list)
    splits: list[tuple[int, str, list[tuple[str, bool | None, str]]]] = field(default_factory=list)  # seed, suite, checks


def train(
    runs: Sequence[RunData], out: Path, *, seed: int = 0, fraction: float = 0.5, suite_specific: bool = False,
    include_costly: bool = False, n_buckets: int = 1024, target: Target = Target("min-pgr", 0.8),
    command: str = "", splits: int = 0,
) -> TrainResult:
    """Train, write the artifacts, predictions and report into `out`. With `splits`, also train
    and compare on that many other calibration splits (seeds seed+1, ...), into a scratch
    directory (artifacts and predictions only), and report how often each target is met: with a hundred held-out items a point of
    accuracy is one item, and one split alone says little."""
    if not runs:
        raise ConfigError("give at least one run")
    names = [t.name for t in runs[0].table.tiers]
    for r in runs[1:]:
        if [t.name for t in r.table.tiers] != names:
            raise ConfigError(f"runs {runs[0].name} and {r.name} have different tiers; pick the same with --tiers")
    import sklearn.linear_model  # noqa: F401 - load BLAS before limiting it: a later-loaded library is not limited
    from threadpoolctl import threadpool_limits

    import functools
    import tempfile

    fit = functools.partial(_train, runs, names, fraction=fraction, suite_specific=suite_specific,
                            include_costly=include_costly, n_buckets=n_buckets, target=target, command=command)
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
    runs: Sequence[RunData], names: list[str], out: Path, *, seed: int, fraction: float, suite_specific: bool,
    include_costly: bool, n_buckets: int, target: Target, command: str,
) -> TrainResult:
    out.mkdir(parents=True, exist_ok=True)
    groups = [[r] for r in runs] if suite_specific else [list(runs)]
    artifacts: list[dict[str, Any]] = []
    predictions: list[dict[str, Any]] = []
    members: dict[str, list[str]] = {}
    for group in groups:
        refs = feature_verifiers(group, include_costly=include_costly)
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
            xv_a = np.array([
                spec_v.vector(r.requests[it.id], r.generations[(it.id, ti)],
                              {ref.label: it.tiers[ti].scores[ref.label] for ref in refs})
                for r, it in rows
            ])
            y_a = np.array([it.tiers[ti].correct for _, it in rows], dtype=int)
            preds = {}
            for kind, x, spec in (("verifier", xv_a, spec_v), ("prerouter", xp_a, spec_p)):
                n_dense = len(spec.dense_names)
                model = fit_model(x[cal_a], y_a[cal_a], n_dense, seed=seed)
                models[kind][tier] = model
                p = np.empty(len(y_a))
                p[cal_a] = out_of_fold(x[cal_a], y_a[cal_a], n_dense, seed=seed)
                p[~cal_a] = model.probability(x[~cal_a])
                preds[kind] = p
            for j, (run, item) in enumerate(keys):
                predictions.append({"run": run, "item": item, "tier": tier,
                                    "split": "calibration" if cal_a[j] else "held-out",
                                    LEARNED: round(float(preds["verifier"][j]), 12),
                                    PREROUTER: round(float(preds["prerouter"][j]), 12)})
        trained_on = {
            "runs": [r.name for r in group], "suites": [r.table.suite for r in group], "seed": seed,
            "fraction": fraction, "rows_per_tier": sum(len(r.table.items) for r in group),
            "fit_on": "calibration split only",
        }
        for kind, spec, stem in (("verifier", spec_v, "learned"), ("prerouter", spec_p, "prerouter")):
            blob = dump_estimator(kind, spec, models[kind], trained_on)
            path = out / f"{stem}{suffix}.json"
            path.write_bytes(blob)
            sha = hashlib.sha256(blob).hexdigest()
            artifacts.append({"kind": kind, "group": group[0].table.suite if suite_specific else "pooled",
                              "file": path.name, "sha256": sha, "version": f"{kind}@{sha[:12]}",
                              "runs": [r.name for r in group], "tiers": names})
        for r in group:
            members[r.name] = [ref.label for ref in refs]
    manifest = {
        "format": 1, "seed": seed, "fraction": fraction, "suite_specific": suite_specific,
        "runs": [{"name": r.name, "suite": r.table.suite, "items": len(r.table.items)} for r in runs],
        "tiers": names, "feature_verifiers": members, "artifacts": artifacts, "target": str(target),
        "command": command,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    with open(out / PREDICTIONS, "w", encoding="utf-8") as f:
        for row in predictions:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    preds = load_predictions(out)
    tables = [attach(r.table, preds, seed=seed, fraction=fraction) for r in runs]
    comparisons = [compare(t, target, seed=seed, fraction=fraction) for t in tables]
    pooled_cmp = None
    notes = []
    if len(tables) > 1 and not suite_specific:
        pooled_cmp = compare(pooled(tables), target, seed=seed, fraction=fraction)
    elif len(tables) > 1:
        notes.append("Suite-specific estimators: the thresholds below are per suite; serve each with its suite's traffic.")
    return TrainResult(out, artifacts, comparisons, pooled_cmp, members, suite_specific, notes)


# ---- the training report ---------------------------------------------------------------------------------


def toml_snippet(result: TrainResult, cmp: Comparison) -> str:
    """The config for the tiers but the last: the learned verifier at its calibrated threshold,
    and the pre-router at the skip threshold calibrated in front of it."""
    group = "pooled" if not result.suite_specific else cmp.table.suite
    files = {a["kind"]: a for a in result.artifacts if a["group"] == group}
    ver, pre = files["verifier"], files["prerouter"]
    cal = cmp.verify_only[LEARNED]
    pv = cmp.preroute_verify[LEARNED]
    lines = [f"# learned estimators calibrated for {cmp.target} on {cal.n_calibration} calibration items of "
             f"{cmp.table.suite} (seed {cal.seed}); artifact paths are relative to the working directory"]
    for name, th in cal.thresholds.items():
        lines += [
            "[[tiers]]", f'name = "{name}"', f"threshold = {th:.6g}",
            "[[tiers.verifiers]]", 'name = "learned"',
            f'params = {{ artifact = "{(result.out / ver["file"]).as_posix()}", sha256 = "{ver["sha256"]}" }}',
            "[tiers.prerouter]", f'artifact = "{(result.out / pre["file"]).as_posix()}"', f'sha256 = "{pre["sha256"]}"',
            f"threshold = {pv.skip_below[name]:.6g}", "",
        ]
    return "\n".join(lines).rstrip() + "\n"


METHOD = [
    "## How they are made",
    "",
    "- **What they predict.** Per tier, the probability that the tier's answer is right (as the suite's grader "
    "judges it). The `learned` verifier reads what the cascade has once the tier has answered: the scores of the "
    "verifiers listed below, the answer's logprob statistics (mean, min, 10th and 25th percentile, spread, share "
    "of tokens below even odds), its length and whether it was cut off, the prompt's length and its hashed word "
    "uni- and bi-grams. The pre-router reads the prompt alone, before the tier generates. Token entropy is not a "
    "feature: the backends return only the sampled tokens' logprobs.",
    "- **The model.** A logistic regression per tier; 5-fold cross-validated log-loss chooses its "
    "regularisation and how much the prompt grams may weigh (or whether they are dropped); Platt scaling of the "
    "cross-validated logits calibrates it. The artifact is plain JSON, loaded only when its SHA-256 is the one "
    "the config names.",
    "- **Hygiene.** Items are split as `eval calibrate` splits them (seed and item id). The models are fit on "
    "the calibration items only. Thresholds are chosen on the calibration items too, from out-of-fold "
    "predictions: each calibration item is scored by a model fit (with its own inner cross-validation) on the "
    "other four fifths, never by one that saw it. Held-out items are scored once, by the final model (the one "
    "in the artifact), and every number below is on them.",
    "- **Policies.** *verify only*: the cascade with one verifier, thresholds calibrated for the target. "
    "*pre-route only*: skip a tier whose pre-router probability is below its threshold, else take its answer "
    "unverified. *pre-route then verify*: skip as the pre-router says, verify what runs; the verifier "
    "thresholds are the ones verify-only calibration chooses for the target, and the skip thresholds the "
    "cheapest whose calibration accuracy is at most 1 point below verify-only's (chosen one after the other, "
    "not as a pair: a joint search over thousands of pairs picks the luckiest). *verify only[learned], matched*: the learned cascade calibrated for "
    "`min-accuracy` at the accuracy the best single verifier's cascade reaches on the calibration items, so the "
    "two are compared at one accuracy level (a level taken from calibration items, not held-out ones). The cost "
    "target counts as met when any learned policy is cheaper than the best single verifier's at equal or "
    "better held-out accuracy.",
]


def write_report(result: TrainResult, *, command: str = "") -> None:
    lines = ["# Learned estimators: training report", ""]
    if command:
        lines += ["Regenerate:", "", "```", command, "```", ""]
    lines += [*METHOD, ""]
    lines += [
        "| artifact | version | sha256 |", "|---|---|---|",
        *(f"| `{a['file']}` | {a['version']} | `{a['sha256']}` |" for a in result.artifacts), "",
    ]
    lines += [f"- {n}" for n in result.notes]
    for a in (a for a in result.artifacts if a["kind"] == "verifier"):
        labels = sorted({lbl for r in a["runs"] for lbl in result.feature_verifiers[r]})
        lines += [f"Verifier scores read by `{a['file']}`: {', '.join(f'`{x}`' for x in labels) or 'none'}.", ""]
    for cmp in [*result.comparisons, *([result.pooled] if result.pooled else [])]:
        lines += [*comparison_markdown(cmp, level=2), ""]
        if result.pooled is None or cmp is result.pooled:  # a pooled estimator serves with the pooled thresholds
            lines += ["Config:", "", "```toml", toml_snippet(result, cmp).rstrip(), "```", ""]
    if result.splits:
        lines += splits_markdown(result)
    (result.out / "README.md").write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    (result.out / "training.json").write_text(json.dumps(
        {"artifacts": result.artifacts, "suites": [comparison_json(c) for c in result.comparisons],
         "pooled": comparison_json(result.pooled) if result.pooled else None,
         "other_splits": [{"seed": seed, "suite": suite, "checks": [{"target": w, "met": ok, "numbers": n} for w, ok, n in checks]}
                          for seed, suite, checks in result.splits]}, indent=1) + "\n", encoding="utf-8")


def splits_markdown(result: TrainResult) -> list[str]:
    """Each target on each other split: estimators retrained and thresholds recalibrated per split."""
    from evals.report import _md_table

    seeds = sorted({seed for seed, _, _ in result.splits})
    lines = ["## The same on other splits", "",
             f"Retrained and recalibrated on the calibration split of each seed ({', '.join(map(str, seeds))}), "
             "reported on its held-out items: how often each target is met.", ""]
    suites = list(dict.fromkeys(suite for _, suite, _ in result.splits))
    for suite in suites:
        rows: dict[str, dict[int, str]] = {}
        tally: dict[str, list[bool]] = {}
        for seed, s, checks in result.splits:
            if s != suite:
                continue
            for what, ok, numbers in checks:
                mark = "met" if ok else ("–" if ok is None else "**missed**")
                rows.setdefault(what, {})[seed] = f"{mark} ({numbers})"
                if ok is not None:
                    tally.setdefault(what, []).append(ok)
        header = ["target", *(f"seed {x}" for x in seeds), "met"]
        body = [[what, *(cells.get(x, "–") for x in seeds), f"{sum(tally.get(what, []))}/{len(tally.get(what, []))}"]
                for what, cells in rows.items()]
        lines += [f"### {suite}", "", *_md_table(header, body), ""]
    return lines


# ---- the command ------------------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    from evals.cli import _run_dir

    tiers = args.tiers.split(",") if args.tiers else None
    cache_dir = Path(args.cache_dir) if args.cache_dir else None
    runs = [load_run(_run_dir(args, r), suite=args.suite if len(args.run) == 1 else None, cache_dir=cache_dir, tiers=tiers)
            for r in args.run]
    command = _command(args)
    result = train(
        runs, Path(args.out), seed=args.seed, fraction=args.fraction, suite_specific=args.suite_specific,
        include_costly=args.with_costly_verifiers, n_buckets=args.buckets, target=Target.parse(args.target),
        command=command, splits=args.splits,
    )
    for a in result.artifacts:
        print(f"{result.out / a['file']}  {a['version']}  sha256 {a['sha256']}")
    for cmp in [*result.comparisons, *([result.pooled] if result.pooled else [])]:
        print(f"\n{cmp.table.suite}:")
        for what, ok, numbers in cmp.checks():
            print(f"  {'met   ' if ok else ('?     ' if ok is None else 'MISSED')} {what}: {numbers}")
    print(f"\nreport: {result.out / 'README.md'}")
    final = result.pooled or (result.comparisons[0] if len(result.comparisons) == 1 else None)
    if final is not None:
        print("\n# paste into config.toml (each [[tiers]] entry merges into the tier of that name):\n"
              + toml_snippet(result, final))
    return 0


def _command(args: argparse.Namespace) -> str:
    parts = ["tierroute", "eval", "train"]
    for r in args.run:
        parts += ["--run", r]
    parts += ["--runs-dir", args.runs_dir, "--out", args.out, "--target", args.target]
    parts += split_options(args)
    if args.suite_specific:
        parts.append("--suite-specific")
    if args.with_costly_verifiers:
        parts.append("--with-costly-verifiers")
    if args.buckets != 1024:
        parts += ["--buckets", str(args.buckets)]
    if args.splits:
        parts += ["--splits", str(args.splits)]
    return " ".join(shlex.quote(p) for p in parts)
