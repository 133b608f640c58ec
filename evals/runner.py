"""Run every tier on every item once, score every output with every verifier, grade it, store it.

Why once: a cascade's outcome is a function of each tier's output and each verifier's score, so
with all of them stored every policy and threshold can be evaluated afterwards without a model
(see `evals.sweep`). The work is keyed by content (see `evals.store`): what is already stored is
never recomputed, and when nothing is missing no model is even loaded.

Hygiene: the request a model and every verifier receive is built from the item's `messages` and
the suite's task kind alone. The answer key (reference, hidden tests) goes only to the suite's
grader.

Concurrency: tiers run one after another (two local models decoding at once on the same CPU only
slow each other); within a tier, items are submitted concurrently, `n_parallel` at a time for a
local llama.cpp tier (its engine decodes them in one batch) and `concurrency` at a time for a
remote one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from evals.store import (
    GenerationRecord,
    GradeRecord,
    RunStore,
    ScoreRecord,
    canonical,
    digest,
    generation_key,
    grade_key,
    score_key,
)
from evals.suites.base import Item, Suite
from router.admission.slots import Slots, host_sandboxes
from router.config import Settings, TierSettings, VerifierSpec
from router.errors import ConfigError, ModelError, RequestError, UnavailableError
from router.generation import GenerationRequest
from router.policy import TaskPolicy, describe, task_policy
from router.tasks import task_of_suite

if TYPE_CHECKING:
    from router.backends.base import Backend
    from router.plugins import VerifierRegistry as Registry
    from router.verification import Verifier

TEMPERATURE = 0.0  # greedy: one output per tier and item is the tier's answer
SEED = 0


# ---- identities -----------------------------------------------------------------------------------


def verifier_label(name: str, params: Mapping[str, Any]) -> str:
    """A verifier's name in results and reports: its `name` param when it has one (the built-ins
    take one, e.g. `{"stat": "min", "name": "confidence_min"}`), else `name`, or `name[k=v,...]`
    when it has params."""
    if isinstance(params.get("name"), str) and params["name"]:
        return str(params["name"])
    if not params:
        return name
    inner = ",".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in sorted(params.items()))
    return f"{name}[{inner}]"


def verifier_fingerprint(name: str, params: Mapping[str, Any]) -> str:
    """What a stored score is keyed by: the verifier, its params, and its version where it declares
    one (`verifiers.builtins.VERSIONS`): a verifier whose scores changed is rescored by a rerun."""
    from verifiers.builtins import VERSIONS

    version = VERSIONS.get(name)
    if version is None:
        return digest("verifier", name, canonical(dict(params)))
    return digest("verifier", name, canonical(dict(params)), f"v{version}")


def parse_verifier_option(text: str) -> VerifierSpec:
    """`name` or `name:{json params}`, as given to `--verifier`."""
    name, sep, raw = text.partition(":")
    params: dict[str, Any] = {}
    if sep:
        try:
            params = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--verifier {text!r}: params are not JSON: {exc}") from None
        if not isinstance(params, dict):
            raise ConfigError(f"--verifier {text!r}: params must be a JSON object")
    if not name:
        raise ConfigError(f"--verifier {text!r}: missing the verifier name")
    return VerifierSpec(name=name.strip(), params=params)


def model_identity(tier: TierSettings) -> str:
    if tier.llamacpp is not None:
        from router.models.catalog import CATALOG

        spec = tier.llamacpp.model
        entry = CATALOG.get(spec)
        return f"llamacpp:{spec}" + (f"@{entry.sha256}" if entry else "")
    assert tier.openai is not None
    urls = ",".join(d.base_url.rstrip("/") for d in tier.openai.resolved_deployments())
    return f"openai:{urls}:{tier.openai.model}"


def effective_max_tokens(suite: Suite, tier: TierSettings) -> int:
    return min(suite.max_tokens, tier.max_tokens)


def tier_fingerprint(suite: Suite, tier: TierSettings) -> str:
    """What decides a tier's output besides the prompt: the tier, its model, and the generation
    parameters. The tier's name is part of it so that two tiers never share outputs, even when
    they name the same model file (a test config, or a backend replaced behind a tier)."""
    params = {
        "tier": tier.name,
        "model": model_identity(tier),
        "max_tokens": effective_max_tokens(suite, tier),
        "temperature": TEMPERATURE,
        "seed": SEED,
    }
    if suite.top_logprobs:  # only then: the fingerprints of runs made before it stay as they were
        params["top_logprobs"] = suite.top_logprobs
    return digest("tier", canonical(params))


def build_request(suite: Suite, item: Item, tier: TierSettings, timeout_s: float | None = None) -> GenerationRequest:
    """What a real caller would send: the item's messages, the kind of task, and what the suite
    adds as a caller would (a `response_format`), nothing else.

    The deadline is the eval's own (`timeout_s`), not the tier's serving `timeout_s`: an eval
    decodes many items at once, so a generation takes longer than it would serving one request,
    and an answer the tier would give must not be lost to that."""
    request = GenerationRequest(
        messages=item.messages,
        max_tokens=effective_max_tokens(suite, tier),
        temperature=TEMPERATURE,
        seed=SEED,
        top_logprobs=suite.top_logprobs,
        deadline=time.monotonic() + (timeout_s if timeout_s is not None else tier.timeout_s),
        metadata={"task": suite.task, "client_code": True},  # the operator's own data
    )
    return suite.request(item, request)


# ---- the plan -----------------------------------------------------------------------------------------


@dataclass
class EvalPlan:
    """One `eval run`: which suite items, tiers and verifiers; where the results go."""

    suite: Suite
    items: list[Item]
    settings: Settings
    tiers: list[str]
    verifiers: list[VerifierSpec] = field(default_factory=list)  # scored on every tier
    limit: int | None = None
    seed: int = 0
    concurrency: int = 8  # remote tiers: requests in flight
    timeout_s: float = 1800.0  # per generation (and per item's verifiers); past it, retried next run
    config_path: str | None = None

    def tier_settings(self) -> list[TierSettings]:
        known = {t.name for t in self.settings.tiers}
        unknown = [t for t in self.tiers if t not in known]
        if unknown:
            raise ConfigError(f"unknown tier(s): {', '.join(unknown)}; configured: {', '.join(sorted(known))}")
        return [t for t in self.settings.tiers if t.name in self.tiers]

    def judging(self, tier: TierSettings) -> TaskPolicy[tuple[VerifierSpec, ...]]:
        """How the service judges this suite's items at `tier`: the tier's policy for the suite's task."""
        return task_policy(tier, task_of_suite(self.suite.task))

    def verifier_specs(self, tier: TierSettings) -> dict[str, VerifierSpec]:
        """Label -> spec: the verifiers of the tier's policy for the suite's task, then the eval's."""
        specs: dict[str, VerifierSpec] = {}
        for spec in [*self.judging(tier).verifiers, *self.verifiers]:
            specs.setdefault(verifier_label(spec.name, spec.params), spec)
        return specs


