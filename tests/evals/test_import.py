"""`eval import`: a JSONL of logged answers becomes a run that sweep, calibrate and train accept, and
the run's figures are the ones computed by hand from the same file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from evals.formatting import th
from evals.importer import ImportFormatError, fit_token_price, read_file
from evals.store import RunStore
from evals.sweep import CONFIG, CascadePolicy, SingleTier, evaluate, load_table
from router.cli import main
from router.config import load_settings
from tests.support.evals import write_config

N = 24
THRESHOLD = 0.5
PRICES = {"small": (0.2, 0.8), "large": (1.0, 3.0)}  # USD per 1M input / output tokens


def _answer(tier: str, text: str, i: int, confidence: float | None) -> dict[str, Any]:
    p, c = 40 + 3 * i, 5 + (i % 7) * 4
    usd_in, usd_out = PRICES[tier]
    a: dict[str, Any] = {
        "text": text,
        "prompt_tokens": p,
        "completion_tokens": c,
        "latency_s": 0.1 * (i + 1),
        "cost_usd": (p * usd_in + c * usd_out) / 1e6,
        "model": f"other-router-{tier}",
    }
    if confidence is not None:
        a["logprobs"] = [math.log(confidence)] * 3
    return a


def logged(n: int = N) -> tuple[list[dict[str, Any]], list[tuple[bool, bool, float]]]:
    """Lines of three kinds (per-tier labels, a numeric reference, no label), and per line the truth
    the test knows by construction: (small right, large right, small's confidence)."""
    lines, truth = [], []
    for i in range(n):
        small_ok, large_ok = i % 3 != 0, i % 5 != 0
        confidence = 0.3 + 0.6 * ((i * 7) % 10) / 10  # 0.3 .. 0.84, about half below the threshold
        right, wrong = f"The answer is \\boxed{{{i + 100}}}.", f"The answer is \\boxed{{{i + 99}}}."
        small_text = right if small_ok else wrong
        large_text = right if large_ok else f"I think it is {i + 98}."
        line: dict[str, Any] = {
            "id": f"req-{i}",
            "prompt": f"What is {i} + 100?",
            "task": "maths",
            "answers": {
                "small": _answer("small", small_text, i, confidence),
                "large": _answer("large", large_text, i, None),
            },
        }
        if i % 3 == 1:
            line["label"] = {"correct": {"small": small_ok, "large": large_ok}}
        elif i % 3 == 2:
            line["label"] = {"reference": str(i + 100)}
        else:  # no label: graded by agreement with the top tier, which is then right by definition
            large_ok = True
            small_ok = small_text == large_text or (small_ok and large_text == right)
        lines.append(line)
        truth.append((small_ok, large_ok, confidence))
    return lines, truth


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path, list[tuple[bool, bool, float]]]:
    config = write_config(tmp_path, verifier='name = "confidence"')
    lines, truth = logged()
    return config, write_jsonl(tmp_path / "logged.jsonl", lines), tmp_path / "runs", truth


