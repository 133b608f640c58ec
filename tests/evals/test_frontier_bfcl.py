"""GPT-4o and GPT-4-turbo as the bfcl suite's top tier: the leaderboard's published per-item
correctness read and checked, imported as an eval run priced at list prices with the committed
token estimates, and joined with a local small tier's run (made by the real runner, a scripted
backend and the real `tool_call` verifier) by `tierroute eval frontier --local bfcl=RUN`; the
page's figures held to a hand computation from the stored per-item costs."""

from __future__ import annotations

import asyncio
import csv
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from evals.bfcl_checks import as_qwen_answer, canonical_calls
from evals.frontier.bfcl import GPT4_TURBO, GPT4O, PRICES, TOPS, V1_CATEGORIES, load, write_run
from evals.runner import EvalPlan, run_eval
from evals.store import RunStore
from evals.suites import get_suite
from evals.suites.bfcl import BFCL, CATEGORIES, DATA
from evals.sweep import CascadePolicy, load_table, route_cost
from router.cli import main
from router.config import VerifierSpec, load_settings
from router.errors import ConfigError
from router.generation import Generation, GenerationRequest
from tests.support.evals import ScriptedBackend, write_config
from verifiers.base import Registry, Score
from verifiers.tool_call import make_tool_call

N_LOCAL = 120


def _copy(tmp: Path) -> Path:
    root = tmp / "bfcl"
    shutil.copytree(DATA, root)
    return root


def _edit_csv(root: Path, edit: Callable[[list[dict[str, str]]], list[dict[str, str]]]) -> None:
    path = root / "per_item_correct.csv"
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    rows = edit(rows)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["model", "v1_category", "index0", "correct"], lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def test_the_committed_correctness_reads_back_with_the_leaderboards_accuracies() -> None:
    pub = load(DATA)
    assert len(pub.items) == 1000 and set(pub.correct) == set(TOPS)
    right = {
        t: {c: sum(pub.correct[t][f"bfcl/{c}_{i}"] for i in range(n)) for c, (_, n) in V1_CATEGORIES.items()}
        for t in TOPS
    }
    # recounted from the file: the leaderboard's per-category accuracies (2024-08-11) for these two
    assert right[GPT4O] == {
        "simple": 366,
        "multiple_function": 181,
        "parallel_function": 186,
        "parallel_multiple_function": 169,
    }
    assert right[GPT4_TURBO] == {
        "simple": 365,
        "multiple_function": 184,
        "parallel_function": 181,
        "parallel_multiple_function": 171,
    }
    # the item the leaderboard's v1 data could not grade: failed by every model
    assert not any(pub.correct[t]["bfcl/parallel_multiple_function_179"] for t in TOPS)
    assert pub.tokenizer["model"] == "qwen2.5-coder-0.5b-instruct-q4_k_m"
    assert all(p >= 60 and a >= 10 for p, a in pub.tokens.values())  # a function definition, a call
    # the committed files are the ones SHA256SUMS pins
    sums = dict(line.split()[::-1] for line in (DATA / "SHA256SUMS").read_text().splitlines())
    for name in ("per_item_correct.csv", "frontier_tokens.json"):
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == sums[name], name


def test_each_published_index_names_the_suites_item_at_that_position() -> None:
    loaded = BFCL(categories=tuple(CATEGORIES)).load()
    for v1, (ours, n) in V1_CATEGORIES.items():
        mine = [it.id for it in loaded if it.group == ours]
        assert mine == [f"bfcl/{v1}_{i}" for i in range(n)]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda rows: [{**r, "correct": "2"} if i == 5 else r for i, r in enumerate(rows)],
            "line 7: correct must be 0 or 1",
        ),
        (
            lambda rows: [{**r, "v1_category": "java"} if i == 0 else r for i, r in enumerate(rows)],
            "unknown v1 category",
        ),
        (lambda rows: [{**r, "index0": "400"} if i == 0 else r for i, r in enumerate(rows)], "outside simple's 400"),
        (lambda rows: rows + [r for r in rows if r["model"] == "gpt-4o-2024-08-06-FC"][:1], "twice"),
        (
            lambda rows: [r for r in rows if not (r["model"] == "gpt-4o-2024-08-06-FC" and r["index0"] == "7")],
            "lacks 4",
        ),
    ],
)
def test_a_malformed_correctness_file_is_refused_naming_the_line(tmp_path: Path, edit: object, message: str) -> None:
    root = _copy(tmp_path)

    def retarget(rows: list[dict[str, str]]) -> list[dict[str, str]]:
        ours = [r for r in rows if r["model"] == "gpt-4o-2024-08-06-FC"]
        rest = [r for r in rows if r["model"] != "gpt-4o-2024-08-06-FC"]
        return edit(ours) + rest  # type: ignore[operator,no-any-return]

    _edit_csv(root, retarget)
    with pytest.raises(ConfigError, match=message):
        load(root)


