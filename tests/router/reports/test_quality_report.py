"""`tierroute report quality` over a ledger a degrading tier wrote: its figures, the drift alarm
the service raised, the CSV and the self-contained HTML page."""

from __future__ import annotations

import contextlib
import csv
import io
import random
from pathlib import Path

import pytest

from router.cli import main as cli_main
from router.ledger.store import SQLiteStore
from router.ledger.writer import Ledger
from tests.support.shadow import serve, service, settings


def run_cli(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(list(args)) == 0
    return out.getvalue()


@pytest.mark.slow
async def test_report_quality_shows_the_estimates_and_the_alarm(tmp_path: Path) -> None:
    s = settings(tmp_path, rate=0.5)
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(SQLiteStore(path))
    await ledger.open()
    rng = random.Random(11)
    degraded = False
    svc = service(s, lambda i: rng.random() >= (0.8 if degraded else 0.05), 12, ledger=ledger)
    await svc.start()
    try:
        await serve(svc, 500)
        degraded = True
        await serve(svc, 200, start=500)
    finally:
        await svc.close()
        await ledger.close()
    live = svc.tallies[("small", 0.5)]
    assert [(a.tier, a.signal) for a in svc.drift.alarms] == [("small", "agreement")]

    rows = list(csv.DictReader(io.StringIO(run_cli("report", "quality", "--csv", "--ledger", str(path)))))
    assert [(r["tier"], r["threshold"]) for r in rows] == [("small", "0.5")]
    row = rows[0]
    assert (int(row["tried"]), int(row["accepted"]), int(row["pairs"]), int(row["agreed"])) == (
        live.tried,
        live.accepted,
        live.pairs,
        live.agreed,
    )
    assert row["target"] == "large" and row["rules"].startswith("number:")
    assert (
        float(row["wilson_low"]) <= float(row["agreement"]) == float(row["est_accuracy"]) <= float(row["wilson_high"])
    )

    table = run_cli("report", "quality", "--ledger", str(path))
    assert "drift: small/maths agreement fell" in table and "proxy" in table

    page = tmp_path / "quality.html"
    run_cli("report", "quality", "--ledger", str(path), "--html", str(page))
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 2 and "drift: small/maths agreement fell" in text
    assert "http" not in text.replace("<!doctype html>", "")  # self-contained: nothing fetched


def test_report_quality_on_an_empty_ledger_says_so(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    SQLiteStore(path).open()
    assert run_cli("report", "quality", "--csv", "--ledger", str(path)).splitlines()[1:] == []
    assert "drift alarms: none" in run_cli("report", "quality", "--ledger", str(path))
