"""The Evals page: a written eval report's cost-quality curves, per suite and verifier.

`tierroute eval report` writes `sweep.csv` beside its Markdown (the committed one is docs/eval):
one row per policy and threshold, with its accuracy and cost per 1k requests. This module reads
that file as it is and groups it for the page; it computes nothing. Kinds: `cascade` (a verifier
swept over thresholds: the curve), `tiers` (each tier alone), `oracle`, `random` (escalation at
random, the baseline every curve should beat) and `calibrated TARGET` (the thresholds the report
calibrated on the calibration split, reported on held-out items: the point marked on its curve).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from router.errors import NotFoundError, RequestError

SWEEP = "sweep.csv"


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _point(row: dict[str, str]) -> dict[str, Any]:
    return {
        "threshold": row["param"],
        "accuracy": _number(row["accuracy"]),
        "cost_per_1k": _number(row["cost_per_1k"]),
        "escalation_rate": _number(row["escalation_rate"]),
        "n": _number(row["n"]),
    }


def suites(report: Path) -> list[str]:
    return sorted({row["suite"] for row in _rows(report)})


def _rows(report: Path) -> list[dict[str, str]]:
    path = report / SWEEP
    try:
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except OSError as exc:
        raise RequestError(
            f"dashboard.eval_report: cannot read {path}: {exc.strerror}", code="no_eval_report"
        ) from None


def curves(report: Path, suite: str | None) -> dict[str, Any]:
    """One suite's curves (the first suite when none is named): per verifier its threshold sweep
    over all items, and its calibrated point on held-out items; the tiers, the oracle and random
    escalation beside them."""
    rows = _rows(report)
    names = sorted({r["suite"] for r in rows})
    if not names:
        raise RequestError(f"dashboard.eval_report: {report / SWEEP} has no rows", code="no_eval_report")
    chosen = suite if suite is not None else names[0]
    if chosen not in names:
        raise NotFoundError(f"no suite {chosen[:100]!r} in the eval report; it has {names}", param="suite")
    verifiers: dict[str, dict[str, Any]] = {}
    tiers, oracle, random = [], [], []
    for r in rows:
        if r["suite"] != chosen:
            continue
        kind = r["kind"]
        if kind == "cascade" and r["split"] == "all":
            verifiers.setdefault(r["verifier"], {"curve": [], "calibrated": []})["curve"].append(_point(r))
        elif kind.startswith("calibrated"):
            found = verifiers.setdefault(r["verifier"], {"curve": [], "calibrated": []})
            found["calibrated"].append({**_point(r), "target": kind.removeprefix("calibrated").strip()})
        elif kind == "tiers":
            tiers.append({**_point(r), "tier": r["policy"]})
        elif kind == "oracle":
            oracle.append(_point(r))
        elif kind == "random":
            random.append(_point(r))
    for found in verifiers.values():
        found["curve"].sort(key=lambda p: (p["cost_per_1k"] is None, p["cost_per_1k"]))
    return {
        "report": report.name,
        "suites": names,
        "suite": chosen,
        "verifiers": [{"verifier": name, **found} for name, found in sorted(verifiers.items())],
        "tiers": tiers,
        "oracle": oracle,
        "random": sorted(random, key=lambda p: (p["cost_per_1k"] is None, p["cost_per_1k"])),
    }
