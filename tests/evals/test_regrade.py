"""The maths grader never credits an answer cut off before stating one, and a grader change is
applied to stored runs from their answers alone (`eval regrade`), recorded as a grader version."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from evals.grading import grade_numeric
from evals.regrade import regrade
from evals.store import GenerationRecord, GradeRecord, RunStore, generation_key, grade_key
from evals.suites import get_suite
from evals.sweep import load_table
from router.cli import main
from router.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "evals" / "results" / "gsm8k"
LOOPED = "gsm8k/656"  # the small tier loops on "10 pages/day" until its token limit; the gold answer is 10


def _committed_generation(tier: str, item: str) -> GenerationRecord:
    with open(COMMITTED / "generations.jsonl", encoding="utf-8") as f:
        for line in f:
            raw = json.loads(line)
            if raw["tier"] == tier and raw["item"] == item:
                return GenerationRecord(**raw)
    raise AssertionError(f"{tier} {item} is not in the committed run")


def test_a_cut_off_answer_is_read_by_its_markers_only() -> None:
    looped = _committed_generation("small", LOOPED)
    assert looped.finish_reason == "length" and "boxed" not in looped.text
    assert grade_numeric(looped.text, 10).correct  # the lenient reading: its last number is the gold 10
    cut = grade_numeric(looped.text, 10, cut_off=True)
    assert not cut.correct and cut.extracted is None and cut.detail == "cut off before stating an answer"
    # an answer stated before the cut still counts; an answer that finished keeps the lenient reading
    assert grade_numeric("So \\boxed{10}. Now a new question: 10 pages, 10 pages, 10", 10, cut_off=True).correct
    assert grade_numeric("Mike reads 10 pages a day, so the answer is 10", 10, cut_off=True).correct
    assert grade_numeric("He reads 200 / 20 = 10 pages a day", 10).correct


async def test_the_gsm8k_suite_grades_the_committed_loop_wrong() -> None:
    suite = get_suite("gsm8k")
    item = next(i for i in suite.load() if i.id == LOOPED)
    looped = _committed_generation("small", LOOPED)
    assert not (await suite.grade_answer(item, looped.text, cut_off=True)).correct
    assert suite.fingerprint == "gsm8k@3"


def test_the_committed_run_is_graded_at_the_current_version() -> None:
    table = load_table(RunStore(COMMITTED))
    assert table.manifest["suite"]["fingerprint"] == get_suite("gsm8k").fingerprint
    looped = next(it for it in table.items if it.id == LOOPED)
    assert not looped.tiers[0].correct


def _old_run(root: Path) -> RunStore:
    """One item of the committed run, stored as gsm8k@2 graded it: the loop counted right."""
    suite = get_suite("gsm8k")
    item = next(i for i in suite.load() if i.id == LOOPED)
    committed = json.loads((COMMITTED / "manifest.json").read_text(encoding="utf-8"))
    small = next(t for t in committed["tiers"] if t["name"] == "small")
    gk = generation_key(small["fingerprint"], item.prompt_sha)
    manifest = {
        **committed,
        "suite": {**committed["suite"], "fingerprint": "gsm8k@2"},
        "tiers": [small],
        "items": [{"id": item.id, "group": "", "prompt_sha": item.prompt_sha}],
    }
    store = RunStore(root)
    store.write_manifest(manifest)
    store.add_generation(replace(_committed_generation("small", LOOPED), key=gk))
    store.add_grade(GradeRecord(grade_key(gk, "gsm8k@2", item.id), gk, "small", item.id, True, "10"))
    return store


async def test_regrade_applies_the_new_grader_to_stored_answers(tmp_path: Path) -> None:
    with _old_run(tmp_path / "run") as store:
        done = await regrade(store, get_suite("gsm8k"))
    assert (done.before, done.after, done.graded) == ("gsm8k@2", "gsm8k@3", 1)
    assert done.changed == [f"small {LOOPED}: right -> wrong"]
    again = RunStore(tmp_path / "run")
    assert again.manifest()["suite"]["fingerprint"] == "gsm8k@3"
    assert len(again.grades.records) == 2  # the old verdict stays in the log, under its own version
    assert not load_table(again).items[0].tiers[0].correct
    assert (await regrade(again, get_suite("gsm8k"))).graded == 0


def test_regrade_from_the_command_line_needs_no_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _old_run(tmp_path / "runs" / "old").close()
    config = tmp_path / "missing.toml"  # no config is read: a grader needs only the answers
    assert main(["--config", str(config), "eval", "regrade", "old", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "old: gsm8k@2 -> gsm8k@3, 1 answer(s) graded; 1 verdict(s) changed" in out
    assert f"small {LOOPED}: right -> wrong" in out


async def test_regrade_refuses_a_run_the_suite_does_not_hold(tmp_path: Path) -> None:
    store = _old_run(tmp_path / "run")
    with pytest.raises(ConfigError, match="holds suite 'gsm8k', not 'mmlu'"):
        await regrade(store, get_suite("mmlu"))
    manifest = store.manifest()
    manifest["items"][0]["prompt_sha"] = "0" * 64  # another question under the same id
    store.write_manifest(manifest)
    with pytest.raises(ConfigError, match="not in suite gsm8k as it was asked"):
        await regrade(store, get_suite("gsm8k"))
    store.close()
