"""`tierroute report quality` with clients' labels: the labelled accuracy per tier, task and
threshold beside shadow agreement, with its Wilson interval and counts; the latest label of a
request decides; and the feedback drift alarm the service would have raised, replayed."""

from __future__ import annotations

import contextlib
import csv
import io
from dataclasses import replace
from pathlib import Path

import pytest

from router.cli import main as cli_main
from router.ledger.entries import Feedback
from router.ledger.store import SQLiteStore
from router.quality.live import wilson
from tests.support.ledger import attempt, entry


def run_cli(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(list(args)) == 0
    return out.getvalue()


def write(path: Path, n_right: int, n_wrong: int) -> None:
    """`n_right + n_wrong` answers of the small tier on maths, each labelled in time order (the
    first `n_right` right); one of the wrong ones was first labelled right and then corrected; a
    request to a named tier and one of another task are labelled too."""
    s = SQLiteStore(path)
    s.open()
    try:
        for i in range(n_right + n_wrong):
            s.write(replace(entry(f"r{i}", 1000.0 + i, attempts=(attempt(0, "small"),)), task="maths"))
            right = i < n_right
            if i == n_right:  # a thumbs-up, corrected: the latest label decides
                s.write_feedback(Feedback(f"fb-{i}-a", f"r{i}", 5000.0 + i, "alice", 1.0, label="thumbs_up"))
            s.write_feedback(Feedback(f"fb-{i}", f"r{i}", 5000.5 + i, "alice", 0.9 if right else 0.0))
        named = replace(entry("named", 1.0, attempts=(attempt(0, "small"),)), model="small")
        s.write(named)
        s.write_feedback(Feedback("fb-named", "named", 2.0, "alice", 0.0))
        s.write(replace(entry("other", 3.0, attempts=(attempt(0, "small"),)), task="code"))
        s.write_feedback(Feedback("fb-other", "other", 4.0, "alice", False))
    finally:
        s.close()


def test_labelled_accuracy_per_tier_task_and_threshold_with_its_interval(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    write(path, 7, 3)
    rows = {
        r["task"]: r for r in csv.DictReader(io.StringIO(run_cli("report", "quality", "--csv", "--ledger", str(path))))
    }
    maths = rows["maths"]
    assert (maths["tier"], maths["threshold"], maths["labelled"], maths["labelled_right"]) == (
        "small",
        "0.4",
        "10",
        "7",
    )
    low, high = wilson(7, 10)
    assert float(maths["label_accuracy"]) == pytest.approx(0.7)
    assert (float(maths["label_low"]), float(maths["label_high"])) == (
        pytest.approx(low, abs=1e-6),
        pytest.approx(high, abs=1e-6),
    )
    assert maths["pairs"] == "0" and maths["agreement"] == ""  # no shadow here: the proxy is empty, labels are not
    assert (rows["code"]["labelled"], rows["code"]["labelled_right"]) == ("1", "0")
    table = run_cli("report", "quality", "--ledger", str(path))
    assert "70.0%" in table and "13 labels" in table and "1 labelled requests passed no threshold" in table
    # a window: only the labels of the requests in it count, whenever they were posted
    rows = list(
        csv.DictReader(
            io.StringIO(run_cli("report", "quality", "--csv", "--ledger", str(path), "--since", "1970-01-01T00:16:45"))
        )
    )
    assert [(r["task"], r["labelled"]) for r in rows] == [("maths", "5")]  # r5..r9: 2 right, 3 wrong
    assert rows[0]["labelled_right"] == "2"


def test_a_falling_labelled_accuracy_raises_the_feedback_drift_alarm(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    write(path, 200, 40)  # 200 right learn the baseline; then every label says wrong
    table = run_cli("report", "quality", "--ledger", str(path))
    assert "drift: small/maths feedback fell" in table
    quiet = tmp_path / "quiet.sqlite3"
    write(quiet, 150, 40)  # fewer labelled requests than a baseline needs: nothing is watched yet
    assert "drift alarms: none" in run_cli("report", "quality", "--ledger", str(quiet))
