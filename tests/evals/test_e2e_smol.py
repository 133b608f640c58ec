"""`tierroute eval run` end to end on the real SmolLM2-135M (both tiers), a handful of items,
with the built-in verifiers; then a rerun that is all cache, and a report."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from evals.store import RunStore
from router.cli import main
from tests.support.config import smol_config

pytestmark = pytest.mark.slow


def test_eval_run_on_smollm2(tmp_path: Path, smol_path: Path, capsys) -> None:
    suite = tmp_path / "tiny.jsonl"
    rows = [
        {
            "id": f"t{i}",
            "prompt": f"What is {a} plus {b}? Answer with the number only.",
            "reference": a + b,
            "grader": "numeric",
        }
        for i, (a, b) in enumerate([(2, 3), (10, 5), (7, 1)])
    ]
    suite.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = smol_config(tmp_path, verifiers='[[tiers.verifiers]]\nname = "confidence"')
    runs = tmp_path / "runs"
    args = [
        "--config",
        str(config),
        "eval",
        "run",
        "--suite",
        str(suite),
        "--runs-dir",
        str(runs),
        "--verifier",
        "math_answer",
    ]
    assert main(args) == 0
    store = RunStore(runs / "tiny")
    assert len(store.generations.records) == 6 and len(store.grades.records) == 6
    assert {s.verifier for s in store.scores.records.values()} == {"confidence", "math_answer"}
    gen = next(iter(store.generations.records.values()))
    assert gen.completion_tokens > 0 and gen.logprobs and gen.busy_s is not None
    capsys.readouterr()

    # the rerun is all cache (no model loaded) and writes the report in the same command
    t0 = time.monotonic()
    assert main([*args, "--report", str(tmp_path / "report")]) == 0
    assert time.monotonic() - t0 < 20
    assert "everything was cached" in capsys.readouterr().err
    assert "## tiny" in (tmp_path / "report" / "README.md").read_text()

    # another run scored with this run's verifier list, as a committed run's costly columns are
    # reproduced from empty; a directory without a run is refused by name
    copy_args = [*args[:6], "--runs-dir", str(tmp_path / "elsewhere"), "--run", "copy"]
    copy_args += ["--verifiers-from", str(runs / "tiny")]
    assert main([*copy_args[:-2], "--verifiers-from", str(tmp_path / "nowhere")]) != 0
    assert "no eval run there" in capsys.readouterr().err
    assert main(copy_args) == 0
    copied = RunStore(tmp_path / "elsewhere" / "copy")
    assert {s.verifier for s in copied.scores.records.values()} == {"confidence", "math_answer"}
    assert [v["label"] for v in copied.manifest()["verifiers"]] == [v["label"] for v in store.manifest()["verifiers"]]
