"""The runner's cache: a rerun computes nothing, new verifiers, tiers and items only what is new,
and a crash mid-run loses only the items in flight."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.store import RunStore
from router.config import VerifierSpec, load_settings
from tests.support.evals import (
    Calls,
    FlakyVerifier,
    N,
    ScriptedBackend,
    large_reply,
    plan_for,
    question_number,
    registry,
    run,
    scripted,
    write_config,
)


async def test_first_run_stores_every_tier_item_verifier_and_grade(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "sums"
    summary = await run(plan_for(tmp_path), root, scripted())
    assert summary.failed == []
    assert (summary.generated, summary.graded) == (2 * N, 2 * N)
    # every tier is scored with its own verifiers and the eval's: keyword on small, length on both
    assert summary.scored == N * 2 + N
    store = RunStore(root)
    assert len(store.generations.records) == 2 * N
    manifest = store.manifest()
    assert [t["name"] for t in manifest["tiers"]] == ["small", "large"]
    assert manifest["tiers"][0]["scored_with"] == ["keyword", "length"]
    assert {g.item for g in store.grades.records.values() if g.correct and g.tier == "small"} == {
        "q0",
        "q2",
        "q4",
        "q6",
    }


async def test_rerun_computes_nothing_and_loads_no_model(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "sums"
    await run(plan_for(tmp_path), root, scripted())
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    again = scripted()
    calls = Calls()
    summary = await run(plan_for(tmp_path), root, again, calls)
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before  # a committed run stays clean
    assert summary.computed == 0
    assert not summary.loaded_models
    assert all(b.started == 0 and not b.requests for b in again.values())
    assert calls.scores == {}


async def test_a_new_verifier_computes_only_its_scores(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "sums"
    await run(plan_for(tmp_path), root, scripted())
    backends, calls = scripted(), Calls()
    summary = await run(plan_for(tmp_path, verifiers=("length", "spy")), root, backends, calls)
    assert (summary.generated, summary.graded, summary.scored) == (0, 0, 2 * N)
    assert all(not b.requests for b in backends.values())  # no generation: outputs came from the store
    assert sum(len(s.seen) for s in calls.spies) == 2 * N
    assert calls.scores == {}  # keyword and length were not recomputed
    labels = {v["label"] for v in RunStore(root).manifest()["verifiers"]}
    assert labels == {"length", "spy"}


async def test_a_rerun_with_other_verifiers_keeps_what_the_tier_was_scored_with(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "sums"
    await run(plan_for(tmp_path), root, scripted())
    await run(plan_for(tmp_path, verifiers=("spy",)), root, scripted())
    small = RunStore(root).manifest()["tiers"][0]
    assert small["scored_with"] == ["keyword", "length", "spy"]


async def test_an_unavailable_score_is_not_stored_and_a_rerun_computes_it(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "sums"
    plan = plan_for(tmp_path, verifiers=("flaky",))
    summary = await run(plan, root, scripted())
    # odd questions timed out on the small and the large tier: reported, not stored as abstentions
    assert len([f for f in summary.failed if "verifier flaky" in f]) == N
    stored = [r for r in RunStore(root).scores.records.values() if r.verifier == "flaky"]
    assert len(stored) == N and all(r.value == 0.7 for r in stored)
    # once the scorer is back, the rerun computes exactly the missing ones
    FlakyVerifier.outage = False
    try:
        again = await run(plan, root, scripted())
    finally:
        FlakyVerifier.outage = True
    assert again.failed == [] and again.scored == N
    stored = [r for r in RunStore(root).scores.records.values() if r.verifier == "flaky"]
    assert len(stored) == 2 * N


async def test_a_new_tier_computes_only_that_tier(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "sums"
    await run(plan_for(tmp_path), root, scripted())
    xl = """
