"""Replay a stored eval run through the live cascade.

A run holds every tier's answer to every item and every verifier's score of each answer. Served
back as a backend (the stored generation) and as verifiers (the stored scores, with their cost),
the real `router.cascade.Cascade` decides each item exactly as the service would have: which tier
answers, whether it escalated, what it cost. The parity test compares that with the simulator
(`evals.sweep`) on the committed runs, so the service and the offline calibration cannot drift
apart unnoticed; live-traffic imports replay the same way.

A replayed request names its item by id (`GenerationRequest.prompt`); nothing of the item's text is
needed, so a run replays without its suite's data. For the same reason the item's task is not
detected from its text: it is the suite's (`Replay.task`), handed to the cascade, which picks each
tier's policy for it exactly as it does for a detected task.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evals.runner import verifier_fingerprint
from evals.store import GenerationRecord, RunStore, ScoreRecord, generation_key, score_key
from evals.sweep import CONFIG
from router.backends.base import Backend
from router.cascade import Cascade, Tier
from router.config import CascadeSettings, PriceSettings, TierSettings
from router.errors import ConfigError
from router.generation import Delta, Generation, GenerationRequest
from router.policy import TaskPolicy
from router.tasks import TaskLabel, task_of_suite
from router.verification import Score, VerifierCost, VerifierSet, WeightedVerifier


def replay_request(item_id: str) -> GenerationRequest:
    """The request that stands for a stored item."""
    return GenerationRequest(prompt=item_id, max_tokens=1 << 20)


class ReplayBackend(Backend):
    """A tier that answers each item with its stored generation."""

    def __init__(self, name: str, generations: Mapping[str, GenerationRecord]) -> None:
        super().__init__(name)
        self.generations = generations  # item id -> record

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        record = self.generations.get(request.prompt or "")
        if record is None:
            raise ConfigError(f"tier {self.name}: no stored answer for item {request.prompt!r}")
        yield record.to_generation()


@dataclass
class StoredVerifier:
    """A verifier that returns the stored score of a tier's answer to an item."""

    name: str
    scores: Mapping[str, ScoreRecord]  # item id -> record

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        rec = self.scores.get(request.prompt or "")
        if rec is None:
            raise ConfigError(f"verifier {self.name}: no stored score for item {request.prompt!r}")
        cost = VerifierCost(rec.cost_prompt_tokens, rec.cost_completion_tokens, rec.cost_seconds, rec.cost_tier)
        return Score(rec.value, rec.reason, dict(rec.details), cost)


@dataclass
class StoredPreRouter:
    """A pre-router whose probability for an item is a stored score of the tier's answer to it
    (what `evals.sweep.PreRoutePolicy` reads under the same label); no score reads as NaN, which
    skips nothing, as a missing probability skips nothing offline."""

    label: str
    threshold: float
    scores: Mapping[str, ScoreRecord]  # item id -> record

    @property
    def version(self) -> str:
        return f"stored:{self.label}"

    def probability(self, request: GenerationRequest) -> float:
        rec = self.scores.get(request.prompt or "")
        return math.nan if rec is None or rec.value is None else rec.value


