"""Every eval figure the README and docs/eval-results.md quote is the committed report's.

The report (`docs/eval/README.md`, `summary.csv`, `sweep.csv`) is itself held to what its command
gives from the committed per-item runs (tests/evals/test_breakeven.py), so a quoted figure that
differs from it is stale. Each quoted cell is read as a list of figures, in order, each compared
with the report's at the precision the cell writes it; a verifier named as the best must be the
report's pick. Cheap: it reads text files, no model and no report build.
"""

from __future__ import annotations

import csv
import math
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from evals import measures

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "docs" / "eval"
FIGURE = re.compile(r"\$(\d+(?:\.\d+)?)|(\d+(?:\.\d+)?)%|(?<![\w.$])(\d\.\d{3})(?![\d%])")


def _tables(section: str) -> dict[str, list[dict[str, str]]]:
    """The Markdown tables of one report section, by the heading above each."""
    out: dict[str, list[dict[str, str]]] = {}
    heading = ""
    lines = section.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(header, (c.strip() for c in lines[i].strip("|").split("|")), strict=False)))
                i += 1
            out.setdefault(heading, rows)
            continue
        i += 1
    return out


class Suite:
    """One suite's figures as the committed report states them."""

    def __init__(self, name: str, section: str) -> None:
        self.name = name
        self.section = section
        tables = _tables(section)
        self.tiers = {r["tier"]: r for r in next(v for k, v in tables.items() if k == "Tiers")}
        calibrated = next(v for k, v in tables.items() if k.startswith("Calibrated cascade"))
        self.calibrated = {r["verifier"].replace(" **(best)**", ""): r for r in calibrated}
        learned = next((v for k, v in tables.items() if k == "Held-out quality"), [])
        self.learned = {r["estimator / verifier"]: r for r in learned}
        best = re.search(
            r"Best verifier \(by AUROC on the calibration split\): \*\*(.+?)\*\*.*?\*\*([\d.]+) on held-out", section
        )
        assert best is not None, name
        self.best, self.best_held_out = best.group(1), float(best.group(2))

    def tier(self, name: str, column: str) -> str:
        return self.tiers[name][column]

    def held_out(self, verifier: str, column: str) -> str:
        return self.calibrated[verifier][column]


def _suites() -> dict[str, Suite]:
    text = (REPORT / "README.md").read_text(encoding="utf-8")
    parts = re.split(r"\n## (\w+)\n", text)
    return {parts[i]: Suite(parts[i], parts[i + 1]) for i in range(1, len(parts), 2)}


SUITES = _suites()
ACC, COST = "accuracy", "cost / 1k requests"
H_ACC, H_COST, H_ESC = "accuracy (held-out)", "cost / 1k (held-out)", "escalation (held-out)"


def _value(text: str) -> float:
    return float(text.replace("$", "").replace("%", "").replace(",", ""))


def _figures(cell: str) -> list[tuple[str, int]]:
    """The figures a cell states, in order: (digits, decimals written)."""
    out = []
    for m in FIGURE.finditer(cell):
        digits = next(g for g in m.groups() if g is not None)
        out.append((digits, len(digits.split(".")[1]) if "." in digits else 0))
    return out


def _check(cell: str, expected: list[str], where: str) -> None:
    stated = _figures(cell)
    assert len(stated) == len(expected), (
        f"{where}: {cell!r} states {len(stated)} figures, the check knows {len(expected)}"
    )
    for (digits, decimals), report in zip(stated, expected, strict=True):
        want = round(_value(report), decimals)
        assert math.isclose(float(digits), want, abs_tol=10 ** -(decimals + 3)), (
            f"{where}: {digits} in {cell!r}, the report says {report}"
        )


def _row(path: Path, first_cell: str) -> list[str]:
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"{path.name}: no row {first_cell!r}")


def _tiers(s: Suite) -> list[str]:
    return [s.tier("small", ACC), s.tier("small", COST), s.tier("large", ACC), s.tier("large", COST)]


def _cal(s: Suite, verifier: str, *columns: str) -> list[str]:
    return [s.held_out(verifier, c) for c in columns]


def _always(s: Suite) -> list[str]:
    return _cal(s, "*always large*", H_ACC, H_COST)


CONFIDENCE = 'confidence[stat="mean"]'
CROSS_TIER = 'cross_tier[tier="large"]'

# README headline rows: the first cell, and the report's figures in the order the result cell states them
HEADLINE: dict[str, tuple[str, Callable[[Suite], list[str]]]] = {
    "GSM8K, 200 items": ("gsm8k", lambda s: [*_tiers(s), *_cal(s, "config", H_ACC, H_COST), *_always(s)]),
    "HumanEval, 164 items": (
        "humaneval",
        lambda s: [*_tiers(s), *_cal(s, "config", H_ACC, H_COST, H_ESC), *_always(s)],
    ),
    "MMLU, 500 items": (
        "mmlu",
        lambda s: [*_tiers(s), *_cal(s, "config", H_ACC, H_COST), *_cal(s, CROSS_TIER, H_ACC, H_COST), *_always(s)],
    ),
    "Structured, 60 items": ("structured", lambda s: [*_tiers(s), *_cal(s, "config", H_ACC, H_COST), *_always(s)]),
}