[[tiers]]
name = "xl"
backend = "llamacpp"
max_tokens = 64
[tiers.llamacpp]
model = "smollm2-135m-instruct-q4_1"
[tiers.price]
usd_per_1m_input_tokens = 1.0
usd_per_1m_output_tokens = 1.0
"""
    config = write_config(tmp_path, xl)
    backends = {"xl": ScriptedBackend("xl", large_reply)}
    summary = await run(plan_for(tmp_path, tiers=("xl",), config=config), root, backends)
    assert (summary.generated, summary.graded, summary.scored) == (N, N, N)
    assert [t["name"] for t in RunStore(root).manifest()["tiers"]] == ["small", "large", "xl"]


@pytest.mark.slow
async def test_growing_the_limit_adds_only_the_new_items(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "sums"
    first = await run(plan_for(tmp_path, limit=3), root, scripted())
    assert first.generated == 6
    backends = scripted()
    grown = await run(plan_for(tmp_path, limit=N), root, backends)
    assert grown.generated == 2 * (N - 3)
    assert len(RunStore(root).manifest()["items"]) == N


async def test_resume_after_a_crash_mid_run(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "sums"
    plan = plan_for(tmp_path)
    order = [question_number_of(item) for item in plan.items]
    doomed = order[4]  # two slots: some items finish before this one starts

    def crash(request):
        return RuntimeError("simulated crash") if question_number(request) == doomed else None

    with pytest.raises(RuntimeError, match="simulated crash"):
        await run(plan, root, scripted(fail_on=crash))
    stored = {r.item for r in RunStore(root).generations.records.values()}
    assert stored and f"q{doomed}" not in stored and len(stored) < N
    lost = N - len(stored)

    # a hard kill mid-write leaves a torn last line: it is skipped, and the next append starts clean
    gens = root / "generations.jsonl"
    torn = gens.read_text()
    gens.write_text(torn + torn.splitlines()[0][:40])
    assert RunStore(root).generations.skipped == 1

    backends = scripted()
    summary = await run(plan_for(tmp_path), root, backends)
    assert summary.failed == []
    assert summary.generated == lost + N  # the lost small items, and the whole large tier
    redone = {f"q{question_number(r)}" for r in backends["small"].requests}
    assert redone.isdisjoint(stored)
    store = RunStore(root)
    assert len(store.generations.records) == 2 * N and len(store.grades.records) == 2 * N
    assert store.generations.skipped == 1  # the torn line stays on its own line, ignored


def question_number_of(item) -> int:
    return int(item.id.removeprefix("q"))


async def test_each_verifier_is_made_once_and_no_prerouter_is_read(tmp_path: Path) -> None:
    # an eval generates and verifies by itself: the serving cascade's verifier sets and
    # pre-routers are not built, so a pre-router file that is not there does not matter
    config = write_config(tmp_path, verifier='name = "spy"')
    text = config.read_text().replace(
        '[[tiers]]\nname = "large"',
        f'[tiers.prerouter]\nartifact = "{tmp_path / "missing.json"}"\nsha256 = "{"0" * 64}"\nthreshold = 0.5\n\n'
        '[[tiers]]\nname = "large"',
    )
    assert "[tiers.prerouter]" in text
    config.write_text(text)
    calls = Calls()
    summary = await run(
        plan_for(tmp_path, verifiers=("spy",), config=config), tmp_path / "runs" / "sums", scripted(), calls
    )
    assert summary.failed == [] and summary.generated == 2 * N
    # the small tier's own spy and the eval's are one label: one spy per tier
    assert len(calls.spies) == 2
    assert [len(s.seen) for s in calls.spies] == [N, N]


async def test_a_tier_that_cannot_be_built_stops_the_run_before_any_model_loads(tmp_path: Path) -> None:
    from router.errors import ConfigError

    config = write_config(tmp_path, models=("smollm2-135m-instruct-q4_1", str(tmp_path / "absent.gguf")))
    backends = {"small": ScriptedBackend("small", large_reply)}
    with pytest.raises(
        ConfigError, match=r"cannot start:\n  tiers\[1\] \(large\)\.llamacpp\.model: model file not found"
    ):
        await run(plan_for(tmp_path, config=config), tmp_path / "runs" / "sums", backends)  # type: ignore[arg-type]
    assert backends["small"].started == 0 and not backends["small"].requests


async def test_unavailable_tier_is_not_stored_and_is_retried(tmp_path: Path) -> None:
    from router.errors import OverloadedError

    root = tmp_path / "runs" / "sums"

    def busy(request):
        return OverloadedError("queue full") if question_number(request) == 1 else None

    summary = await run(plan_for(tmp_path), root, scripted(fail_on=busy))
    assert len(summary.failed) == 1 and "q1" in summary.failed[0]
    again = await run(plan_for(tmp_path), root, scripted())
    assert (again.generated, again.graded) == (1, 1)


def test_width_sets_every_local_tiers_batch_and_nothing_else(tmp_path: Path) -> None:
    from evals.commands.run import _with_width
    from router.errors import ConfigError

    settings = load_settings(write_config(tmp_path))
    wide = _with_width(settings, 16)
    assert [t.llamacpp.n_parallel for t in wide.tiers if t.llamacpp] == [16] * sum(
        1 for t in settings.tiers if t.llamacpp
    )
    assert [t.name for t in wide.tiers] == [t.name for t in settings.tiers]
    assert [t.llamacpp.model for t in wide.tiers if t.llamacpp] == [
        t.llamacpp.model for t in settings.tiers if t.llamacpp
    ]
    assert _with_width(settings, None) is settings
    with pytest.raises(ConfigError, match="1 to 64"):
        _with_width(settings, 0)


def test_verifiers_that_generate_get_the_evals_deadline_unless_their_spec_sets_one(tmp_path: Path) -> None:
    # a serving bound (self_consistency's 120 s) times samples out under batched eval load, and a
    # timeout is no verdict: the eval's own deadline applies, without changing the label or cache key
    from evals.runner import _make_verifiers, _missing
    from router.admission.slots import host_sandboxes
    from router.plugins import VerifierRegistry

    plan = plan_for(tmp_path, verifiers=())
    plan.timeout_s = 900.0
    plan.verifiers = [
        VerifierSpec(name="self_consistency", params={"k": 2}),
        VerifierSpec(name="self_consistency", params={"k": 3, "timeout_s": 7}),
        VerifierSpec(name="execution", params={"second_opinion": True}),
    ]
    with RunStore(tmp_path / "runs" / "x") as store:
        work = _missing(plan, store, plan.tier_settings()[0])
    reg = registry()
    builtins = VerifierRegistry.from_entry_points()
    for name in ("self_consistency", "execution"):
        reg.register(name, builtins.get(name))
    host = host_sandboxes(plan.settings.sandbox)
    made = _make_verifiers(work, reg, scripted(), plan.timeout_s, host)
    by_label = {label: v for label, v in made.items() if label.startswith(("self_consistency", "execution"))}
    assert {label: getattr(v, "timeout_s", None) for label, v in by_label.items() if "self" in label} == {
        "self_consistency[k=2]": 900.0,
        "self_consistency[k=3,timeout_s=7]": 7,
    }
    execution = by_label["execution[second_opinion=true]"]
    assert execution.generation_timeout_s == 900.0  # type: ignore[attr-defined]
    assert execution.timeout_s == 10.0  # type: ignore[attr-defined]  # a sandbox run's bound is the verifier's meaning
    assert execution.ctx.sandboxes is host  # type: ignore[attr-defined]  # the run's one limit on sandboxed runs


def test_verifiers_from_another_run(tmp_path: Path) -> None:
    """`eval run --verifiers-from RUN_DIR`: that run's list, in order; no run there, an unreadable
    list or an empty one (which would read as "not given" and fall back to the defaults) are refused."""
    import json

    from evals.commands.run import _verifiers_of
    from router.errors import ConfigError

    run = tmp_path / "run"
    run.mkdir()
    listed = [
        {"name": "confidence", "params": {"stat": "min", "name": "confidence_min"}},
        {"name": "math_answer", "params": {}},
    ]
    (run / "manifest.json").write_text(json.dumps({"format": 1, "verifiers": listed}))
    assert [(v.name, v.params) for v in _verifiers_of(str(run))] == [(v["name"], v["params"]) for v in listed]
    assert _verifiers_of(None) == []
    with pytest.raises(ConfigError, match="no eval run there"):
        _verifiers_of(str(tmp_path / "nowhere"))
    (run / "manifest.json").write_text(json.dumps({"format": 1, "verifiers": [{"params": {}}]}))
    with pytest.raises(ConfigError, match="unreadable"):
        _verifiers_of(str(run))
    (run / "manifest.json").write_text(json.dumps({"format": 1, "verifiers": []}))
    with pytest.raises(ConfigError, match="lists no verifiers"):
        _verifiers_of(str(run))
