"""What the learned estimators learn from: per (item, tier) of stored runs, the request the tier was
sent (rebuilt from the suite and checked against the run's hash), its stored answer, the stored
verifier scores, and the grader's verdict; and which verifiers' scores become features.

A feature verifier a run lacks is computed here on the stored answers, with the same verifier code
the learned verifier runs when serving, so training and serving see the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evals.learned_comparison import LEARNED, PREROUTER
from evals.store import RunStore, generation_key
from evals.sweep import ResultTable, load_table
from router.errors import ConfigError
from router.generation import Generation, GenerationRequest
from router.learned.features import VerifierRef
from router.plugins import VerifierRegistry
from router.verification import VerifierContext, VerifierError, spec_uses_a_model
from verifiers.learned import score_or_zero

PURE = frozenset({"confidence", "format", "math_answer"})  # functions of request and answer alone, microseconds


@dataclass
class RunData:
    table: ResultTable
    requests: dict[str, GenerationRequest]  # item id -> the request every tier was sent (its messages)
    generations: dict[tuple[str, int], Generation]  # (item id, tier index) -> the stored answer
    costly: set[str]  # verifier labels whose stored scores paid for generations

    @property
    def name(self) -> str:
        return self.table.run


def load_run(
    path: Path, *, suite: str | None = None, cache_dir: Path | None = None, tiers: Sequence[str] | None = None
) -> RunData:
    """A run's priced table, with the prompts rebuilt from its suite (checked against the hash
    the run recorded) and the stored generations."""
    store = RunStore(path)
    table = load_table(store, tiers=tiers)
    m = table.manifest
    suite_obj = _suite_of(m, suite)
    items = {it.id: it for it in suite_obj.load(cache_dir)}
    kept = {it.id for it in table.items}
    requests = {}
    generations = {}
    snaps = {t["name"]: t for t in m["tiers"]}
    for entry in m["items"]:
        if entry["id"] not in kept:
            continue
        item = items.get(entry["id"])
        if item is None or item.prompt_sha != entry["prompt_sha"]:
            raise ConfigError(
                f"run {store.name}: item {entry['id']} is not what the run asked (the suite's data or prompt format "
                "changed since); train on a run made with this version of the suite"
            )
        # what the suite adds as a caller would (a response_format), as the runner sent it
        requests[item.id] = suite_obj.request(
            item,
            GenerationRequest(
                messages=item.messages,
                max_tokens=suite_obj.max_tokens,
                metadata={"task": suite_obj.task, "client_code": True},
            ),
        )
        for i, info in enumerate(table.tiers):
            rec = store.generations.records[generation_key(snaps[info.name]["fingerprint"], entry["prompt_sha"])]
            generations[(item.id, i)] = rec.to_generation()
    costly = {r.verifier for r in store.scores.records.values() if r.cost_prompt_tokens or r.cost_completion_tokens}
    return RunData(table, requests, generations, costly)


def _suite_of(manifest: dict[str, Any], explicit: str | None) -> Any:
    from evals.suites import get_suite

    if explicit:
        return get_suite(explicit)
    name = manifest["suite"]["name"]
    try:
        return get_suite(name)
    except ConfigError:
        # a JSONL suite is recorded by its file's stem; its source names the path
        path = str(manifest["suite"].get("source", "")).split(" (sha256", 1)[0]
        if path.endswith(".jsonl") and Path(path).is_file():
            return get_suite(path)
        raise ConfigError(f"run {manifest['name']}: cannot find suite '{name}'; name it with --suite") from None


def _uses_a_model(registry: VerifierRegistry, name: str, params: dict[str, Any]) -> bool:
    """Whether the named verifier asks a model for work (`uses_model`); one that does not build here
    (a plugin not installed) is judged by its stored scores' cost alone, as before."""
    try:
        return spec_uses_a_model(registry, name, params)
    except VerifierError:
        return False