@pytest.mark.slow
def test_import_then_sweep_and_calibrate_through_the_cli(
    setup: tuple[Path, Path, Path, list[tuple[bool, bool, float]]], capsys: pytest.CaptureFixture[str]
) -> None:
    config, data, runs, truth = setup
    argv = ["--config", str(config), "eval", "import", str(data), "--run", "prod", "--runs-dir", str(runs)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"imported {N} items x 2 tiers (small, large)" in out
    assert "8 by agreement" in out and "8 by per tier" in out and "8 by reference" in out
    assert "when it agrees with large" in out
    root = runs / "prod"
    assert sorted(p.name for p in runs.iterdir()) == ["prod"]  # no temporary directory left

    # the figures of the run equal those computed by hand from the file
    table = load_table(RunStore(root))
    assert len(table.items) == N and not table.incomplete
    small_acc = sum(s for s, _, _ in truth) / N
    large_acc = sum(g for _, g, _ in truth) / N
    assert evaluate(SingleTier(0), table).accuracy == pytest.approx(small_acc)
    assert evaluate(SingleTier(1), table).accuracy == pytest.approx(large_acc)
    lines, _ = logged()
    small_cost = [ln["answers"]["small"]["cost_usd"] for ln in lines]
    large_cost = [ln["answers"]["large"]["cost_usd"] for ln in lines]
    assert evaluate(SingleTier(1), table).cost_per_1k == pytest.approx(1000 * sum(large_cost) / N, rel=1e-9)
    escalate = [conf < THRESHOLD for _, _, conf in truth]
    cascade = evaluate(CascadePolicy(CONFIG, (THRESHOLD,)), table)
    assert 0 < sum(escalate) < N
    assert cascade.escalation_rate == pytest.approx(sum(escalate) / N)
    right = [(g if e else s) for (s, g, _), e in zip(truth, escalate, strict=True)]
    assert cascade.accuracy == pytest.approx(sum(right) / N)
    spent = [s + (g if e else 0.0) for s, g, e in zip(small_cost, large_cost, escalate, strict=True)]
    assert cascade.cost_per_1k == pytest.approx(1000 * sum(spent) / N, rel=1e-9)

    manifest = RunStore(root).manifest()
    assert manifest["import"]["grading"] == {"agreement": 8, "per_tier": 8, "reference": 8}
    assert manifest["import"]["proxy_reference_tier"] == "large"
    assert manifest["suite"]["task"] == "math"
    # small's answers carry logprobs: confidence is among the default verifiers; choice never is
    names = {v["name"] for v in manifest["verifiers"]}
    assert {"confidence", "format", "math_answer"} <= names and "choice" not in names

    assert main(["--config", str(config), "eval", "sweep", str(root), "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "confidence" in out and "oracle" in out
    assert main(["--config", str(config), "eval", "calibrate", "--run", str(root), "--target", "min-accuracy=0.7"]) == 0
    out = capsys.readouterr().out
    assert "thresholds small=" in out and "held-out" in out

    # calibrate --write retunes the configured tier's threshold for the run's task
    argv = ["--config", str(config), "eval", "calibrate", "--run", str(root), "--target", "min-accuracy=0.7"]
    assert main([*argv, "--write"]) == 0
    written = load_settings(config).tiers[0].tasks["maths"].threshold
    assert written is not None and f"small={th(written)}" in capsys.readouterr().out


@pytest.mark.slow
def test_train_reads_the_imported_prompts_back(setup: tuple[Path, Path, Path, Any]) -> None:
    from evals.training_data import load_run

    config, data, runs, _ = setup
    assert main(["--config", str(config), "eval", "import", str(data), "--run", "prod", "--runs-dir", str(runs)]) == 0
    run = load_run(runs / "prod")
    assert len(run.requests) == N
    assert run.requests["req-3"].messages[0].content == "What is 3 + 100?"
    # the request rebuilt for training carries no label: verifiers never see the reference
    assert "label" not in json.dumps([m.content for r in run.requests.values() for m in r.messages])


def test_the_price_fit_reproduces_linear_costs() -> None:
    from evals.importer import Answer

    answers = [Answer("x", p, c, cost_usd=(p * 0.5 + c * 2.0) / 1e6) for p, c in [(10, 3), (100, 1), (7, 40), (0, 9)]]
    fit = fit_token_price(answers)
    assert fit.price.usd_per_1m_input_tokens == pytest.approx(0.5)
    assert fit.price.usd_per_1m_output_tokens == pytest.approx(2.0)
    assert fit.max_error_usd < 1e-12


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("{not json", "not JSON"),
        ('["a list"]', "expected a JSON object"),
        ({"prompt": "hi", "answers": {"small": {"text": "x", "prompt_tokens": 1}}}, "completion_tokens"),
        ({"prompt": "hi", "answers": {"Small": {"text": "x"}}}, "tier name"),
        ({"prompt": "hi", "answers": {"small": {"text": 3}}}, "text must be a string"),
        ({"prompt": "hi", "oops": 1, "answers": {}}, "unknown field(s) oops"),
        ({"prompt": "x" * 200_001, "answers": {}}, "longer than 200000"),
        ({"prompt": "hi", "answers": {"small": {"text": "x" * 200_001}}}, "longer than 200000"),
        ({"prompt": "hi", "task": "poetry", "answers": {}}, "task must be one of"),
        (
            '{"prompt": "hi", "answers": {"small": {"text": "x", "prompt_tokens": 1, '
            '"completion_tokens": 1, "logprobs": [NaN]}}}',
            "not JSON",
        ),
        (
            {"prompt": "hi", "answers": {"small": {"text": "x", "prompt_tokens": 1, "completion_tokens": -1}}},
            "completion_tokens",
        ),
        (
            {
                "prompt": "hi",
                "label": {"reference": "B"},
                "task": "choice",
                "answers": {"small": {"text": "x", "prompt_tokens": 1, "completion_tokens": 1}},
            },
            None,
        ),
        (
            {
                "prompt": "hi",
                "label": {"reference": "Q"},
                "task": "choice",
                "answers": {"small": {"text": "x", "prompt_tokens": 1, "completion_tokens": 1}},
            },
            "letters",
        ),
        (
            {
                "prompt": "hi",
                "label": {"correct": {"small": True}},
                "answers": {
                    "small": {"text": "x", "prompt_tokens": 1, "completion_tokens": 1},
                    "large": {"text": "y", "prompt_tokens": 1, "completion_tokens": 1},
                },
            },
            "every answered tier",
        ),
    ],
)
def test_a_malformed_line_is_refused_naming_its_line(tmp_path: Path, bad: Any, why: str | None) -> None:
    good, _ = logged(2)
    path = write_jsonl(tmp_path / "x.jsonl", [good[0], good[1], bad])
    if why is None:
        assert len(read_file(path)) == 3
        return
    with pytest.raises(ImportFormatError) as err:
        read_file(path)
    assert "line 3" in str(err.value) and why in str(err.value)


def test_oversized_line_and_duplicate_ids_are_refused(tmp_path: Path) -> None:
    good, _ = logged(2)
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps(good[0]) + "\n" + "x" * (5 * 1024 * 1024) + "\n")
    with pytest.raises(ImportFormatError, match="line 2: longer than"):
        read_file(path)
    path = write_jsonl(tmp_path / "dup.jsonl", [good[0], good[1], good[0]])
    with pytest.raises(ImportFormatError, match="line 3: id 'req-0' already used on line 1"):
        read_file(path)


