"""Wiring: settings -> backends, verifiers (each tier's own and its policies per task) and the
cascade, with one start/close for all of them.

The HTTP app, the CLI and the eval runner each build an `Engine` from settings; nothing here is a
module-level global, so tests build as many as they like side by side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from router import policy
from router.admission.slots import Slots, host_sandboxes
from router.backends.base import Backend
from router.cascade import Cascade, Tier
from router.config import Settings, TierSettings, VerifierSpec
from router.errors import ConfigError, ModelError
from router.plugins import BackendRegistry, SharedRegistry, VerifierRegistry
from router.policy import TaskPolicy
from router.tasks import TaskClassifier
from router.verification import VerifierContext, VerifierError, VerifierSet, WeightedVerifier

if TYPE_CHECKING:
    from router.learned.estimators import PreRouter


def load_prerouter(tier: TierSettings) -> PreRouter | None:
    """The tier's pre-router, read and checked against its configured SHA-256; a missing,
    tampered or malformed file is a ConfigError naming the key."""
    if tier.prerouter is None:
        return None
    from router.learned.estimators import EstimatorError, PreRouter

    cfg = tier.prerouter
    try:
        return PreRouter.load(cfg.artifact, cfg.sha256, tier.name, cfg.threshold)
    except EstimatorError as exc:
        raise ConfigError(f"tiers ({tier.name}).prerouter: {exc}") from None


def check_resources(
    settings: Settings,
    registry: VerifierRegistry | None = None,
    *,
    skip_models: Collection[str] = (),
    backends: BackendRegistry | None = None,
) -> list[str]:
    """What would stop the service starting, each naming the config key: unknown backends,
    missing or corrupt model files (except for the tiers in `skip_models`, whose backend is
    supplied), unknown verifiers, pre-router files that are missing or not the configured ones."""
    from router.models.catalog import resolve_model

    problems: list[str] = []
    reg = registry or VerifierRegistry.from_entry_points()
    breg = backends or BackendRegistry.from_entry_points()
    for i, tier in enumerate(settings.tiers):
        key = f"tiers[{i}] ({tier.name})"
        if tier.backend not in breg and tier.name not in skip_models:
            problems.append(f"{key}.backend: unknown backend '{tier.backend}'; known: {', '.join(breg.names())}")
        if tier.llamacpp is not None and tier.name not in skip_models:
            try:
                resolve_model(
                    tier.llamacpp.model,
                    settings.models.cache_dir,
                    sha256=tier.llamacpp.model_sha256,
                    allow_unpinned=tier.llamacpp.allow_unpinned,
                )
            except ModelError as exc:
                problems.append(f"{key}.llamacpp.model: {exc}")
            else:
                from router.backends.llama.backend import draft_problem

                if (why := draft_problem(tier.llamacpp, settings.models.cache_dir)) is not None:
                    problems.append(f"{key}.llamacpp.draft_model: {why}")
        lists = [(f"{key}.verifiers", tier.verifiers)]
        lists += [(f"{key}.tasks.{task}.verifiers", p.verifiers) for task, p in tier.tasks.items() if p.verifiers]
        for where, specs in lists:
            for j, spec in enumerate(specs):
                if spec.name not in reg.names():
                    problems.append(
                        f"{where}[{j}].name: unknown verifier '{spec.name}'; known: {', '.join(reg.names())}"
                    )
                elif (why := reg.unavailable(spec.name)) is not None:
                    problems.append(f"{where}[{j}] ({spec.name}): cannot run here: {why}")
        try:
            load_prerouter(tier)
        except ConfigError as exc:
            problems.append(str(exc))
    problems += _scoring_problems(settings, breg)
    return problems


def _scoring_problems(settings: Settings, breg: BackendRegistry) -> list[str]:
    """A `cross_tier` verifier must name a tier that can score a given answer by prefill."""
    by_name = {t.name: t for t in settings.tiers}
    problems: list[str] = []
    for i, tier in enumerate(settings.tiers):
        for j, spec in enumerate(tier.verifiers):
            if spec.name != "cross_tier":
                continue
            key = f"tiers[{i}] ({tier.name}).verifiers[{j}] (cross_tier).params.tier"
            scorer = by_name.get(str(spec.params.get("tier")))
            if scorer is None:
                problems.append(f"{key}: no tier named {spec.params.get('tier')!r}; known: {', '.join(by_name)}")
                continue
            if scorer.backend not in breg:
                continue  # reported above
            try:
                backend = breg.create(scorer, settings)
            except Exception:  # noqa: BLE001 - a tier that cannot be built is reported above
                continue
            why = type(backend).scoring_support(scorer)
            if why is not None:
                problems.append(f"{key}: tier '{scorer.name}' cannot score a given answer: {why}")
    return problems


@dataclass
class Engine:
    settings: Settings
    cascade: Cascade
    backends: Mapping[str, Backend]
    started: bool = field(default=False)
    # the host's sandbox slots every verifier's run and every shadow comparison that runs code shares
    sandboxes: Slots | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        only: Sequence[str] | None = None,
        registry: VerifierRegistry | None = None,
        backends: Mapping[str, Backend] | None = None,
        classifier: TaskClassifier | None = None,
    ) -> Engine:
        """Build every tier (or just those in `only`). `backends` replaces the configured backend of
        the named tiers: the seam tests use to put an instant or faulty backend behind a tier.
        `classifier` labels the requests no task rule claims (None: rules alone)."""
        reg = registry or VerifierRegistry.from_entry_points()
        breg = BackendRegistry.from_entry_points()
        tier_settings = [t for t in settings.tiers if only is None or t.name in only]
        if only is not None:
            unknown = set(only) - {t.name for t in settings.tiers}
            if unknown:
                raise ConfigError(f"unknown tier(s): {', '.join(sorted(unknown))}")
        problems = check_resources(settings, reg, skip_models=list(backends or {}), backends=breg)
        if problems:
            raise ConfigError("cannot start:\n  " + "\n  ".join(problems))
        built: dict[str, Backend] = {}
        for t in tier_settings:
            built[t.name] = (backends or {}).get(t.name) or breg.create(t, settings)
        tiers: list[Tier] = []
        sandboxes = host_sandboxes(settings.sandbox)  # one limit for every tier's sandboxed runs
        for t in tier_settings:
            shared = SharedRegistry(reg)  # a learned verifier's features reuse the tier's own scores
            ctx = VerifierContext(
                tier=t.name, backend=built[t.name], backends=built, registry=shared, sandboxes=sandboxes
            )
            members = _members(t.verifiers, shared, ctx, f"tiers ({t.name}).verifiers")
            tasks: dict[str, TaskPolicy[VerifierSet]] = {}
            for task, own in t.tasks.items():
                p = policy.task_policy(t, task)
                # a policy that keeps the tier's verifiers shares their instances (and their scores)
                mine = (
                    members
                    if own.verifiers is None
                    else _members(p.verifiers, shared, ctx, f"tiers ({t.name}).tasks.{task}.verifiers")
                )
                try:
                    tasks[task] = p.built(VerifierSet(mine, p.combine))
                except VerifierError as exc:
                    raise ConfigError(f"tiers ({t.name}).tasks.{task}: {exc}") from None
            tiers.append(Tier(t, built[t.name], VerifierSet(members, t.combine), load_prerouter(t), tasks))
        if classifier is None and settings.cascade.task_classifier:
            from router.learned.task_model import TaskClassifier  # numpy only; loaded once per engine

            classifier = TaskClassifier.load()
        cascade = Cascade(tiers, settings.cascade, classifier)
        return cls(settings=settings, cascade=cascade, backends=built, sandboxes=sandboxes)

    async def start(self) -> None:
        # one at a time: two models loading at once only fight over memory bandwidth
        for backend in self.backends.values():
            await backend.start()
        self.started = True

    async def close(self) -> None:
        await asyncio.gather(*(b.close() for b in self.backends.values()), return_exceptions=True)
        self.started = False

    @property
    def ready(self) -> bool:
        return self.started and all(b.ready for b in self.backends.values())


def _members(
    specs: Sequence[VerifierSpec], shared: SharedRegistry, ctx: VerifierContext, where: str
) -> list[WeightedVerifier]:
    members = []
    for spec in specs:
        try:
            members.append(WeightedVerifier(shared.create(spec.name, spec.params, ctx), spec.weight))
        except VerifierError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return members
