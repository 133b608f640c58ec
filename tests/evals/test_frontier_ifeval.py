"""GPT-4 as the ifeval suite's top tier (`evals.frontier.ifeval`): the authors' published responses
matched to the 541 items by prompt, each once (refused when a response is malformed, doubled,
missing or answers no item); imported as an eval run graded by this project's grader on GPT-4's
text, which reproduces the third party's strict grading but for 8 prompts, each explained; priced
at gpt-4's list price with the committed token estimates; and the committed run is what
`tierroute eval frontier-import ifeval` writes, byte for byte."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from evals.frontier.ifeval import (
    EDITED,
    PRICE,
    RESPONSES_FILE,
    RUN,
    SOURCE,
    TIER,
    TOKENS_FILE,
    load,
    write_run,
)
from evals.store import RunStore
from evals.suites.ifeval import IFEval
from evals.sweep import load_table
from router.cli import main
from router.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "evals" / "data" / "ifeval"
COMMITTED = REPO / "evals" / "results" / RUN
# prompt key -> our verdict, where ours and the third party's strict grading of GPT-4 part; why, kind
# by kind, is tests/evals/test_ifeval_checks.py's KNOWN and the table in docs/evaluating.md
DIFFER = {2341: True, 2571: True, 202: True, 1843: True, 1122: True, 1129: True, 1954: True, 2359: False}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _copy(tmp: Path) -> Path:
    root = tmp / "ifeval"
    shutil.copytree(DATA, root)
    return root


def test_every_item_has_one_response_matched_by_its_prompt() -> None:
    pub = load(DATA)
    items = IFEval().load()
    assert pub.items == [it.id for it in items] and len(pub.items) == 541
    # the one prompt the authors edited after GPT-4 answered it, and only that one
    assert pub.edited == ("ifeval/2785",) and list(EDITED) == [2785]
    asked = {r["prompt"]: r["response"] for r in _rows(DATA / RESPONSES_FILE)}
    for it in items:
        prompt = it.answer_key.reference["prompt"]
        if it.id == "ifeval/2785":
            then, now = EDITED[2785]
            assert now in prompt and prompt.replace(now, then) in asked
            continue
        assert pub.answers[it.id] == asked[prompt]
    assert hashlib.sha256((DATA / RESPONSES_FILE).read_bytes()).hexdigest() == SOURCE["sha256"]
    assert SOURCE["sha256"] in (DATA / "PROVENANCE.md").read_text(encoding="utf-8")
    # the token file covers every item, a prompt and an answer each (GPT-4 once answered "A")
    assert set(pub.tokens) == set(pub.items)
    assert all(p >= 10 and a >= 1 for p, a in pub.tokens.values())
    assert pub.tokenizer["model"] == "qwen2.5-coder-0.5b-instruct-q4_k_m"


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda lines: lines + lines[:1], "a second response to ifeval/1000"),
        (lambda lines: lines[1:], "no response to 1 items (ifeval/1000"),
        (lambda lines: ['{"prompt": "Say hi.", "response": "hi"}', *lines[1:]], "response 1: its prompt is no item's"),
        (lambda lines: ["{not json", *lines[1:]], "line 1:"),
        (lambda lines: ['{"prompt": "x", "response": "y", "model": "z"}', *lines[1:]], "exactly prompt and response"),
        (lambda lines: [json.dumps({"prompt": "x", "response": " "}), *lines[1:]], "non-empty strings"),
        (lambda lines: [json.dumps({"prompt": "x", "response": 3}), *lines[1:]], "non-empty strings"),
        (lambda lines: ["[1, 2]", *lines[1:]], "exactly prompt and response"),
        (lambda lines: [json.dumps({"prompt": "x", "response": "y" * 300_000}), *lines[1:]], "longer than"),
    ],
)
def test_a_bad_responses_file_is_refused_naming_the_line(tmp_path: Path, edit, says: str) -> None:
    root = _copy(tmp_path)
    path = root / RESPONSES_FILE
    _write_lines(path, edit(path.read_text(encoding="utf-8").splitlines()))
    with pytest.raises(ConfigError) as err:
        load(root)
    assert says in str(err.value)


def test_a_token_file_that_misses_an_item_or_is_malformed_is_refused(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    body = json.loads((root / TOKENS_FILE).read_text())
    del body["items"]["ifeval/1000"]
    (root / TOKENS_FILE).write_text(json.dumps(body))
    with pytest.raises(ConfigError, match="cover exactly the 541 items"):
        load(root)
    body["items"]["ifeval/1000"] = [12, -3]
    (root / TOKENS_FILE).write_text(json.dumps(body))
    with pytest.raises(ConfigError, match="answer must be a token count"):
        load(root)


def test_the_import_grades_gpt4_here_and_reproduces_the_published_strict_grading(tmp_path: Path) -> None:
    pub = load(DATA)
    store = RunStore(write_run(pub, IFEval(), tmp_path))
    table = load_table(store)
    assert [t.name for t in table.tiers] == [TIER] and len(table.items) == 541 and not table.incomplete
    ours = {int(it.id.removeprefix("ifeval/")): it.tiers[0].correct for it in table.items}
    assert sum(ours.values()) == 421 == store.manifest()["published"]["right"]  # 77.8% strict
    # against the third party's strict grading with the authors' checkers (540 prompts, no 2785)
    keys = {r["prompt"]: r["key"] for r in _rows(DATA / "input_data.jsonl")}
    theirs = {keys[r["prompt"]]: r["follow_all_instructions"] for r in _rows(DATA / "eval_results_strict.jsonl")}
    assert len(theirs) == 540 and 2785 not in theirs
    assert {k: ours[k] for k in theirs if ours[k] != theirs[k]} == DIFFER
    published, here = sum(theirs.values()) / 540, sum(ours[k] for k in theirs) / 540
    assert published == pytest.approx(0.7685, abs=1e-4)
    assert here - published == pytest.approx(6 / 540)  # 7 ours-right, 1 ours-wrong: within 0.012
    # the edited prompt is graded against the suite's key: GPT-4 gave one placeholder, not 3
    grade = next(g for g in store.grades.records.values() if g.item == "ifeval/2785")
    assert json.loads(grade.detail) == {
        "detectable_format:number_highlighted_sections": True,
        "detectable_content:number_placeholders": False,
    }
    # the stored answer is GPT-4's text, its tokens the committed estimate, priced at gpt-4's list price
    for it in table.items:
        out = it.tiers[0]
        p, a = pub.tokens[it.id]
        assert out.text == pub.answers[it.id] and (out.prompt_tokens, out.completion_tokens) == (p, a)
        assert out.cost_usd == pytest.approx((p * PRICE.input_per_1m + a * PRICE.output_per_1m) / 1e6)
    assert (PRICE.input_per_1m, PRICE.output_per_1m) == (30.0, 60.0)


def test_a_rerun_of_the_import_replaces_the_run_whole(tmp_path: Path) -> None:
    pub = load(DATA)
    first = write_run(pub, IFEval(), tmp_path)
    (first / "stray.txt").write_text("left from before")
    second = write_run(pub, IFEval(), tmp_path)
    assert second == first and not (second / "stray.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == [RUN]  # no temporary directory left behind


def test_the_committed_run_is_what_the_import_command_writes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["eval", "frontier-import", "ifeval", "--data", str(DATA), "--runs-dir", str(tmp_path)]) == 0
    assert "541 GPT-4 responses" in capsys.readouterr().out
    for name in ("manifest.json", "generations.jsonl", "grades.jsonl"):
        made = (tmp_path / RUN / name).read_bytes()
        assert made == (COMMITTED / name).read_bytes(), f"evals/results/{RUN}/{name} is stale"


def test_the_import_command_refuses_a_suite_without_published_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["eval", "frontier-import", "gsm8k", "--runs-dir", str(tmp_path)]) != 0
    assert "no published answers to import for 'gsm8k'; have: ifeval" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