def _tier_snapshot(plan: EvalPlan, tier: TierSettings) -> dict[str, Any]:
    """The tier as it judges this suite: `combine`, `threshold` and `verifiers` are its policy for
    the suite's task (`task` names it; None: the tier's own settings), the 'config' verifier of
    the sweep and the replay."""
    judging = plan.judging(tier)
    return {
        "name": tier.name,
        "backend": tier.backend,
        "model": model_identity(tier),
        "fingerprint": tier_fingerprint(plan.suite, tier),
        "max_tokens": effective_max_tokens(plan.suite, tier),
        "price": tier.price.model_dump(mode="json"),
        "price_text": describe(tier.price),
        "task": judging.task,
        "combine": judging.combine,
        "threshold": judging.threshold,
        "verifiers": [
            {"name": s.name, "params": s.params, "weight": s.weight, "label": verifier_label(s.name, s.params)}
            for s in judging.verifiers
        ],
        "scored_with": sorted(plan.verifier_specs(tier)),
    }


def _verifier_entry(spec: VerifierSpec) -> dict[str, Any]:
    return {"name": spec.name, "params": spec.params, "label": verifier_label(spec.name, spec.params)}


def write_manifest(plan: EvalPlan, store: RunStore) -> dict[str, Any]:
    """Record what this run is, merged with what earlier invocations of the same run added: tiers
    run before and not now keep their entries; verifiers accumulate."""
    old = store.manifest() if store.exists() else {}
    if old and old["suite"]["name"] != plan.suite.name:
        raise ConfigError(f"run {store.root} holds suite '{old['suite']['name']}', not '{plan.suite.name}'")
    now = {t.name: _tier_snapshot(plan, t) for t in plan.tier_settings()}
    previous = {t["name"]: t for t in old.get("tiers", [])}
    order = [t.name for t in plan.settings.tiers if t.name in now or t.name in previous]
    order += [n for n in previous if n not in order]
    for name, snap in now.items():
        before = previous.get(name)
        if before is not None and before.get("fingerprint") == snap["fingerprint"]:
            # the same tier scored by earlier invocations keeps what they scored it with
            snap["scored_with"] = sorted({*before.get("scored_with", ()), *snap["scored_with"]})
    tiers = [now.get(n) or previous[n] for n in order]
    verifiers = {v["label"]: v for v in old.get("verifiers", [])}
    for spec in plan.verifiers:
        verifiers.setdefault(verifier_label(spec.name, spec.params), _verifier_entry(spec))
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    manifest = {
        "name": store.name,
        "suite": {
            "name": plan.suite.name,
            "fingerprint": plan.suite.fingerprint,
            "task": plan.suite.task,
            "source": plan.suite.source,
            "limit": plan.limit,
            "seed": plan.seed,
        },
        "generation": {"temperature": TEMPERATURE, "seed": SEED},
        "tiers": tiers,
        "verifiers": list(verifiers.values()),
        "items": [{"id": i.id, "group": i.group, "prompt_sha": i.prompt_sha} for i in plan.items],
        "config": plan.config_path,
        "created": old.get("created", stamp),
        "updated": stamp,
    }
    if {k: v for k, v in old.items() if k not in ("updated", "format")} != {
        k: v for k, v in manifest.items() if k != "updated"
    }:
        store.write_manifest(manifest)  # unchanged runs stay byte-identical: a committed run stays clean
    return manifest


