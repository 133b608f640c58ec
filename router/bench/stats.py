"""Percentiles and millisecond distributions, as every bench mode reports them.

Percentiles interpolate linearly between closest ranks, numpy's default method, so a figure here
can be checked against numpy on the JSON's per-request rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (q in [0, 100]) by linear interpolation between closest ranks, numpy's
    default method; None when there are no values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside [0, 100]")
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def distribution_ms(seconds: Sequence[float]) -> dict[str, float | int | None]:
    ms = [s * 1000.0 for s in seconds]
    return {
        "n": len(ms),
        "p50": rounded(percentile(ms, 50)),
        "p95": rounded(percentile(ms, 95)),
        "p99": rounded(percentile(ms, 99)),
        "mean": rounded(math.fsum(ms) / len(ms)) if ms else None,
        "max": rounded(max(ms)) if ms else None,
    }


def rounded(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)