# docs/eval-results.md's first table: the config's policy column
POLICY: dict[str, tuple[str, Callable[[Suite], list[str]]]] = {
    "GSM8K, 200 items": ("gsm8k", lambda s: [*_cal(s, "config", H_ACC, H_COST), *_always(s)]),
    "HumanEval, 164 items": (
        "humaneval",
        lambda s: [*_cal(s, "config", H_ACC, H_COST, H_ESC), *_cal(s, "code_tests", H_ACC, H_COST), *_always(s)],
    ),
    "MMLU, 500 items": (
        "mmlu",
        lambda s: [
            *_cal(s, "config", H_ACC, H_COST),
            *_cal(s, "learned", H_ACC, H_COST),
            *_cal(s, CROSS_TIER, H_ACC, H_COST),
            *_always(s),
        ],
    ),
    "structured, 60 items": (
        "structured",
        lambda s: [*_cal(s, "config", H_ACC, H_COST), *_cal(s, "confidence_min", H_ACC, H_COST), *_always(s)],
    ),
}


@pytest.mark.parametrize("label", list(HEADLINE))
def test_readme_headline_cells_are_the_reports(label: str) -> None:
    suite, figures = HEADLINE[label]
    s = SUITES[suite]
    cells = _row(ROOT / "README.md", label)
    _check(cells[1], figures(s), f"README {label}")
    if "nothing escalated" in cells[1]:
        assert _value(s.held_out("config", H_ESC)) == 0, label


@pytest.mark.parametrize("label", list(POLICY))
def test_eval_results_summary_cells_are_the_reports(label: str) -> None:
    suite, figures = POLICY[label]
    s = SUITES[suite]
    cells = _row(ROOT / "docs" / "eval-results.md", label)
    small, large, best, learned, policy = cells[1:6]
    _check(small, [s.tier("small", ACC), s.tier("small", COST)], f"{label} small")
    _check(large, [s.tier("large", ACC), s.tier("large", COST)], f"{label} large")
    # the best single verifier is the report's pick (by AUROC on the calibration half), at its held-out AUROC
    assert best.startswith(f"`{s.best}` "), f"{label}: {best!r}, the report picks {s.best}"
    _check(best.removeprefix(f"`{s.best}` "), [f"{s.best_held_out:.3f}"], f"{label} best")
    _check(learned, [s.learned["learned"]["AUROC (small)"]], f"{label} learned")
    _check(policy, figures(s), f"{label} policy")


def _summary() -> dict[tuple[str, str], dict[str, str]]:
    with open(REPORT / "summary.csv", encoding="utf-8") as f:
        return {(r["suite"], r["verifier"]): r for r in csv.DictReader(f) if r["tier"] == "small"}


# docs/eval-results.md's whole-sweep table: rows read straight from summary.csv (AUROC small, APGR)
WHOLE_SWEEP = {
    ("GSM8K", "`confidence` mean (the config's)"): ("gsm8k", CONFIDENCE),
    ("GSM8K", "`confidence` min"): ("gsm8k", "confidence_min"),
    ("GSM8K", "`cross_tier` mean (large reads the small answer)"): ("gsm8k", CROSS_TIER),
    ("GSM8K", "`cross_tier` min"): ("gsm8k", "cross_tier_min"),
    ("GSM8K", "`self_consistency` (k=3)"): ("gsm8k", "self_consistency[k=3]"),
    ("MMLU", "`confidence` mean (the config's)"): ("mmlu", CONFIDENCE),
    ("MMLU", "`cross_tier` mean"): ("mmlu", CROSS_TIER),
    ("HumanEval", "`code_tests` now"): ("humaneval", "code_tests"),
    ("HumanEval", "the config's `min(code_tests, degeneration)`"): ("humaneval", "config"),
}


@pytest.mark.parametrize("label", list(WHOLE_SWEEP))
def test_whole_sweep_rows_are_summary_csv(label: tuple[str, str]) -> None:
    suite, verifier = WHOLE_SWEEP[label]
    row = _summary()[(suite, verifier)]
    for line in (ROOT / "docs" / "eval-results.md").read_text(encoding="utf-8").splitlines():
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(parts) > 3 and (parts[0], parts[1]) == label:
            _check(parts[2], [row["auroc"]], f"{label} AUROC")
            _check(parts[3], [row["apgr"]], f"{label} APGR")
            return
    raise AssertionError(f"no whole-sweep row {label!r}")


def test_summary_apgr_is_over_the_whole_range_for_every_verifier() -> None:
    """summary.csv's APGR is the sweep completed to x = 0..1 (`measures.apgr_full`), so a verifier
    that abstains (its sweep starts above 0) is not flattered; the covered range is its own column."""
    curves: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    tiers: dict[tuple[str, str], float] = {}
    with open(REPORT / "sweep.csv", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["kind"] == "cascade" and r["split"] == "all":
                curves[(r["suite"], r["verifier"])].append((float(r["top_rate"]), float(r["accuracy"])))
            elif r["kind"] == "tiers":
                tiers[(r["suite"], r["policy"])] = float(r["accuracy"])
    summary = _summary()
    abstaining = 0
    for (suite, verifier), row in summary.items():
        weak, strong = tiers[(suite, "small")], tiers[(suite, "large")]
        points = curves[(suite, verifier)]
        assert points, (suite, verifier)
        whole = measures.apgr_full(points, weak, strong)
        assert whole is not None and math.isclose(float(row["apgr"]), whole, rel_tol=1e-5), (
            suite,
            verifier,
            row["apgr"],
            whole,
        )
        start = float(row["covered_from"])
        assert math.isclose(start, min(x for x, _ in points), abs_tol=1e-6)
        if start > 0:
            abstaining += 1
            if row["apgr_covered"]:  # empty where the sweep is one point: it abstains on every answer
                assert float(row["apgr_covered"]) > float(row["apgr"]) - 1e-9, (suite, verifier)
    assert abstaining >= 2  # execution on GSM8K and HumanEval, execution_pot on GSM8K