# ---- progress ------------------------------------------------------------------------------------------


class Progress(Protocol):
    def start(self, tier: str, total: int, cached: int) -> None: ...

    def advance(self, tier: str) -> None: ...

    def finish(self, tier: str) -> None: ...


class _Silent:
    def start(self, tier: str, total: int, cached: int) -> None:
        pass

    def advance(self, tier: str) -> None:
        pass

    def finish(self, tier: str) -> None:
        pass


@dataclass
class RunSummary:
    items: int
    tiers: list[str]
    generated: int = 0
    scored: int = 0
    graded: int = 0
    failed: list[str] = field(default_factory=list)  # "tier item: why", retried by the next run
    wall_s: float = 0.0
    loaded_models: bool = False

    @property
    def computed(self) -> int:
        return self.generated + self.scored + self.graded


# ---- the work --------------------------------------------------------------------------------------------


@dataclass
class _TierWork:
    tier: TierSettings
    fingerprint: str
    specs: dict[str, VerifierSpec]
    todo: list[Item]


def _missing(plan: EvalPlan, store: RunStore, tier: TierSettings) -> _TierWork:
    fp = tier_fingerprint(plan.suite, tier)
    specs = plan.verifier_specs(tier)
    todo = []
    for item in plan.items:
        gk = generation_key(fp, item.prompt_sha)
        if (
            gk not in store.generations.records
            or grade_key(gk, plan.suite.fingerprint, item.id) not in store.grades.records
            or any(
                score_key(gk, verifier_fingerprint(s.name, s.params)) not in store.scores.records
                for s in specs.values()
            )
        ):
            todo.append(item)
    return _TierWork(tier, fp, specs, todo)


