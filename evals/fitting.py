"""Fitting one estimator: a logistic regression chosen by cross-validated log-loss, Platt-calibrated.

Why so careful on so few rows: a few hundred calibration items per tier is all there is, so the
regularisation and the weight of the hashed prompt grams are chosen by cross-validation rather
than fixed, and a model whose cross-validated scores do not rank the answers falls back to the
base rate instead of claiming what it cannot know.
"""

from __future__ import annotations

import math

import numpy as np

from router.learned.estimators import LinearModel, sigmoid

C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
GRAM_GAINS = (1.0, 4.0, 0.0)  # how much the hashed prompt grams may weigh; 0 drops them
FOLDS = 5
_MAX_ITER = 5000


def _constant(mean: np.ndarray, scale: np.ndarray, y: np.ndarray, why: str) -> LinearModel:
    pos, n = int(y.sum()), len(y)
    return LinearModel(
        mean,
        scale,
        np.zeros(len(mean)),
        0.0,
        0.0,
        math.log((pos + 1) / (n - pos + 1)),
        {"kind": "constant", "why": why, "rows": n, "positives": pos},
    )


def _folds(y: np.ndarray, k: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import KFold, StratifiedKFold

    minority = int(min(y.sum(), len(y) - y.sum()))
    if minority >= k:
        return list(StratifiedKFold(k, shuffle=True, random_state=seed).split(np.zeros(len(y)), y))
    return list(KFold(k, shuffle=True, random_state=seed).split(np.zeros(len(y))))


def fit_model(x: np.ndarray, y: np.ndarray, n_dense: int, *, seed: int = 0) -> LinearModel:
    """`fit_with_out_of_fold`'s model."""
    return fit_with_out_of_fold(x, y, n_dense, seed=seed)[0]


def fit_with_out_of_fold(
    x: np.ndarray, y: np.ndarray, n_dense: int, *, seed: int = 0
) -> tuple[LinearModel, np.ndarray]:
    """Standardise the dense columns; choose, by `FOLDS`-fold cross-validated log-loss, the
    regularisation strength and how much the hashed prompt grams may weigh: as they are, scaled
    up (a gram's normalised count is small, so the penalty holds its weight down more than a
    standardised column's), or not at all (on a few hundred rows they may only add noise; the
    model then has zero weight there); fit Platt's map on the cross-validated logits; refit on
    all rows. With fewer than two rows of either outcome, the smoothed base rate.

    Beside the model, each row's out-of-fold probability: Platt's map of the cross-validated logit
    the chosen setting gave it (from a fit that did not see the row; the choice of setting and the
    map saw every row), what a threshold is calibrated on without a second round of fits (the
    base rate for every row where the model is the base rate)."""
    from sklearn.linear_model import LogisticRegression

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
        model = _constant(mean, scale, y, "fewer than two right or two wrong answers to learn from")
        return model, np.full(len(y), sigmoid(np.array([model.platt_b]))[0] if len(y) else 0.5)
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
                # decision_function's very arithmetic (the same matrix product), without its input checks
                d[te] = (z[te] @ clf.coef_.T + clf.intercept_).reshape(-1)
            loss = log_loss(y, sigmoid(d))
            if best is None or loss < best[0] - 1e-12:
                best = (loss, c, gain, d)
    assert best is not None
    loss, c, gain, d = best
    platt = LogisticRegression(C=100.0, max_iter=_MAX_ITER).fit(d.reshape(-1, 1), y)
    a, b = float(platt.coef_[0, 0]), float(platt.intercept_[0])
    if a <= 0:  # the cross-validated logits rank no better than chance: claim nothing beyond the base rate
        model = _constant(mean, scale, y, "cross-validated scores do not rank the answers")
        return model, np.full(len(y), sigmoid(np.array([model.platt_b]))[0])
    cols = width if gain > 0 else n_dense
    scale = _with_gain(scale, n_dense, gain)
    clf = LogisticRegression(C=c, max_iter=_MAX_ITER).fit((x[:, :cols] - mean[:cols]) / scale[:cols], y)
    coef = np.zeros(width)
    coef[:cols] = clf.coef_[0]
    model = LinearModel(
        mean,
        scale,
        coef,
        float(clf.intercept_[0]),
        a,
        b,
        {
            "kind": "logistic",
            "C": c,
            "gram_gain": gain,
            "cv_log_loss": round(loss, 6),
            "rows": len(y),
            "positives": int(y.sum()),
        },
    )
    return model, sigmoid(a * d + b)


def log_loss(y: np.ndarray, p: np.ndarray) -> float:
    """`sklearn.metrics.log_loss(y, p, labels=[0, 1])` for 0/1 labels and probabilities of a 1:
    the same array operations in the same order (its `xlogy` is `x * log(y)` where x is not 0),
    so the same float to the bit (a test holds them to it), without its input checks, which cost
    more than the sum itself on a few hundred rows and ran 400 times a training."""
    p2 = np.concatenate([1 - p[:, np.newaxis], p[:, np.newaxis]], axis=1)
    eps = np.finfo(p2.dtype).eps
    p2 = np.clip(p2, eps, 1 - eps)
    labels = np.stack([y == 0, y == 1], axis=1).astype(p2.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = labels * np.log(p2)
    terms = np.where(labels == 0.0, 0.0, terms)
    return float(np.average(-np.sum(terms, axis=1)))


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
