"""A mixed workload: suite items reused from their own runs (never regenerated), open-ended prompts
generated but never graded, each item judged by the task the service detects, the interleaving
fixed by the seed, and the per-task table checked by hand on a tiny workload."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from evals.mixed import default_classifier, plan_mixed, report_rows, run_mixed, table_rows
from evals.runner import EvalPlan, run_eval
from evals.store import RunStore
from evals.suites import get_suite
from evals.suites.base import Suite
from evals.suites.jsonl import JsonlSuite
from evals.suites.mixed import Mixed, OpenEnded
from router.cli import main
from router.config import Settings, load_settings
from router.generation import GenerationRequest
from tests.support.evals import Calls, ScriptedBackend, registry, small_reply, write_config, write_suite

OPEN = [
    "Write a poem about autumn leaves.",  # no rule: open-ended
    "Tell me how tea is made, for a child.",  # no rule: open-ended
    "Name 2 rivers longer than 1000 km?",  # two numbers and a question: the service takes it for maths
]
# open-ended prompts accept any answer at the small tier; other tasks keep the tier's own policy
OPEN_POLICY = 'name = "keyword"\n[tiers.tasks.open_ended]\nthreshold = 0.0'


def _sums(request: GenerationRequest) -> int | None:
    m = re.search(r"What is (\d+) \+ 100", request.last_user_text())
    return int(m.group(1)) if m else None


def small(request: GenerationRequest) -> str:
    return small_reply(request) if _sums(request) is not None else "a fine answer"


def large(request: GenerationRequest) -> str:
    i = _sums(request)
    return "a better answer" if i is None else f"the answer is {i + 100}"


def backends() -> dict[str, ScriptedBackend]:
    return {"small": ScriptedBackend("small", small), "large": ScriptedBackend("large", large)}


def write_open(tmp: Path, texts: list[str]) -> Path:
    path = tmp / "open.jsonl"
    rows = [{"text": t, "task": "open_ended", "source": "test", "group": t} for t in texts]
    rows.insert(1, {"text": "What is 3 times 4?", "task": "maths", "source": "test", "group": "x"})  # not open-ended
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sums_suite(tmp: Path, n: int = 4) -> Suite:
    suite = JsonlSuite(write_suite(tmp, n))
    suite.task = "math"  # a maths suite, as GSM8K is
    return suite


async def origin_run(runs: Path, suite: Suite, settings: Settings) -> dict[str, ScriptedBackend]:
    """The suite's own run, as `eval run --suite sums` makes it."""
    used = backends()
    plan = EvalPlan(suite=suite, items=suite.select(suite.load(), None, 0), settings=settings, tiers=["small", "large"])
    with RunStore(runs / suite.name) as store:
        await run_eval(plan, store, registry=registry(), backends=used)
    return used


async def mixed_run(tmp: Path, *, seed: int = 0) -> tuple[Path, dict[str, ScriptedBackend], Calls]:
    settings = load_settings(write_config(tmp, verifier=OPEN_POLICY))
    suite = sums_suite(tmp)
    runs = tmp / "runs"
    await origin_run(runs, suite, settings)
    mixed = Mixed([suite], OpenEnded(write_open(tmp, OPEN)))
    plan = plan_mixed(mixed.draw(None, None, seed), None, runs / "mixed")
    used, calls = backends(), Calls()
    await run_mixed(plan, runs, settings, ["small", "large"], registry=registry(calls), backends=used)
    return runs / "mixed", used, calls


async def test_suite_items_are_reused_from_their_runs_and_only_open_ended_prompts_are_generated(
    tmp_path: Path,
) -> None:
    root, used, calls = await mixed_run(tmp_path)
    for backend in used.values():
        asked = sorted(r.last_user_text() for r in backend.requests)
        assert asked == sorted(OPEN), backend.name  # no sums item generated again
    # the small tier's keyword verifier scored the open-ended answers only: the suite's were reused
    assert calls.scores == {"keyword": len(OPEN)}
    parts = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert parts == ["open_ended.maths", "open_ended.open_ended", "sums.maths"]
    # a second run computes nothing at all
    again = backends()
    settings = load_settings(tmp_path / "config.toml")
    mixed = Mixed([sums_suite(tmp_path)], OpenEnded(tmp_path / "open.jsonl"))
    plan = plan_mixed(mixed.draw(None, None, 0), None, root)
    summaries = await run_mixed(
        plan, tmp_path / "runs", settings, ["small", "large"], registry=registry(), backends=again
    )
    assert all(s.computed == 0 and not s.loaded_models for s in summaries.values())
    assert all(not b.requests for b in again.values())


