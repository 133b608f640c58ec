"""scripts/spec_cascade_eval.py: the committed report is what the script writes from the committed
runs, and its building blocks (run names, the kept share, the dominance test) say what they mean."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.spec_cascade_eval import RUN_NAME, Point, dominated_by_curve, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_committed_report_is_reproduced(tmp_path: Path) -> None:
    committed = ROOT / "docs" / "eval" / "spec-cascade.md"
    if not committed.exists():
        pytest.skip("no speculative cascade report committed yet")
    assert main(["--results", str(ROOT / "evals" / "results"), "--out", str(tmp_path), "--no-figures"]) == 0
    assert (tmp_path / "spec-cascade.md").read_text() == committed.read_text()


def test_run_names_give_rule_and_margin() -> None:
    m = RUN_NAME.match("gsm8k-speccascade-diff-0.2")
    assert m is not None and (m["suite"], m["rule"], m["margin"]) == ("gsm8k", "diff", "0.2")
    m = RUN_NAME.match("humaneval-speccascade-opt--0.5")
    assert m is not None and (m["rule"], float(m["margin"])) == ("opt", -0.5)
    off = RUN_NAME.match("gsm8k-speccascade-off")
    assert off is not None and off["rule"] is None
    assert RUN_NAME.match("gsm8k-speccascade-median-0.2") is None


def _p(accuracy: float, cost: float, busy: float) -> Point:
    return Point("x", 10, accuracy, cost, busy, 1.0)


def test_a_point_is_dominated_only_by_a_setting_as_accurate_and_no_dearer() -> None:
    curve = [_p(0.5, 1.0, 10.0), _p(0.7, 2.0, 20.0)]
    assert dominated_by_curve(_p(0.6, 2.0, 30.0), curve, "cost_per_1k")  # 0.7 for 2.0
    assert not dominated_by_curve(_p(0.6, 1.5, 15.0), curve, "cost_per_1k")
    assert not dominated_by_curve(_p(0.8, 5.0, 50.0), curve, "busy_s")  # more accurate than any
    assert dominated_by_curve(_p(0.5, 1.0, 10.0), curve, "busy_s")  # a tie counts
