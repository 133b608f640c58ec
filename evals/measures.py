"""The measures the project speaks in, as pure functions of small arrays.

Definitions (each function's docstring gives its own):

- PGR, performance gap recovered (RouteLLM): (acc - acc_weak) / (acc_strong - acc_weak).
- APGR (RouteLLM): the area under the PGR curve plotted against the fraction of calls to the
  strong model, normalised by that fraction's range. A verifier that abstains escalates what it
  abstains on at every threshold, so its sweep starts above 0; the reports give `apgr_full`, the
  curve completed to the whole 0..1 range, so that every verifier is measured on the same range.
- CPT(x%) (RouteLLM): the smallest fraction of calls to the strong model at which PGR reaches x%.
- AIQ (RouterBench): the area under the router's non-decreasing convex hull in the (cost,
  quality) plane, divided by the cost range from the cheapest to the most expensive single model.
- AUROC: how well a verifier's score ranks right answers above wrong ones (scikit-learn).
- ECE, expected calibration error: the bin-weighted mean of |accuracy - mean score| over equal-width
  score bins, reading the score as a probability of being right.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation between order statistics), None when empty."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def cost_per_1k(costs_usd: Sequence[float]) -> float:
    """Mean cost of one request, times 1000."""
    return 1000.0 * float(np.mean(costs_usd)) if len(costs_usd) else 0.0


def savings(cost: float, top_cost: float) -> float | None:
    """The fraction saved against always using the top tier: 1 - cost / top_cost."""
    if top_cost <= 0:
        return None
    return 1.0 - cost / top_cost


def pgr(accuracy: float, weak: float, strong: float) -> float | None:
    """Performance gap recovered, (accuracy - weak) / (strong - weak); None when strong == weak."""
    if strong == weak:
        return None
    return (accuracy - weak) / (strong - weak)


def _curve(points: Sequence[tuple[float, float]]) -> np.ndarray:
    pts = np.asarray(points, dtype=float).reshape(-1, 2)
    order = np.lexsort((pts[:, 1], pts[:, 0]))  # by x, then y: a vertical step is climbed upwards
    return pts[order]


def apgr(points: Sequence[tuple[float, float]], weak: float, strong: float) -> float | None:
    """Average performance gap recovered (RouteLLM).

    `points` are (fraction of calls to the strong model in [0, 1], accuracy) for each setting of
    the router. With PGR(x) the performance gap recovered at x, APGR is the trapezoidal area under
    PGR over x, divided by the range of x the points span; for a curve from 0 to 1 that is
    the plain area, so always-weak-then-always-strong in a straight line scores 0.5 (the random
    router) and a router that recovers the whole gap at once scores close to 1.
    """
    if strong == weak or len(points) < 2:
        return None
    pts = _curve(points)
    x, acc = pts[:, 0], pts[:, 1]
    span = x[-1] - x[0]
    if span <= 0:
        return None
    gap = (acc - weak) / (strong - weak)
    return float(np.trapezoid(gap, x) / span)


def apgr_full(points: Sequence[tuple[float, float]], weak: float, strong: float) -> float | None:
    """APGR over the whole range of calls to the strong model, 0 to 1, for any router's points.

    Every cascade can also accept every first answer (x = 0 at the weak model's accuracy) and
    escalate every answer (x = 1 at the strong model's), and any point on a straight line between
    two of its settings is reached by choosing between them at random per request. So a curve that
    starts above 0 (a verifier that abstains escalates those answers even at threshold 0) is
    completed by those two points, and its area over 0..1 is what it recovers against any other
    router: unlike `apgr`, a router is not flattered by covering only the range where it is good.
    For a sweep that already spans 0 to 1 the two are equal."""
    if strong == weak or not points:
        return None
    return apgr([*points, (0.0, weak), (1.0, strong)], weak, strong)


def cpt(points: Sequence[tuple[float, float]], weak: float, strong: float, target: float) -> float | None:
    """Call-performance threshold CPT(target) (RouteLLM): the smallest fraction of calls to the
    strong model at which the router reaches PGR >= target, reading the curve as straight
    segments between its points (sorted by x); None when it never does. `target` is a fraction:
    CPT(50%) is `cpt(..., 0.5)`.
    """
    if strong == weak or not points:
        return None
    pts = _curve(points)
    gap = (pts[:, 1] - weak) / (strong - weak)
    if gap[0] >= target:
        return float(pts[0, 0])
    left = zip(pts[:-1, 0], gap[:-1], strict=True)
    right = zip(pts[1:, 0], gap[1:], strict=True)
    for (x0, g0), (x1, g1) in zip(left, right, strict=True):
        if g0 < target <= g1:
            return float(x0 + (target - g0) / (g1 - g0) * (x1 - x0))
    return None


def nondecreasing_hull(points: Sequence[tuple[float, float]]) -> np.ndarray:
    """The router's non-decreasing convex hull (RouterBench): at each cost c, the best quality
    reachable by mixing router settings (choosing between two at random per request) whose mean
    cost is at most c. It is the upper concave envelope of the points, from the cheapest point up
    to the best one, then flat. Returned as its vertices (cost, quality), sorted by cost."""
    pts = _curve(points)
    # the best quality at each cost, then the upper hull (Andrew's monotone chain, upper half)
    best: dict[float, float] = {}
    for c, q in pts:
        best[c] = max(q, best.get(c, -np.inf))
    hull: list[tuple[float, float]] = []
    for c, q in sorted(best.items()):
        while len(hull) >= 2:
            (c1, q1), (c2, q2) = hull[-2], hull[-1]
            if (q2 - q1) * (c - c1) <= (q - q1) * (c2 - c1):  # hull[-1] lies on or under the chord
                hull.pop()
            else:
                break
        hull.append((c, q))
    peak = int(np.argmax([q for _, q in hull]))
    return np.asarray(hull[: peak + 1], dtype=float)


def aiq(points: Sequence[tuple[float, float]], c_min: float, c_max: float) -> float | None:
    """Average improvement in quality (RouterBench): (1 / (c_max - c_min)) times the integral from
    c_min to c_max of the router's non-decreasing convex hull, where c_min and c_max are the costs
    of the cheapest and the most expensive single model. Below the router's cheapest setting no
    quality is reachable (0); beyond its best one the hull stays flat."""
    if c_max <= c_min or not points:
        return None
    hull = nondecreasing_hull(points)
    grid = np.unique(np.concatenate([[c_min, c_max], hull[:, 0]]))
    grid = grid[(grid >= c_min) & (grid <= c_max)]

    def value(c: np.ndarray) -> np.ndarray:
        out = np.interp(c, hull[:, 0], hull[:, 1])  # flat beyond the last vertex
        return np.where(c < hull[0, 0], 0.0, out)

    # the hull is piecewise linear with a jump at its first vertex: integrate exactly per piece
    area = 0.0
    for a, b in zip(grid[:-1], grid[1:], strict=True):
        if b <= hull[0, 0]:
            continue
        a2 = max(a, hull[0, 0])
        area += (b - a2) * (value(np.array([a2]))[0] + value(np.array([b]))[0]) / 2
    return float(area / (c_max - c_min))


def auroc(correct: Sequence[bool], scores: Sequence[float]) -> float | None:
    """Area under the ROC curve of `scores` predicting `correct` (scikit-learn); None with only
    one class present."""
    y = np.asarray(correct, dtype=int)
    if len(y) == 0 or y.min() == y.max():
        return None
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, np.asarray(scores, dtype=float)))


def ece(correct: Sequence[bool], scores: Sequence[float], n_bins: int = 10) -> float | None:
    """Expected calibration error: sum over `n_bins` equal-width bins of [0, 1] of
    (items in bin / items) * |fraction correct in bin - mean score in bin|. A score of exactly 1
    falls in the last bin."""
    y = np.asarray(correct, dtype=float)
    p = np.asarray(scores, dtype=float)
    if len(y) == 0:
        return None
    bins = np.minimum((p * n_bins).astype(int), n_bins - 1)
    total = 0.0
    for b in range(n_bins):
        mask = bins == b
        if mask.any():
            total += mask.sum() / len(y) * abs(y[mask].mean() - p[mask].mean())
    return float(total)


def brier(correct: Sequence[bool], scores: Sequence[float]) -> float | None:
    """Mean squared gap between score and outcome (scikit-learn's Brier score)."""
    if len(correct) == 0:
        return None
    from sklearn.metrics import brier_score_loss

    return float(brier_score_loss(np.asarray(correct, dtype=int), np.asarray(scores, dtype=float), pos_label=1))


def reliability(correct: Sequence[bool], scores: Sequence[float], n_bins: int = 10) -> tuple[list[float], list[float]]:
    """Points of the reliability diagram (mean score, fraction correct) per non-empty bin,
    from scikit-learn's `calibration_curve`."""
    y = np.asarray(correct, dtype=int)
    if len(y) == 0 or y.min() == y.max():
        return [], []
    from sklearn.calibration import calibration_curve

    frac, mean = calibration_curve(y, np.asarray(scores, dtype=float), n_bins=n_bins, strategy="uniform")
    return [float(v) for v in mean], [float(v) for v in frac]