async def test_per_task_table_on_a_hand_checked_workload(tmp_path: Path) -> None:
    root, _, _ = await mixed_run(tmp_path)
    rows = {r.task: r for r in await report_rows(root)}
    assert list(rows) == ["maths", "open_ended", "overall"]
    # maths: the 4 sums (q0 accepted right, q1 and q2 escalated and right at large, q3 accepted
    # wrong) and the river prompt, taken for maths, judged by the maths policy: escalated, ungraded.
    # small costs $0.001 an answer; large $0.01 for 10 input tokens + $0.002 per output word.
    maths = rows["maths"]
    assert (maths.items, maths.graded, maths.correct, maths.escalated, maths.agree) == (5, 4, 3, 3, 4)
    assert maths.cost_usd == pytest.approx(0.001 * 5 + 2 * 0.018 + 0.016)
    # open-ended: accepted at the small tier whatever its score (threshold 0), never graded
    open_ended = rows["open_ended"]
    assert (open_ended.items, open_ended.graded, open_ended.escalated, open_ended.agree) == (2, 0, 0, 2)
    assert open_ended.accuracy is None and open_ended.cost_usd == pytest.approx(0.002)
    overall = rows["overall"]
    assert (overall.items, overall.graded, overall.correct, overall.escalated, overall.agree) == (7, 4, 3, 3, 6)
    cells = {c[0]: c for c in table_rows(list(rows.values()))}
    assert cells["maths"][1:] == ["5", "4", "75.0% (3/4)", "$11.4000", "60.0%", "80.0%"]
    assert cells["open_ended"][3] == "n/a" and cells["open_ended"][4] == "$1.0000"
    assert cells["overall"][1:] == ["7", "4", "75.0% (3/4)", f"${59 / 7:.4f}", f"{3 / 7:.1%}", f"{6 / 7:.1%}"]


async def test_open_ended_prompts_are_stored_ungraded_and_judged_by_the_detected_task(tmp_path: Path) -> None:
    root, _, _ = await mixed_run(tmp_path)
    index = json.loads((root / "mixed.json").read_text())
    by_text = {e["id"]: e for e in index["items"]}
    open_items = [e for e in index["items"] if e["origin"] == "open_ended"]
    assert len(open_items) == 3 and not any(e["graded"] for e in open_items)
    assert {e["task"] for e in open_items} == {"open_ended", "maths"}
    river = next(e for e in open_items if e["task"] == "maths")
    assert river["why"].startswith("word problem") and by_text[river["id"]]["origin_task"] == "open_ended"
    with RunStore(root / "open_ended.open_ended") as store:
        assert {g.detail for g in store.grades.records.values()} == {"ungraded: no reference answer"}
        manifest = store.manifest()
    assert manifest["tiers"][0]["task"] == "open_ended" and manifest["tiers"][0]["threshold"] == 0.0
    assert RunStore(root / "open_ended.maths").manifest()["tiers"][0]["threshold"] == 0.5


def test_interleaving_is_fixed_by_the_seed_and_keeps_each_suites_own_draw(tmp_path: Path) -> None:
    suite = sums_suite(tmp_path, 20)
    open_suite = OpenEnded(write_open(tmp_path, [f"Write a haiku about the colour {c}." for c in "abcdefghij"]))

    def ids(seed: int, limit: int | None = 6, open_limit: int | None = 4) -> list[str]:
        return [item.id for _, item in Mixed([suite], open_suite).draw(limit, open_limit, seed)]

    assert ids(0) == ids(0)
    assert ids(0) != ids(1)
    assert sorted(ids(3)) == sorted(
        [i.id for i in suite.select(suite.load(), 6, 3)] + [i.id for i in open_suite.select(open_suite.load(), 4, 3)]
    )
    assert len(ids(0, None, None)) == 20 + 10  # the maths row of the prompts file is not open-ended
    assert [i for i in ids(0, 6, 0) if i.startswith("open_ended/")] == []


def test_the_committed_classifier_is_the_services_choice(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    assert default_classifier(settings) is not None
    off = settings.model_copy(update={"cascade": settings.cascade.model_copy(update={"task_classifier": False})})
    assert default_classifier(off) is None
    assert isinstance(get_suite("mixed"), Mixed)


@pytest.mark.slow
def test_eval_run_mixed_with_the_smol_model_writes_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command end to end on the real test model: two open-ended prompts, no suite items."""
    config = write_config(tmp_path, verifier=OPEN_POLICY.replace("keyword", "confidence"))
    out = tmp_path / "report"
    argv = ["eval", "run", "--config", str(config), "--suite", "mixed", "--runs-dir", str(tmp_path / "runs")]
    argv += ["--limit", "0", "--open-ended", "2", "--open-ended-max-tokens", "8", "--report", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "open_ended" in printed and "n/a" in printed
    md = (out / "mixed.md").read_text()
    assert "| open_ended | 2 | 0 | n/a |" in md
    assert "tierroute eval run --suite mixed" in md and "--open-ended 2" in md
    with RunStore(tmp_path / "runs" / "mixed" / "open_ended.open_ended") as store:
        assert len(store.generations.records) == 4  # two prompts, two tiers
        assert all(g.completion_tokens <= 8 for g in store.generations.records.values())
