"""Reports: built from stored results alone, complete, self-contained, and reproducible."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.calibrate import Target
from evals.report.pages import write
from evals.report.suite import build
from evals.store import RunStore
from evals.sweep import load_table
from router.cli import main
from router.config import load_settings
from tests.support.evals import make_run, write_config


@pytest.mark.slow
async def test_report_files(tmp_path: Path) -> None:
    root = await make_run(tmp_path)
    report = build(load_table(RunStore(root)), Target.parse("min-pgr=0.5"))
    assert report.best in ("config", "keyword", "length")
    assert report.calibrations and report.best_auroc_held_out is not None
    out = tmp_path / "report"
    written = write([report], out, command="tierroute eval report sums")
    names = {p.name for p in written}
    assert {
        "README.md",
        "report.html",
        "sweep.csv",
        "summary.csv",
        "sums-accuracy-cost.png",
        "sums-escalation-threshold.png",
        "sums-latency.png",
        "sums-reliability.png",
    } <= names
    md = (out / "README.md").read_text()
    for phrase in (
        "## sums",
        "### Tiers",
        "Best verifier",
        "held-out",
        "AUROC",
        "APGR",
        "CPT(80%)",
        "AIQ",
        "oracle",
        "random escalation",
        "$3.6/hour",
        "per 1M input / output tokens",
    ):
        assert phrase in md, phrase
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    assert "src='http" not in page and 'src="http' not in page and "<script" not in page
    assert "calibrated" in (out / "sweep.csv").read_text()


@pytest.mark.slow
async def test_report_cli_is_reproducible(tmp_path: Path) -> None:
    root = await make_run(tmp_path)
    out = tmp_path / "out"
    args = ["eval", "report", str(root), "--out", str(out), "--target", "max-escalation=0.5"]
    assert main(args) == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(args) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first


async def test_sweep_and_calibrate_cli(tmp_path: Path, capsys) -> None:
    root = await make_run(tmp_path)
    assert main(["eval", "sweep", str(root), "--verifier", "keyword"]) == 0
    assert "APGR" in capsys.readouterr().out
    config = write_config(tmp_path)
    before = load_settings(config).tier("small")
    assert main(["--config", str(config), "eval", "calibrate", "--run", str(root), "--target", "min-pgr=0.5"]) == 0
    out = capsys.readouterr().out
    assert "held-out" in out and '[[tiers]]\nname = "small"\n[tiers.tasks.open_ended]\nthreshold = ' in out
    # the config's small tier thresholds 'keyword' alone, so a threshold on it can be written
    assert (
        main(
            [
                "--config",
                str(config),
                "eval",
                "calibrate",
                "--run",
                str(root),
                "--target",
                "min-pgr=0.5",
                "--verifier",
                "keyword",
                "--write",
            ]
        )
        == 0
    )
    assert "wrote thresholds" in capsys.readouterr().out
    # into the policy of the suite's task (a JSONL suite of free text: open-ended); the tier's own stays
    written = load_settings(config).tier("small")
    assert written.tasks["open_ended"].threshold is not None
    assert written.threshold == before.threshold
    # --tier-threshold: the tier's own threshold, as before tasks existed
    args = ["--config", str(config), "eval", "calibrate", "--run", str(root), "--target", "min-pgr=0.5"]
    assert main([*args, "--verifier", "keyword", "--write", "--tier-threshold"]) == 0
    assert "the tiers' own threshold" in capsys.readouterr().out
    assert load_settings(config).tier("small").threshold == written.tasks["open_ended"].threshold
    # 'length' is not what the tier is configured with: refused, with the TOML to paste
    assert (
        main(
            [
                "--config",
                str(config),
                "eval",
                "calibrate",
                "--run",
                str(root),
                "--target",
                "min-pgr=0.5",
                "--verifier",
                "length",
                "--write",
            ]
        )
        == 1
    )
