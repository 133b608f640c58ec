"""The frontier report: published answers imported as eval runs (GSM8K regraded by our grader),
joined with the small tier's committed runs, calibrated by `evals.calibrate`, and the committed
report and the README's cells held to what the command gives."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from evals.calibrate import Target, calibrate, split
from evals.frontier.cascade import (
    calibrations,
    held_out_row,
    join,
    local_table,
    mixtral_agreement,
    priced,
    random_at,
    target_for,
)
from evals.frontier.published import GPT4, MIXTRAL, PRICES, load
from evals.frontier.tiers import write_run
from evals.store import RunStore
from evals.suites import get_suite
from evals.sweep import CascadePolicy, evaluate, load_table, random_escalation
from router.cli import main
from router.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "evals/data/routellm"
COMMITTED = REPO / "docs/eval/frontier"


def _subset(tmp: Path, suite: str, ids: list[str], at: str = "", edit: dict[str, object] | None = None) -> Path:
    """A copy of the committed subset holding only `ids` (the line of item `at` edited, where asked)."""
    out = tmp / "data"
    out.mkdir(exist_ok=True)
    (out / "meta.json").write_bytes((DATA / "meta.json").read_bytes())
    lines = []
    for line in (DATA / f"{suite}.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["id"] in ids:
            if edit and row["id"] == at:
                row = {**row, **edit}
            lines.append(json.dumps(row))
    (out / f"{suite}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def test_the_committed_subset_matches_every_gsm8k_item_and_reads_back() -> None:
    gsm = load("gsm8k", DATA)
    assert gsm.matched["matched"] == gsm.matched["suite"] == len(gsm.items) == 1319
    assert all(a.text for p in gsm.items for a in p.answers.values())
    # RouteLLM's own labels, as published: the accuracies MODELS.md quotes (0.857 and 0.638)
    right = {t: sum(p.answers[t].published_correct for p in gsm.items) for t in (MIXTRAL, GPT4)}
    assert right == {MIXTRAL: 842, GPT4: 1130}
    mmlu = load("mmlu", DATA)
    assert mmlu.matched["matched"] >= 14000 and mmlu.matched["unmatched"] == 11
    assert all(a.text is None and a.tokens == 1 for p in mmlu.items for a in p.answers.values())
    assert "Apache License" in (DATA / "LICENSE").read_text()[:200]
    assert "0b64fdafe049e596a3f5657c219329f24af24198" in (DATA / "PROVENANCE.md").read_text()


def test_a_malformed_published_line_is_refused_naming_it(tmp_path: Path) -> None:
    data = _subset(tmp_path, "gsm8k", ["gsm8k/0", "gsm8k/1"], "gsm8k/1", {"prompt_tokens": -3})
    with pytest.raises(ConfigError, match=r"gsm8k.jsonl line 2: prompt_tokens must be a token count"):
        load("gsm8k", data)
    bad = _subset(tmp_path, "gsm8k", ["gsm8k/0"], "gsm8k/0", {"id": "mmlu/0"})
    with pytest.raises(ConfigError, match="is not a gsm8k item id"):
        load("gsm8k", bad)


def test_gsm8k_answers_are_regraded_by_our_grader_and_disagreements_kept(tmp_path: Path) -> None:
    # gsm8k/44: GPT-4 ends "#### $20.00"; RouteLLM's last-integer rule read 00 and marked it wrong
    # gsm8k/164: Mixtral's answer reads -15 against 15; RouteLLM's rule ignores the sign
    data = _subset(tmp_path, "gsm8k", ["gsm8k/0", "gsm8k/44", "gsm8k/164"])
    root = write_run(load("gsm8k", data), get_suite("gsm8k"), tmp_path / "runs")
    table = load_table(RunStore(root))
    by_id = {it.id: it for it in table.items}
    assert [t.name for t in table.tiers] == [MIXTRAL, GPT4]
    assert by_id["gsm8k/44"].tiers[1].correct and by_id["gsm8k/0"].tiers[1].correct
    assert not by_id["gsm8k/164"].tiers[0].correct
    grading = RunStore(root).manifest()["published"]["grading"]
    assert grading[GPT4]["ours_right_published_wrong"] == 1
    assert grading[MIXTRAL]["ours_wrong_published_right"] == 1
    assert {e["item"] for t in (MIXTRAL, GPT4) for e in grading[t]["examples"]} == {"gsm8k/44", "gsm8k/164"}
    # priced at the list price from the stored token counts: $10 / $30 per 1M
    p = load("gsm8k", data).items[0]
    gpt = by_id["gsm8k/0"].tiers[1]
    assert (gpt.prompt_tokens, gpt.completion_tokens) == (p.prompt_tokens, p.answers[GPT4].tokens)
    assert gpt.cost_usd == pytest.approx((10 * p.prompt_tokens + 30 * p.answers[GPT4].tokens) / 1e6)
    assert RunStore(root).manifest()["published"]["prices"][GPT4]["provider"] == PRICES[GPT4].provider
    # rewritten whole on a second call, not appended to
    write_run(load("gsm8k", data), get_suite("gsm8k"), tmp_path / "runs")
    assert len((root / "grades.jsonl").read_text().splitlines()) == 6


@pytest.fixture(scope="module")
def gsm8k_tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    root = write_run(load("gsm8k", DATA), get_suite("gsm8k"), tmp_path_factory.mktemp("runs"))
    local, left_out = local_table([RunStore(REPO / "evals/results/gsm8k")])
    assert "cross_tier_min" in left_out and "cross_tier_min" not in local.verifiers
    return local, priced(RunStore(root), "gpt-4-1106-preview")


def test_the_joined_cascade_is_calibrated_by_evals_calibrate(gsm8k_tables: tuple[object, object]) -> None:
    local, frontier = gsm8k_tables
    two = join(local, frontier, [GPT4])  # type: ignore[arg-type]
    assert len(two.items) == 200 and [t.name for t in two.tiers] == ["small", GPT4]
    # the small tier is charged per token at its committed run's throughput: the run's total cost kept
    recorded = load_table(RunStore(REPO / "evals/results/gsm8k"), tiers=["small"])
    assert sum(it.tiers[0].cost_usd for it in two.items) == pytest.approx(
        sum(it.tiers[0].cost_usd for it in recorded.items)
    )
    few = replace(two, verifiers=["confidence_min", "execution", "boxed"])  # a nearest miss among them
    for share, cal in calibrations(few):
        assert cal.target == target_for(two, share, 0, 0.5)
        again = calibrate(few, cal.verifier, cal.target)
        assert again.thresholds == cal.thresholds
        row = held_out_row(two, cal, share, suite="gsm8k", cascade="c", price_point="p")
        _, held = split(two)
        direct = evaluate(CascadePolicy(cal.verifier, tuple(cal.thresholds.values())), held)
        assert row.result.accuracy == direct.accuracy and row.result.cost_per_1k == pytest.approx(direct.cost_per_1k)
        assert row.saved == pytest.approx(direct.savings)
        assert row.saved_ci.low <= row.saved + 1e-9 and row.saved - 1e-9 <= row.saved_ci.high
        assert row.accuracy_ratio == pytest.approx(direct.accuracy / row.top.accuracy)


def test_mixtral_decides_by_agreeing_with_the_small_tier(gsm8k_tables: tuple[object, object]) -> None:
    local, frontier = gsm8k_tables
    agree = mixtral_agreement(local, frontier)  # type: ignore[arg-type]
    three = join(local, frontier, [MIXTRAL, GPT4], agree)  # type: ignore[arg-type]
    for it in three.items:
        assert set(it.tiers[1].scores) == set(local.verifiers)  # type: ignore[attr-defined]
        assert all(v == agree[it.id] for v in it.tiers[1].scores.values())
    # an item where both answers state the gold number agrees; the small tier's wrong answer does not
    both_right = [it for it in three.items if it.tiers[0].correct and it.tiers[1].correct]
    assert both_right and all(agree[it.id] == 1.0 for it in both_right)
    # (a small answer cut off before stating one is graded wrong, gsm8k@3, yet its last number
    # may still be Mixtral's: gsm8k/656 loops on the gold 10; agreement reads numbers, not grades)
    generations = (REPO / "evals/results/gsm8k/generations.jsonl").read_text().splitlines()
    cut = {g["item"] for g in map(json.loads, generations) if g["tier"] == "small" and g["finish_reason"] == "length"}
    split_right = [it for it in three.items if it.tiers[0].correct != it.tiers[1].correct and it.id not in cut]
    assert split_right and all(agree[it.id] != 1.0 for it in split_right)
    assert agree["gsm8k/656"] == 1.0 and not next(it for it in three.items if it.id == "gsm8k/656").tiers[0].correct


def test_random_baseline_is_as_accurate_as_asked(gsm8k_tables: tuple[object, object]) -> None:
    local, frontier = gsm8k_tables
    two = join(local, frontier, [GPT4])  # type: ignore[arg-type]
    lo, hi = random_escalation(two, 0).accuracy, random_escalation(two, 1).accuracy
    mid = (lo + hi) / 2
    saved = random_at(two, mid)
    p = (mid - lo) / (hi - lo)  # two tiers: accuracy is linear in the probability
    assert saved == pytest.approx(random_escalation(two, p).savings, abs=1e-6)
    assert random_at(two, hi + 0.01) is None


def test_the_bootstrap_is_reproducible_and_moves_with_the_items(gsm8k_tables: tuple[object, object]) -> None:
    local, frontier = gsm8k_tables
    two = join(local, frontier, [GPT4])  # type: ignore[arg-type]
    share, cal = calibrations(two, shares=(0.95,))[2]
    a = held_out_row(two, cal, share, suite="s", cascade="c", price_point="p")
    assert held_out_row(two, cal, share, suite="s", cascade="c", price_point="p") == a
    fewer = replace(two, items=two.items[:120])
    b = held_out_row(fewer, cal, share, suite="s", cascade="c", price_point="p")
    assert np.isfinite(b.saved) and b.saved_ci != a.saved_ci


def test_target_is_a_share_of_the_top_tier_on_the_calibration_half(gsm8k_tables: tuple[object, object]) -> None:
    local, frontier = gsm8k_tables
    two = join(local, frontier, [GPT4])  # type: ignore[arg-type]
    calib, _ = split(two)
    top = sum(it.tiers[1].correct for it in calib.items) / len(calib.items)
    assert target_for(two, 0.95, 0, 0.5) == Target("min-accuracy", 0.95 * top)


def _summary(markdown: str, after: str) -> list[str]:
    """The first table after `after` (the text between them, if any, skipped)."""
    section = markdown.split(after, 1)[1]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return table


def _summary_rows(markdown: str) -> list[dict[str, str]]:
    lines = _summary(markdown, "## Summary\n")
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]


def test_the_summary_is_over_200_splits_and_says_which_tier_answers_how_often() -> None:
    report = (COMMITTED / "README.md").read_text(encoding="utf-8")
    assert "over 200 random calibration / held-out splits" in report
    rows = _summary_rows(report)
    assert {r["cascade"] for r in rows} >= {"small → gpt-4-1106", "small → mixtral-8x7b → gpt-4-1106"}
    for r in rows:
        tiers = r["cascade"].removesuffix(", verified").split(" → ")
        shares = r["answered by (median)"].split(" · ")
        # every tier of the cascade is named with its median share: a tier that never answers says 0%
        assert [s.rsplit(" ", 1)[0] for s in shares] == tiers, r
        assert all(s.rsplit(" ", 1)[1].endswith("%") for s in shares)
        assert r["prices"] and "per 1M" in r["prices"]
        if tiers[0] == "small":
            assert "per busy hour" in r["prices"]
    three = [r for r in rows if r["cascade"] == "small → mixtral-8x7b → gpt-4-1106"]
    assert three and any(r["answered by (median)"].startswith("small 0%") for r in three)


def test_a_finer_threshold_grid_moves_no_headline_by_a_point() -> None:
    """The committed reports compare the grid they use with one 4x finer on the same splits."""
    report = (COMMITTED / "README.md").read_text(encoding="utf-8")
    moved = float(report.split("the largest move of a median saving or accuracy ratio is ", 1)[1].split(" ", 1)[0])
    assert moved <= 1.0
    for line in report.split("## The threshold grid", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[4].replace(".", "").replace("-", "").isdigit():
            assert abs(float(cells[4])) <= 1.0, line
    evals = (REPO / "docs/eval/README.md").read_text(encoding="utf-8")
    moves = [float(m.split(" points", 1)[0]) for m in evals.split("median savings move by ")[1:]]
    assert len(moves) == 4 and max(moves) <= 1.0


def test_the_readme_quotes_the_report_cell_for_cell() -> None:
    report = (COMMITTED / "README.md").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    expected = _summary(report, "## Summary\n")
    assert len(expected) >= 6
    quoted = _summary(readme, "has other price points and every verifier:\n")
    assert quoted == expected, "README's frontier table differs from docs/eval/frontier: copy the report's Summary"
    command = report.split("```\n", 2)[1].strip()
    assert (
        " ".join(readme.split("# (g) ", 1)[1].split("\n", 1)[1].split("```", 1)[0].replace("\\\n", " ").split())
        == command
    )


@pytest.mark.slow  # spends seconds of CPU: the whole report, both suites
def test_the_committed_report_is_what_its_command_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (COMMITTED / "README.md").read_text(encoding="utf-8")
    args = shlex.split(text.split("```\n", 2)[1].strip())
    assert args[:3] == ["tierroute", "eval", "frontier"]
    args = args[1:]
    out, runs = tmp_path / "out", tmp_path / "runs"
    assert args[args.index("--out") + 1] == "docs/eval/frontier"
    args[args.index("--out") + 1] = str(out)
    original_runs = args[args.index("--runs-dir") + 1]
    args[args.index("--runs-dir") + 1] = str(runs)
    monkeypatch.chdir(REPO)
    assert main(args) == 0
    for name in ("README.md", "frontier.csv", "splits.csv"):
        made = (out / name).read_text(encoding="utf-8")
        made = made.replace(str(out), "docs/eval/frontier").replace(str(runs), original_runs)
        assert made == (COMMITTED / name).read_text(encoding="utf-8"), f"docs/eval/frontier/{name} is stale"
    assert (out / "price-sensitivity.png").stat().st_size > 10_000
    # the imported frontier tiers are eval runs the other commands read
    assert (runs / "routellm-gsm8k" / "manifest.json").is_file()
    assert main(["eval", "sweep", str(runs / "routellm-gsm8k")]) == 0


def test_local_runs_are_merged_item_by_item_with_the_verifiers_all_share() -> None:
    committed = RunStore(REPO / "evals/results/gsm8k")
    full = RunStore(REPO / "evals/results-gsm8k-full/gsm8k-full")
    merged, left_out = local_table([committed, full])
    ids = {e["id"] for s in (committed, full) for e in s.manifest()["items"]}
    done = {it.id for it in load_table(full, tiers=["small"]).items} | {
        it.id for it in load_table(committed, tiers=["small"]).items
    }
    assert {it.id for it in merged.items} == done and done <= ids
    # the whole-test-set run scored fewer verifiers: only those every item has are compared
    assert "self_consistency[k=3]" not in merged.verifiers and "execution" in merged.verifiers
    assert left_out == ['cross_tier[tier="large"]', "cross_tier_min", "cross_tier_top1"]
    # the first run gives an item and the per-token rate: the same answers, priced the same
    alone, _ = local_table([committed])
    by_id = {it.id: it for it in merged.items}
    for it in alone.items:
        assert by_id[it.id].tiers[0].text == it.tiers[0].text
        assert by_id[it.id].tiers[0].cost_usd == pytest.approx(it.tiers[0].cost_usd)