@pytest.mark.slow
def test_a_failed_import_leaves_nothing_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: tuple[Path, Path, Path, Any]
) -> None:
    config, _, runs, _ = setup
    lines, _ = logged(4)
    for ln in lines:  # a tier the config does not know, with no costs: no price to give it
        ln.pop("label", None)
        ln["answers"]["mystery"] = {k: v for k, v in ln["answers"]["large"].items() if k != "cost_usd"}
    data = write_jsonl(tmp_path / "unpriced.jsonl", lines)
    argv = ["--config", str(config), "eval", "import", str(data), "--run", "r", "--runs-dir", str(runs)]
    assert main(argv) != 0
    assert "tier mystery: no price" in capsys.readouterr().err
    assert list(runs.iterdir()) == []
    # a tier missing from one line
    for ln in lines:
        del ln["answers"]["mystery"]
    del lines[2]["answers"]["large"]
    data = write_jsonl(tmp_path / "gap.jsonl", lines)
    assert main([*argv[:4], str(data), *argv[5:]]) != 0
    assert "line 3: no answer from tier(s) large" in capsys.readouterr().err
    assert list(runs.iterdir()) == []
    # a verifier that asks a model for work is refused by name: one that generates, and one that
    # reads with another tier (it would abstain on every answer, a column that looks scored)
    good = write_jsonl(tmp_path / "good.jsonl", logged(3)[0])
    for verifier, label in (
        ("self_consistency", "self_consistency"),
        ('cross_tier:{"tier":"large"}', 'cross_tier[tier="large"]'),
        ('execution:{"second_opinion":true}', "execution[second_opinion=true]"),
    ):
        assert main([*argv[:4], str(good), *argv[5:], "--verifier", verifier]) != 0
        assert f"{label} on tier small ask a model for work" in capsys.readouterr().err
        assert list(runs.iterdir()) == []
    # an existing run is never overwritten
    (runs / "r").mkdir()
    assert main([*argv[:4], str(good), *argv[5:]]) != 0
    assert "exists" in capsys.readouterr().err
    assert list((runs / "r").iterdir()) == []


def _ledger(path: Path | str, n: int) -> list[bool]:
    """A real ledger (a SQLite file, or a postgresql:// URL) holding `n` shadow pairs and the
    rows of both requests of each, written by the store the service writes with; the attempts carry
    the token counts and times an import reads."""
    from dataclasses import replace

    from router.ledger.entries import ShadowPair
    from router.ledger.stores import open_store
    from tests.support.ledger import attempt, entry

    store = open_store(path)
    store.open()
    agree = []
    for i in range(n):
        stored = i % 4 != 3  # every fourth pair kept hashes only (store_prompts off)
        ok = i % 3 != 0
        agree.append(ok)
        small, large = (f"\\boxed{{{i}}}", f"\\boxed{{{i}}}") if ok else (f"\\boxed{{{i + 1}}}", f"\\boxed{{{i}}}")
        for rid, tier, text in ((f"r{i}", "small", small), (f"s{i}", "large", large)):
            timing = {"prompt_tokens": 20 + i, "completion_tokens": len(text), "latency_ms": 100.0 + i}
            store.write(entry(rid, 1000.0 + i, attempts=(replace(attempt(0, tier), **timing, busy_ms=90.0 + i),)))
        store.write_pair(
            ShadowPair(
                request_id=f"r{i}",
                shadow_request_id=f"s{i}",
                ts=1000.0 + i,
                tier="small",
                target="large",
                task="maths",
                score=0.9,
                threshold=0.5,
                scores={},
                agree=ok,
                rule="number",
                detail="",
                answer_extracted=None,
                shadow_extracted=None,
                prompt_sha256="h",
                answer_sha256="h",
                shadow_sha256="h",
                shadow_cost_usd=0.001,
                prompt_json=json.dumps({"messages": [{"role": "user", "content": f"What is {i} + 0?"}]})
                if stored
                else None,
                answer_text=small if stored else None,
                shadow_text=large if stored else None,
            )
        )
    store.close()
    return agree