class Replay:
    """A stored run's tiers, answers and scores, ready to be put behind a cascade."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.manifest = store.manifest()
        self.snapshots: list[dict[str, Any]] = self.manifest["tiers"]
        extra = self.manifest.get("verifiers", [])
        self._specs: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {}
        for snap in self.snapshots:
            labels = {v["label"]: (v["name"], v["params"]) for v in [*snap["verifiers"], *extra]}
            self._specs[snap["name"]] = labels
        self.item_ids = [entry["id"] for entry in self.manifest["items"]]
        suite = self.manifest.get("suite", {})
        # every item of a run is of its suite's task
        self.task = TaskLabel(task_of_suite(suite.get("task", "text")), f"suite {suite.get('name', '?')}")

    def _gen_key(self, snap: Mapping[str, Any], entry: Mapping[str, Any]) -> str:
        return generation_key(snap["fingerprint"], entry["prompt_sha"])

    def backend(self, tier: str) -> ReplayBackend:
        snap = self._snap(tier)
        gens = {}
        for entry in self.manifest["items"]:
            rec = self.store.generations.records.get(self._gen_key(snap, entry))
            if rec is not None:
                gens[entry["id"]] = rec
        return ReplayBackend(tier, gens)

    def verifier(self, tier: str, label: str) -> StoredVerifier:
        snap = self._snap(tier)
        try:
            name, params = self._specs[tier][label]
        except KeyError:
            raise ConfigError(f"run {self.store.name}: tier {tier} has no verifier labelled {label!r}") from None
        fp = verifier_fingerprint(name, params)
        scores = {}
        for entry in self.manifest["items"]:
            rec = self.store.scores.records.get(score_key(self._gen_key(snap, entry), fp))
            if rec is not None:
                scores[entry["id"]] = rec
        return StoredVerifier(label, scores)

    def verifier_set(self, tier: str, label: str) -> VerifierSet:
        """`label`'s stored scores, or for CONFIG the tier's configured verifiers as configured."""
        snap = self._snap(tier)
        if label != CONFIG:
            return VerifierSet([WeightedVerifier(self.verifier(tier, label), 1.0)])
        members = [WeightedVerifier(self.verifier(tier, v["label"]), v["weight"]) for v in snap["verifiers"]]
        return VerifierSet(members, snap.get("combine", "mean"))

    def cascade(
        self,
        label: str,
        thresholds: Sequence[float],
        *,
        settings: CascadeSettings | None = None,
        tasks: Mapping[str, Sequence[float]] | None = None,
        prerouter: str | None = None,
        skip_below: Sequence[float] = (),
    ) -> Cascade:
        """The run's tiers in order, each but the last verified by `label` at its threshold, the
        last by its own configured verifiers (run on every answer it gives, as in the service).
        `tasks` gives tiers policies per task: the same verifiers at other thresholds (one per
        tier but the last), used for requests of that task. `prerouter` puts a pre-router in front
        of each tier but the last, its probability the stored score labelled so, skipping below
        that tier's `skip_below`."""
        if prerouter is not None and len(skip_below) != len(self.snapshots) - 1:
            raise ValueError("one skip_below per tier but the last")
        if len(thresholds) != max(1, len(self.snapshots) - 1):
            raise ValueError("one threshold per tier but the last")
        if any(len(ths) != len(thresholds) for ths in (tasks or {}).values()):
            raise ValueError("one threshold per tier but the last, for every task")
        tiers = []
        last = len(self.snapshots) - 1
        for i, snap in enumerate(self.snapshots):
            name = snap["name"]
            threshold = thresholds[min(i, len(thresholds) - 1)] if i < last or last == 0 else 0.0
            ts = TierSettings(
                name=name,
                backend="replay",
                price=PriceSettings(**snap["price"]),
                threshold=threshold,
                max_tokens=1 << 20,
                timeout_s=1e9,
                verify_timeout_s=1e9,
            )
            verifiers = self.verifier_set(name, label if i < last else CONFIG)
            judges = {}
            for task, ths in (tasks or {}).items():
                at = ths[min(i, len(ths) - 1)] if i < last or last == 0 else 0.0
                judges[task] = TaskPolicy(verifiers, verifiers.combine, at, task)  # type: ignore[arg-type]  # combine: a checked str
            pre = None
            if prerouter is not None and i < last:
                pre = StoredPreRouter(prerouter, skip_below[i], self.verifier(name, prerouter).scores)
            tiers.append(Tier(ts, self.backend(name), verifiers, prerouter=pre, tasks=judges))
        return Cascade(tiers, settings or CascadeSettings())

    def _snap(self, tier: str) -> dict[str, Any]:
        for snap in self.snapshots:
            if snap["name"] == tier:
                return snap
        raise ConfigError(f"run {self.store.name} has no tier {tier}")