async def run_eval(
    plan: EvalPlan,
    store: RunStore,
    *,
    progress: Progress | None = None,
    registry: Registry | None = None,
    backends: Mapping[str, Backend] | None = None,
) -> RunSummary:
    """Compute what the store lacks for `plan`. `registry` and `backends` are the seams tests use:
    a registry of test verifiers, and backends that replace the configured ones of the named tiers."""
    progress = progress or _Silent()
    t0 = time.monotonic()
    write_manifest(plan, store)
    tiers = plan.tier_settings()
    work = [_missing(plan, store, t) for t in tiers]
    summary = RunSummary(items=len(plan.items), tiers=[t.name for t in tiers])
    if not any(w.todo for w in work):
        summary.wall_s = time.monotonic() - t0
        return summary

    from router.plugins import VerifierRegistry as Registry

    reg = registry or Registry.from_entry_points()
    built = build_backends(plan.settings, tiers, backends or {})
    summary.loaded_models = True
    try:
        # every verifier is made before any model loads: a bad one fails the run at once
        sandboxes = host_sandboxes(plan.settings.sandbox)  # one limit for every tier's sandboxed runs
        verifiers = {w.tier.name: _make_verifiers(w, reg, built, plan.timeout_s, sandboxes) for w in work if w.todo}
        for w in work:
            if not w.todo:
                continue
            backend = built[w.tier.name]
            await backend.start()
            width = w.tier.llamacpp.n_parallel if w.tier.llamacpp is not None else plan.concurrency
            limit = asyncio.Semaphore(width)
            progress.start(w.tier.name, len(w.todo), len(plan.items) - len(w.todo))

            async def one(
                item: Item, w: _TierWork = w, backend: Backend = backend, limit: asyncio.Semaphore = limit
            ) -> None:
                async with limit:
                    await _process(plan, store, w, item, backend, verifiers[w.tier.name], summary)
                progress.advance(w.tier.name)

            try:
                await _all_or_nothing([one(item) for item in w.todo])
            finally:
                progress.finish(w.tier.name)
    finally:
        await asyncio.gather(*(b.close() for b in built.values()), return_exceptions=True)
        summary.wall_s = time.monotonic() - t0
    return summary


def build_backends(
    settings: Settings, tiers: Sequence[TierSettings], supplied: Mapping[str, Backend]
) -> dict[str, Backend]:
    """The backends of the tiers an eval runs, built but not started: the one `supplied` for a
    tier, else the configured one. Only these: an eval generates and verifies by itself, so the
    serving engine's cascade, verifier sets and pre-routers would be built for nothing. Every
    tier's backend is there for the verifiers that call another tier (`judge`)."""
    from router.plugins import BackendRegistry

    index = {t.name: i for i, t in enumerate(settings.tiers)}
    registry = BackendRegistry.from_entry_points()
    built: dict[str, Backend] = {}
    problems: list[str] = []
    for tier in tiers:
        if tier.name in supplied:
            built[tier.name] = supplied[tier.name]
            continue
        try:
            built[tier.name] = registry.create(tier, settings)
        except (ConfigError, ModelError) as exc:  # named as `config check` names them
            key = "llamacpp.model" if isinstance(exc, ModelError) else tier.backend
            problems.append(f"tiers[{index[tier.name]}] ({tier.name}).{key}: {exc}")
    if problems:
        raise ConfigError("cannot start:\n  " + "\n  ".join(problems))
    return built


def _make_verifiers(
    w: _TierWork, reg: Registry, backends: Mapping[str, Backend], timeout_s: float, sandboxes: Slots
) -> dict[str, Verifier]:
    """Label -> verifier for one tier: its own and the eval's, each made once.

    A verifier that generates (`self_consistency`, `cross_tier`, `judge`, `execution`'s second
    opinion) names the params that bound its generations in serving (`deadline_params`). Here
    they get the eval's own per-generation deadline unless the spec sets them, as the tiers' serving
    `timeout_s` gives way to it: under batched eval load a serving bound times out samples that would
    finish, and a timeout is no verdict. The spec's params, and so the cache key and the label, are
    unchanged."""
    from verifiers.base import VerifierContext, VerifierError

    ctx = VerifierContext(tier=w.tier.name, backend=backends[w.tier.name], backends=backends, sandboxes=sandboxes)
    made: dict[str, Verifier] = {}
    for label, spec in w.specs.items():
        try:
            v = reg.create(spec.name, spec.params, ctx)
            stretch = {k: timeout_s for k in getattr(v, "deadline_params", ()) if k not in spec.params}
            made[label] = dataclasses.replace(v, **stretch) if stretch and dataclasses.is_dataclass(v) else v
        except VerifierError as exc:
            raise ConfigError(f"eval verifier '{label}' on tier {w.tier.name}: {exc}") from None
    return made