def test_token_estimates_must_cover_every_item(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    body = json.loads((root / "frontier_tokens.json").read_text())
    del body["items"]["bfcl/simple_3"]
    (root / "frontier_tokens.json").write_text(json.dumps(body))
    with pytest.raises(ConfigError, match="must cover exactly the 1000"):
        load(root)
    body["items"]["bfcl/simple_3"] = [-1, 3]
    (root / "frontier_tokens.json").write_text(json.dumps(body))
    with pytest.raises(ConfigError, match="bfcl/simple_3 prompt must be a token count"):
        load(root)


def test_the_published_tiers_are_a_run_priced_at_list_prices(tmp_path: Path) -> None:
    pub = load(DATA)
    root = write_run(pub, get_suite("bfcl"), tmp_path / "runs")
    table = load_table(RunStore(root))
    assert [t.name for t in table.tiers] == [GPT4O, GPT4_TURBO]
    assert len(table.items) == 800  # the default suite: parallel_multiple is not loaded
    published = RunStore(root).manifest()["published"]
    assert published["matched"] == {"published": 1000, "suite": 800, "kept": 800, "not_in_suite": 200}
    assert PRICES[GPT4O].input_per_1m == 2.5 and PRICES[GPT4O].output_per_1m == 10.0
    assert PRICES[GPT4_TURBO].input_per_1m == 10.0 and PRICES[GPT4_TURBO].output_per_1m == 30.0
    for it in table.items:
        p, a = pub.tokens[it.id]
        four, turbo = it.tiers
        assert (four.prompt_tokens, four.completion_tokens) == (p, a) and four.text == ""
        assert four.cost_usd == pytest.approx((2.5 * p + 10 * a) / 1e6)
        assert turbo.cost_usd == pytest.approx((10 * p + 30 * a) / 1e6)
        assert four.correct == pub.correct[GPT4O][it.id] and turbo.correct == pub.correct[GPT4_TURBO][it.id]
    assert sum(it.tiers[0].correct for it in table.items) == 366 + 181 + 186
    # rewritten whole, not appended to
    write_run(pub, get_suite("bfcl"), tmp_path / "runs")
    assert len((root / "grades.jsonl").read_text().splitlines()) == 1600


class _Sure:
    """Scores 0.9 where the scripted answer was written sure of itself (a marker only the test's
    backend and verifier know), else 0.2."""

    name = "sure"

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        return Score(0.9 if candidate.text.startswith("<tool_call>\n") else 0.2, "sure")


def _local_run(tmp: Path) -> Path:
    """The small tier on N_LOCAL bfcl items through the real runner: right (the ground truth's own
    calls) on two items in three, a wrong value on the rest; unsure of itself on the wrong ones and on
    every seventh right one."""
    suite = get_suite("bfcl")
    items = suite.select(suite.load(), N_LOCAL, 0)
    by_question = {it.messages[0].content: (n, it) for n, it in enumerate(items)}

    def reply(request: GenerationRequest) -> str:
        n, item = by_question[request.last_user_text()]
        calls = canonical_calls(item.answer_key.reference)
        if n % 3 == 2:  # wrong: the first argument's value replaced
            name, args = calls[0]
            calls[0] = (name, {k: "no such value" for k in args} or {"x": 1})
        text = as_qwen_answer(calls)
        unsure = n % 3 == 2 or n % 7 == 0
        return text.replace("<tool_call>\n", "<tool_call>", 1) if unsure else text

    reg = Registry()
    reg.register("tool_call", make_tool_call)
    reg.register("sure", lambda params, ctx: _Sure())
    plan = EvalPlan(
        suite=suite,
        items=items,
        settings=load_settings(write_config(tmp, verifier='name = "tool_call"')),
        tiers=["small"],
        verifiers=[VerifierSpec(name="tool_call"), VerifierSpec(name="sure")],
    )
    root = tmp / "runs" / "bfcl-small"
    with RunStore(root) as store:
        asyncio.run(
            run_eval(plan, store, registry=reg, backends={"small": ScriptedBackend("small", reply, busy_s=0.02)})
        )
    return root


def test_eval_frontier_reports_both_cascades_from_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _local_run(tmp_path)
    small = load_table(RunStore(run))
    assert len(small.items) == N_LOCAL
    assert sum(it.tiers[0].correct for it in small.items) == N_LOCAL - N_LOCAL // 3  # the grader reads what was written
    out, runs = tmp_path / "out", tmp_path / "published"
    args = ["eval", "frontier", "--local", f"bfcl={run}", "--runs-dir", str(runs), "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / "bfcl.md"), str(out / "bfcl.csv")]  # no GSM8K/MMLU page without their runs
    page = (out / "bfcl.md").read_text()
    assert f"--bfcl-data evals/data/bfcl --runs-dir {runs}" in page
    assert "## small → gpt-4o-2024-08-06" in page and "## small → gpt-4-turbo-2024-04-09" in page
    assert "$2.5 / $10 per 1M" in page and "$10 / $30 per 1M" in page
    assert "published per-item correctness" in page and "answers were not published" in page
    assert f"Items with small-tier results: {N_LOCAL}; of them with published results: **{N_LOCAL}**" in page

    # a held-out figure by hand: the chosen policy's cost over the top tier's, item by item
    rows = list(csv.DictReader((out / "bfcl.csv").open()))
    assert {r["cascade"] for r in rows} == {"small → gpt-4o-2024-08-06", "small → gpt-4-turbo-2024-04-09"}
    assert {r["verifier"] for r in rows} == {"config", "tool_call", "sure"}  # config: the tier's own verifiers
    from evals.calibrate import split
    from evals.frontier.cascade import join, local_table

    local, _ = local_table([RunStore(run)])
    frontier = load_table(RunStore(runs / "bfcl-published"))
    for row in rows:
        top = row["cascade"].split(" → ")[1]
        table = join(local, frontier, [top])
        _, held = split(table, 0, 0.5)
        thresholds = tuple(float(t) for t in row["thresholds"].split("/"))
        policy = CascadePolicy(row["verifier"], thresholds)
        spent = sum(route_cost(it, policy.route(it))[0] for it in held.items)
        top_spent = sum(it.tiers[1].cost_usd for it in held.items)
        p, a = zip(*((it.tiers[1].prompt_tokens, it.tiers[1].completion_tokens) for it in held.items), strict=True)
        price = PRICES[top]
        assert top_spent == pytest.approx((price.input_per_1m * sum(p) + price.output_per_1m * sum(a)) / 1e6)
        assert float(row["saved"]) == pytest.approx(1 - spent / top_spent, abs=1e-6)
        assert int(row["n_held_out"]) == len(held.items) and 0 < len(held.items) < N_LOCAL
    # `sure` sends up the unsure answers (the wrong third and every seventh right one): it meets 95% of
    # the top tier's accuracy on both cascades, escalating those and no more
    unsure = [it for it in held.items if it.tiers[0].scores["sure"] < 0.5]
    sure = [r for r in rows if r["verifier"] == "sure" and r["share"] == "0.95"]
    assert len(sure) == 2 and all(r["met_calibration"] == "True" for r in sure)
    assert all(float(r["escalation_rate"]) == pytest.approx(len(unsure) / len(held.items)) for r in sure)


def test_a_local_run_of_another_suite_is_refused_for_bfcl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.evals import make_run

    run = asyncio.run(make_run(tmp_path, n=6))
    args = [
        "eval",
        "frontier",
        "--local",
        f"bfcl={run}",
        "--runs-dir",
        str(tmp_path / "p"),
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(args) != 0
    assert "no item of the local runs has published results" in capsys.readouterr().err