def feature_verifiers(
    runs: Sequence[RunData], *, include_costly: bool = False, deciding_tiers: bool = False
) -> list[VerifierRef]:
    """The verifiers whose scores are features: every eval verifier scored on every item at
    every tier of every run (same name and params everywhere), so the learned verifier computes
    them at serve time exactly as they were stored; and, pooling suites, every pure one (see
    `PURE`) scored on any of them, computed for the other suites' answers by `fill_scores`.

    With `deciding_tiers`, "every tier" means every tier whose answer can be escalated (all but the
    last): the learned verifier is then trained for those tiers only, and a verifier that reads the
    next tier, such as `cross_tier`, which has nothing to score the last tier's answer with, can be a
    feature.

    Why not the sandboxed `code_tests` too: pooled with GSM8K, a linear model cannot tell a
    HumanEval answer passing its doctests from a GSM8K answer that is runnable Python without
    tests (both score well): pooling the committed GSM8K and HumanEval runs with it, the
    estimator's held-out AUROC fell below the best single verifier's on GSM8K in five of seven
    splits (it beat it on HumanEval in all seven). Train with ``--suite-specific`` to use it
    where the suite was scored with it."""
    registry = VerifierRegistry.from_entry_points()
    per_run = []
    for r in runs:
        refs = {}
        for v in r.table.manifest.get("verifiers", []):
            label, name = v["label"], v["name"]
            if label in (LEARNED, PREROUTER) or name == "learned":
                continue
            # costly: it asks a model for work on every request it scores, or its stored scores paid for some
            if not include_costly and (label in r.costly or _uses_a_model(registry, name, v["params"])):
                continue
            tiers = slice(0, -1) if deciding_tiers and len(r.table.tiers) > 1 else slice(None)
            if all(label in t.scores for it in r.table.items for t in it.tiers[tiers]):
                refs[label] = VerifierRef(label, name, dict(v["params"]))
        per_run.append(refs)
    common = (
        {k: ref for k, ref in per_run[0].items() if all(refs.get(k) == ref for refs in per_run[1:])} if per_run else {}
    )
    for refs in per_run:
        for k, ref in refs.items():
            same = all(other.get(k, ref) == ref for other in per_run)  # one label, one definition
            if ref.name in PURE and k not in common and same:
                common[k] = ref
    return [common[k] for k in sorted(common)]


def fill_scores(run: RunData, refs: Sequence[VerifierRef]) -> None:
    """Score the run's stored answers with the feature verifiers it lacks, as the learned
    verifier will at serve time (the same verifier code on the same request and answer); their
    time joins the stored verifiers' in the learned verifier's latency."""
    import asyncio
    import time
    from concurrent.futures import ThreadPoolExecutor

    from router.plugins import VerifierRegistry as Registry

    missing = [ref for ref in refs if any(ref.label not in t.scores for it in run.table.items for t in it.tiers)]
    if not missing:
        return
    reg = Registry.from_entry_points()

    async def one(verifier: Any, it: Any, ti: int) -> tuple[float | None, float]:
        t0 = time.monotonic()
        score = await score_or_zero(verifier, run.requests[it.id], run.generations[(it.id, ti)])
        return score.value, time.monotonic() - t0

    async def score_all() -> dict[tuple[str, int], dict[str, tuple[float | None, float]]]:
        out: dict[tuple[str, int], dict[str, tuple[float | None, float]]] = {}
        for ref in missing:
            made = [reg.create(ref.name, dict(ref.params), VerifierContext(tier=t.name)) for t in run.table.tiers]
            for it in run.table.items:
                for ti, t in enumerate(it.tiers):
                    if ref.label not in t.scores:
                        out.setdefault((it.id, ti), {})[ref.label] = await one(made[ti], it, ti)
        return out

    with ThreadPoolExecutor(1) as pool:  # a loop of its own, whether or not the caller runs one
        computed = pool.submit(asyncio.run, score_all()).result()
    items = []
    for it in run.table.items:
        tiers = []
        for ti, t in enumerate(it.tiers):
            new = computed.get((it.id, ti), {})
            tiers.append(
                replace(
                    t,
                    scores={**t.scores, **{k: v for k, (v, _) in new.items()}},
                    verify_cost_usd={**t.verify_cost_usd, **{k: 0.0 for k in new}},
                    verify_s={**t.verify_s, **{k: round(sec, 4) for k, (_, sec) in new.items()}},
                )
            )
        items.append(replace(it, tiers=tuple(tiers)))
    run.table = replace(run.table, items=items)
