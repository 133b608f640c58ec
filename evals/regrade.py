"""Regrade a stored run with its suite's current grader, from the stored answers: no model.

A grade is keyed by the suite's grader version (`Suite.version`, in `evals.store.grade_key`), so
a grader that changed leaves a run's stored grades under the old version, and `load_table` reads
only the version the manifest names. `eval run` would grade the missing ones too, but it starts
every tier's backend to do so; a grader needs nothing but the answers, so this grades each stored
answer of the run's own items and tiers exactly as the runner does (`evals.runner.grade_stored`),
appends the new grades beside the old ones (the log keeps both; the report can be rebuilt at
either version), and names the new version in the manifest.

The items are read back from the suite and checked against the prompts the run stored: a suite
whose questions changed is another suite, and its answer key would grade other questions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from evals.runner import grade_stored
from evals.store import RunStore, generation_key, grade_key
from evals.suites.base import Suite
from router.errors import ConfigError


@dataclass
class RegradeSummary:
    run: str
    before: str  # the grader version the manifest named
    after: str
    graded: int = 0  # answers graded at the new version (0 when it was already current)
    changed: list[str] = field(default_factory=list)  # "tier item: was -> now" where the verdict moved


async def regrade(store: RunStore, suite: Suite, cache_dir: Path | None = None) -> RegradeSummary:
    """Grade every stored answer of `store` that lacks a grade at `suite`'s current version, and
    make that version the run's. Refuses a run of another suite, or one whose items the suite no
    longer has as they were asked."""
    manifest = store.manifest()
    recorded = manifest["suite"]
    if recorded["name"] != suite.name:
        raise ConfigError(f"run {store.name} holds suite '{recorded['name']}', not '{suite.name}'")
    by_id = {item.id: item for item in suite.load(cache_dir)}
    summary = RegradeSummary(store.name, recorded["fingerprint"], suite.fingerprint)
    for entry in manifest["items"]:
        item = by_id.get(entry["id"])
        if item is None or item.prompt_sha != entry["prompt_sha"]:
            raise ConfigError(f"run {store.name}: item {entry['id']} is not in suite {suite.name} as it was asked")
        for tier in manifest["tiers"]:
            gk = generation_key(tier["fingerprint"], entry["prompt_sha"])
            rec = store.generations.records.get(gk)
            if rec is None or grade_key(gk, suite.fingerprint, item.id) in store.grades.records:
                continue
            new = await grade_stored(suite, item, rec)
            store.add_grade(new)
            summary.graded += 1
            old = store.grades.records.get(grade_key(gk, recorded["fingerprint"], item.id))
            if old is not None and old.correct != new.correct:
                summary.changed.append(f"{tier['name']} {item.id}: {_verdict(old.correct)} -> {_verdict(new.correct)}")
    if recorded["fingerprint"] != suite.fingerprint:
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        store.write_manifest({**manifest, "suite": {**recorded, "fingerprint": suite.fingerprint}, "updated": stamp})
    return summary


def _verdict(correct: bool) -> str:
    return "right" if correct else "wrong"