async def _all_or_nothing(coros: list[Any]) -> None:
    """Run all; on the first error (or Ctrl-C) cancel the rest and wait for them, so nothing keeps
    running against a closing engine. Finished items are already stored."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _process(
    plan: EvalPlan,
    store: RunStore,
    w: _TierWork,
    item: Item,
    backend: Backend,
    verifiers: Mapping[str, Verifier],
    summary: RunSummary,
) -> None:
    tier = w.tier.name
    gk = generation_key(w.fingerprint, item.prompt_sha)
    request = build_request(plan.suite, item, w.tier, plan.timeout_s)
    rec = store.generations.records.get(gk)
    if rec is None:
        try:
            gen = await backend.generate(request)
        except UnavailableError as exc:  # overloaded, deadline, upstream down: retried next run
            summary.failed.append(f"{tier} {item.id}: {type(exc).__name__}: {exc}")
            return
        except RequestError as exc:  # this request cannot be served by this tier, ever
            rec = GenerationRecord(
                key=gk,
                tier=tier,
                item=item.id,
                model="",
                text="",
                finish_reason="error",
                prompt_tokens=0,
                completion_tokens=0,
                latency_s=0.0,
                error=f"{type(exc).__name__}: {exc}",
            )
        else:
            rec = GenerationRecord.from_generation(gk, tier, item.id, gen)
        store.add_generation(rec)
        summary.generated += 1
    candidate = rec.to_generation()
    request = build_request(plan.suite, item, w.tier, plan.timeout_s)  # a fresh deadline for the verifiers' own work

    async def score(label: str, spec: VerifierSpec) -> None:
        sk = score_key(gk, verifier_fingerprint(spec.name, spec.params))
        if sk in store.scores.records:
            return
        common: dict[str, Any] = {"key": sk, "gen": gk, "tier": tier, "item": item.id, "verifier": label}
        if rec.error is not None:
            store.add_score(ScoreRecord(**common, value=0.0, reason="no answer: generation failed"))
            summary.scored += 1
            return
        started = time.monotonic()
        try:
            s = await verifiers[label].score(request, candidate)
        except UnavailableError as exc:
            summary.failed.append(f"{tier} {item.id} verifier {label}: {type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # a verifier that breaks on an answer is unsure of it: escalate
            store.add_score(
                ScoreRecord(**common, value=0.0, reason="verifier error", error=f"{type(exc).__name__}: {exc}")
            )
            summary.scored += 1
            return
        if s.is_unavailable:  # a timeout under load is not a verdict on the answer: retried next run
            summary.failed.append(f"{tier} {item.id} verifier {label}: {s.reason}")
            return
        store.add_score(
            ScoreRecord(
                **common,
                value=None if s.value is None else float(s.value),
                reason=s.reason,
                details=dict(s.details),
                cost_prompt_tokens=s.cost.prompt_tokens,
                cost_completion_tokens=s.cost.completion_tokens,
                cost_seconds=round(s.cost.seconds, 4),
                cost_tier=s.cost.tier,
                verify_s=round(time.monotonic() - started, 4),
            )
        )
        summary.scored += 1

    await asyncio.gather(*(score(label, spec) for label, spec in w.specs.items()))

    if grade_key(gk, plan.suite.fingerprint, item.id) not in store.grades.records:
        try:
            store.add_grade(await grade_stored(plan.suite, item, rec))
        except Exception as exc:  # a grader bug must not be stored as a verdict
            summary.failed.append(f"{tier} {item.id} grader: {type(exc).__name__}: {exc}")
            return
        summary.graded += 1


async def grade_stored(suite: Suite, item: Item, rec: GenerationRecord) -> GradeRecord:
    """The suite's grade of a stored answer, keyed by the suite's grader version: how a run grades
    what it generated, and how `evals.regrade` grades it again after the grader changed. A request
    that could not be served is wrong; an answer cut off at its token limit is graded as one."""
    key = grade_key(rec.key, suite.fingerprint, item.id)
    if rec.error is not None:
        return GradeRecord(key=key, gen=rec.key, tier=rec.tier, item=item.id, correct=False, detail="no answer")
    g = await suite.grade_answer(item, rec.text, cut_off=rec.finish_reason == "length")
    return GradeRecord(key, rec.key, rec.tier, item.id, correct=bool(g.correct), extracted=g.extracted, detail=g.detail)


def select_items(suite: Suite, limit: int | None, seed: int, cache_dir: Any = None) -> list[Item]:
    items = suite.load(cache_dir)
    if limit is not None and limit < 1:
        raise ConfigError("--limit must be at least 1")
    return suite.select(items, limit, seed)


def plan_tiers(settings: Settings, tiers: Sequence[str] | None) -> list[str]:
    return list(tiers) if tiers else [t.name for t in settings.tiers]
