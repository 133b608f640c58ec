"""scripts/escalation_reuse_bench.py: which committed escalations it replays, and a replay through
real `tierroute serve` processes on SmolLM2 (both tiers), at a few tokens. Whether reuse is
measured depends on the engine: one without `reuse_rejected` runs the sequential cascade alone.

The replays take seed 2, whose items have short prompts (HumanEval/155 and gsm8k/931, 388 and 299
characters): every tier of every server prefills each prompt at one thread, and seed 0's
HumanEval/129 (1,524 characters) made the file cost about twice the CPU for the same mechanics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.store import RunStore
from evals.sweep import CONFIG, load_table
from router import policy
from scripts.escalation_reuse_bench import SUITES, escalated_items, main, prompts_of
from tests.support.config import write_config
from tests.support.model import SMOL

RUNS = Path(__file__).resolve().parents[2] / "evals" / "results"

TEMPLATE = """
[server]
allow_unauthenticated = true
[cascade]
task_classifier = false
[ledger]
path = "{ledger}"

[[tiers]]
name = "small"
backend = "llamacpp"
threshold = 0.5
max_tokens = 64
timeout_s = 120
[tiers.llamacpp]
model = "{model}"
n_ctx = 4096
n_threads = 1
n_parallel = 1
[tiers.price]
usd_per_hour = 0.1
[[tiers.verifiers]]
name = "format"
params = {{ regex = "(?!)" }}

[[tiers]]
name = "large"
backend = "llamacpp"
max_tokens = 64
timeout_s = 120
[tiers.llamacpp]
model = "{model}"
n_ctx = 4096
n_threads = 1
n_parallel = 1
reuse_rejected = true
[tiers.price]
usd_per_hour = 0.2
"""


@pytest.mark.slow
def test_it_replays_only_items_the_small_tier_lost_and_the_large_tier_answered() -> None:
    items = escalated_items(RUNS, SUITES, 12, seed=0)
    assert len(items) == 12
    assert sorted(e.suite for e in items) == ["gsm8k"] * 6 + ["humaneval"] * 6
    assert items == escalated_items(RUNS, SUITES, 12, seed=0)  # seeded
    assert {e.id for e in items} != {e.id for e in escalated_items(RUNS, SUITES, 12, seed=1)}
    for suite in SUITES:
        # read back from the run itself: the small tier's combined score was below its threshold
        table = load_table(RunStore(RUNS / suite), tiers=["small", "large"])
        by_id = {it.id: it for it in table.items}
        for e in (e for e in items if e.suite == suite):
            small = by_id[e.id].tiers[0]
            assert e.small_score == small.scores[CONFIG] and not policy.accepts(small.scores[CONFIG], e.small_threshold)
            assert e.small_text == small.text and e.large_text == by_id[e.id].tiers[1].text
            assert e.max_tokens == 512
    odd = escalated_items(RUNS, SUITES, 3, seed=0)
    assert [e.suite for e in odd].count("humaneval") == 2  # the first suite takes the remainder
    prompts = prompts_of(items[:2])
    assert all(prompts[e.id][-1]["role"] == "user" and prompts[e.id][-1]["content"] for e in items[:2])


def test_replay_through_the_service_on_smollm2(tmp_path: Path, smol_path: Path) -> None:
    config = write_config(tmp_path / "reuse.toml", TEMPLATE.format(ledger=tmp_path / "ledger.sqlite3", model=SMOL))
    out = tmp_path / "escalation.json"
    rc = main(["--config", str(config), "--sample", "2", "--seed", "2", "--max-tokens", "8", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0, report
    assert [r["suite"] for r in report["items"]] == ["humaneval", "gsm8k"]
    for row in report["items"]:
        seq = row["sequential"]
        assert seq["escalated"] and seq["answered_by"] == "large"
        assert 0 < seq["large_tokens"] <= 8 and seq["large_ms"] > 0 and seq["client_ms"] >= seq["large_ms"]
        assert seq["large_matches_committed"] is False  # SmolLM2 is not the run's Qwen
    assert set(report["drafts"]) == ({"sequential"} if report["skipped"] else {"sequential", "reuse"})
    summary = report["summary"]
    assert summary["items"] == summary["escalated_on_every_server"] == 2
    if report["skipped"] is not None:
        assert "reuse_rejected" in report["skipped"] and "reuse" not in report["items"][0]
    else:
        assert summary["identical"] == 2 and summary["large_ms_ratio_of_totals"] > 0
        assert report["drafts"]["reuse"]["rejected"]["drafted"] > 0  # the rejected answers were drafts


def test_cross_tier_mode_compares_against_a_revision_before(tmp_path: Path, smol_path: Path) -> None:
    """With the large tier scoring the small answers, against the code of a git revision (HEAD
    here: the mechanics, not a speed-up): both escalate, and this checkout's large tier takes the
    small answer's start from the scoring pass (the same model on both tiers agrees with it)."""
    config = write_config(tmp_path / "reuse.toml", TEMPLATE.format(ledger=tmp_path / "ledger.sqlite3", model=SMOL))
    out = tmp_path / "cross-tier.json"
    rc = main(
        ["--config", str(config), "--sample", "1", "--seed", "2", "--max-tokens", "8"]
        + ["--cross-tier", "HEAD", "--json", str(out)]
    )
    report = json.loads(out.read_text())
    assert rc == 0, report
    (row,) = report["items"]
    assert row["identical"] and row["before"]["escalated"] and row["shared"]["escalated"]
    assert row["before"]["verify_ms"] > 0 and row["shared"]["verify_ms"] > 0  # the scoring pass ran on both
    summary = report["summary"]
    assert summary["scored_tokens_taken"] >= 1 and summary["scoring_and_large_ms_ratio_of_totals"] > 0
    assert report["cross_tier_before"] == "HEAD"