def test_shadow_pairs_from_the_ledger_become_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: tuple[Path, Path, Path, Any]
) -> None:
    config, _, runs, _ = setup
    ledger = tmp_path / "ledger.sqlite3"
    agree = _ledger(ledger, 12)
    argv = [
        "--config",
        str(config),
        "eval",
        "import",
        "--ledger",
        str(ledger),
        "--run",
        "live",
        "--runs-dir",
        str(runs),
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "12 shadow pairs; 0 of other tiers, 3 kept hashes and extracted answers only" in captured.err
    assert "9 by shadow agreement" in captured.out
    table = load_table(RunStore(runs / "live"))
    kept = [ok for i, ok in enumerate(agree) if i % 4 != 3]
    assert len(table.items) == 9
    assert evaluate(SingleTier(0), table).accuracy == pytest.approx(sum(kept) / 9)
    assert evaluate(SingleTier(1), table).accuracy == 1.0
    first = table.items[0].tiers[0]
    assert (first.prompt_tokens, first.busy_s) == (20, pytest.approx(0.09))
    manifest = RunStore(runs / "live").manifest()
    assert manifest["import"]["proxy_reference_tier"] == "large"
    assert manifest["import"]["grading"] == {"shadow_agreement": 9}
    assert "confidence" not in {v["name"] for v in manifest["verifiers"]}  # the ledger keeps no logprobs
    assert (
        main(
            ["--config", str(config), "eval", "calibrate", "--run", str(runs / "live"), "--target", "min-accuracy=0.5"]
        )
        == 0
    )
    # a ledger whose pairs kept no text gives no run, and says why
    bare = tmp_path / "bare.sqlite3"
    _ledger(bare, 1)
    import sqlite3

    with sqlite3.connect(bare) as conn:
        conn.execute("UPDATE shadow_pairs SET prompt_json = NULL")
    assert main([*argv[:5], str(bare), "--run", "bare", "--runs-dir", str(runs)]) != 0
    assert "Turn on ledger.store_prompts" in capsys.readouterr().err
    assert not (runs / "bare").exists()


def test_the_documented_example_lines_import(tmp_path: Path) -> None:
    doc = (Path(__file__).parents[2] / "docs" / "eval-import.md").read_text(encoding="utf-8")
    block = doc.split("```json\n", 1)[1].split("```", 1)[0]
    records = read_file(write_jsonl(tmp_path / "doc.jsonl", block.strip().splitlines()))
    assert [r.id for r in records] == ["r1", "r2"]
    assert records[0].key == {"kind": "reference", "grader": "numeric", "value": 51, "letters": "ABCD"}
    assert records[1].task == "text" and records[1].key is not None and records[1].key["kind"] == "per_tier"


def test_shadow_pairs_import_from_a_postgresql_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: tuple[Path, Path, Path, Any], db: str
) -> None:
    # the same pairs through the PostgreSQL store give the same run as from SQLite
    config, _, runs, _ = setup
    agree = _ledger(db, 12)
    argv = ["--config", str(config), "eval", "import", "--ledger", db, "--run", "live-pg", "--runs-dir", str(runs)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "12 shadow pairs; 0 of other tiers, 3 kept hashes and extracted answers only" in captured.err
    table = load_table(RunStore(runs / "live-pg"))
    kept = [ok for i, ok in enumerate(agree) if i % 4 != 3]
    assert evaluate(SingleTier(0), table).accuracy == pytest.approx(sum(kept) / 9)
    first = table.items[0].tiers[0]
    assert (first.prompt_tokens, first.busy_s) == (20, pytest.approx(0.09))
    assert RunStore(runs / "live-pg").manifest()["import"]["source"] == db
    # a password in the URL is refused before anything is read, as the service refuses it
    user, rest = db.removeprefix("postgresql://").split("@", 1)
    assert main([*argv[:5], f"postgresql://{user}:secret@{rest}", "--run", "x", "--runs-dir", str(runs)]) != 0
    assert "password" in capsys.readouterr().err
    assert not (runs / "x").exists()
