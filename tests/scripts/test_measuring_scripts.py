"""The measuring scripts behind two figures in the docs: `telemetry_overhead.spans_alone_us` (a
request's spans timed alone, docs/telemetry.md) and `suite_timeline` (where the suite's time goes,
docs/testing.md) give numbers from what they record, and leave nothing installed behind them."""

from __future__ import annotations

from router.telemetry import spans
from scripts.suite_timeline import summary
from scripts.telemetry_overhead import spans_alone_us


def test_spans_alone_are_timed_and_no_tracer_is_left_installed() -> None:
    assert not spans.active()
    assert spans_alone_us(n=200) > 0
    assert not spans.active()


def test_the_timeline_summary_adds_up_per_worker_and_names_the_gaps() -> None:
    rows = [
        {"id": "tests/a.py::t1", "worker": "gw0", "start": 0.0, "end": 4.0, "cpu": 3.0},
        {"id": "tests/a.py::t2", "worker": "gw0", "start": 7.0, "end": 8.0, "cpu": 1.0},
        {"id": "tests/b.py::t1", "worker": "gw1", "start": 0.0, "end": 8.0, "cpu": 0.5, "children_cpu": 6.0},
    ]
    text = summary(rows)
    assert text.splitlines()[0] == "3 tests over 8 s"
    assert "gw0: 2 tests, 0-8 s, busy 5 s, CPU 4 s, gaps over 2 s: [3.0]" in text
    assert "gw1: 1 tests, 0-8 s, busy 8 s, CPU 0 s, gaps over 2 s: none" in text
    assert text.index("tests/b.py") < text.index("tests/a.py")  # the most time first
    # a server it started and stopped: its CPU is the file's, by the children's column
    assert "in their children 6 s" in text
    assert "     8.0 s busy    0.5 s CPU    6.0 s children  tests/b.py" in text
