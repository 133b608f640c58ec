"""Run and report a mixed workload (`evals.suites.mixed`) as the service would judge it.

Each item is given the task the service would detect (`router.tasks.detect_task`, with the
committed classifier when the config enables it), not its suite's label: a maths item the service
takes for open-ended is judged by the open-ended policy, as it would be in production. The run is
therefore split by (origin suite, detected task) into ordinary runs, `<runs>/<mixed run>/<suite>.<task>/`,
each an eval run of the origin suite judged by that task's policy. Ordinary runs because everything
downstream already reads them: the runner computes what is missing, and `evals.replay` puts the
real `Cascade` over them; nothing here decides an item or prices it by a rule of its own.

Reuse: a suite item's request, tier fingerprint and grader are its suite's, so its generation,
scores and grade have the same content keys as in the suite's own run (`<runs>/<suite>/`). Before
running, each part is seeded from that run by key; the runner then finds them stored and computes
only what the origin lacks (a verifier of another task's policy, say), without regenerating.
Open-ended prompts are new work, generated like any item.

`<runs>/<mixed run>/mixed.json` keeps the interleaved order, each item's origin and detected task
with its reason; the report (`report_rows`) replays each part and aggregates per detected task.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evals.grading import Grade
from evals.replay import Replay, replay_request
from evals.runner import (
    EvalPlan,
    Progress,
    RunSummary,
    run_eval,
    tier_fingerprint,
    verifier_fingerprint,
)
from evals.store import RunStore, generation_key, grade_key, score_key
from evals.suites.base import Item, Suite
from evals.suites.mixed import is_graded
from evals.sweep import CONFIG
from router.config import Settings, VerifierSpec
from router.errors import ConfigError
from router.generation import GenerationRequest
from router.tasks import SUITE_TASKS, TASKS, TaskClassifier, TaskLabel, detect_task

if TYPE_CHECKING:
    from router.backends.base import Backend
    from router.plugins import VerifierRegistry

INDEX = "mixed.json"
# the suite kind whose policy a detected task selects (`router.tasks.task_of_suite` inverted)
_KIND_OF_TASK = {task: kind for kind, task in SUITE_TASKS.items()}


def default_classifier(settings: Settings) -> TaskClassifier | None:
    """The classifier the service would use with these settings."""
    if not settings.cascade.task_classifier:
        return None
    from router.learned.task_model import TaskClassifier as Model

    return Model.load()


def detect(item: Item, classifier: TaskClassifier | None) -> TaskLabel:
    """The task the service detects for the item's request (its messages; no hint of its suite)."""
    return detect_task(GenerationRequest(messages=item.messages), classifier)


class _Judged(Suite):
    """An origin suite whose items are judged by another task's policy. Everything that keys the
    stored work (name, version, max_tokens, alternatives per token) and the grader stay the origin's."""

    def __init__(self, origin: Suite, task: str) -> None:
        if task not in _KIND_OF_TASK:
            raise ConfigError(f"mixed: no suite kind selects the policy of task {task!r}")
        self.origin = origin
        self.name = origin.name
        self.version = origin.version
        self.max_tokens = origin.max_tokens
        self.top_logprobs = origin.top_logprobs
        self.source = origin.source
        self.task = _KIND_OF_TASK[task]

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        return self.origin.load(cache_dir)

    async def grade(self, item: Item, text: str) -> Grade:
        return await self.origin.grade(item, text)

    async def grade_answer(self, item: Item, text: str, *, cut_off: bool) -> Grade:
        return await self.origin.grade_answer(item, text, cut_off=cut_off)


@dataclass
class Part:
    """The items of one origin suite detected as one task: one ordinary run."""

    origin: Suite
    task: str
    items: list[Item] = field(default_factory=list)

    @property
    def run(self) -> str:
        return f"{self.origin.name}.{self.task}"


@dataclass
class MixedRun:
    root: Path
    order: list[dict[str, Any]]  # per item in the interleaved order: id, origin, task, why
    parts: list[Part]


def plan_mixed(drawn: Sequence[tuple[Suite, Item]], classifier: TaskClassifier | None, root: Path) -> MixedRun:
    parts: dict[tuple[str, str], Part] = {}
    order = []
    for origin, item in drawn:
        label = detect(item, classifier)
        part = parts.setdefault((origin.name, label.task), Part(origin, label.task))
        part.items.append(item)
        order.append(
            {
                "id": item.id,
                "origin": origin.name,
                "origin_task": SUITE_TASKS.get(origin.task, "open_ended"),
                "graded": is_graded(origin),
                "task": label.task,
                "why": label.why,
            }
        )
    return MixedRun(Path(root), order, list(parts.values()))


def seed_from_origin(plan: EvalPlan, store: RunStore, origin: RunStore) -> int:
    """Copy from the origin run every record `plan` needs that `store` lacks, by content key."""
    copied = 0
    suite_fp = plan.suite.fingerprint
    for tier in plan.tier_settings():
        fp = tier_fingerprint(plan.suite, tier)
        specs = plan.verifier_specs(tier)
        for item in plan.items:
            gk = generation_key(fp, item.prompt_sha)
            gen = origin.generations.records.get(gk)
            if gen is None:
                continue
            if gk not in store.generations.records:
                store.add_generation(gen)
                copied += 1
            for spec in specs.values():
                sk = score_key(gk, verifier_fingerprint(spec.name, spec.params))
                if sk not in store.scores.records and sk in origin.scores.records:
                    store.scores.append(origin.scores.records[sk])
                    copied += 1
            rk = grade_key(gk, suite_fp, item.id)
            if rk not in store.grades.records and rk in origin.grades.records:
                store.grades.append(origin.grades.records[rk])
                copied += 1
    return copied


async def run_mixed(
    mixed: MixedRun,
    runs_dir: Path,
    settings: Settings,
    tiers: list[str],
    *,
    verifiers: Sequence[VerifierSpec] = (),
    seed: int = 0,
    concurrency: int = 8,
    timeout_s: float = 1800.0,
    config_path: str | None = None,
    progress: Progress | None = None,
    registry: VerifierRegistry | None = None,
    backends: Mapping[str, Backend] | None = None,
) -> dict[str, RunSummary]:
    """Seed every part from its origin run in `runs_dir`, then compute what is still missing."""
    mixed.root.mkdir(parents=True, exist_ok=True)
    (mixed.root / INDEX).write_text(
        json.dumps({"format": 1, "seed": seed, "items": mixed.order}, indent=1, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )
    summaries = {}
    for part in mixed.parts:
        plan = EvalPlan(
            suite=_Judged(part.origin, part.task),
            items=part.items,
            settings=settings,
            tiers=tiers,
            verifiers=list(verifiers),
            seed=seed,
            concurrency=concurrency,
            timeout_s=timeout_s,
            config_path=config_path,
        )
        origin_dir = Path(runs_dir) / part.origin.name
        with RunStore(mixed.root / part.run) as store:
            if (origin_dir / "manifest.json").is_file() and origin_dir.resolve() != store.root.resolve():
                with RunStore(origin_dir) as origin:
                    seed_from_origin(plan, store, origin)
            summaries[part.run] = await run_eval(plan, store, progress=progress, registry=registry, backends=backends)
    return summaries


# ---- the report ----------------------------------------------------------------------------------


@dataclass
class Row:
    task: str
    items: int = 0
    graded: int = 0
    correct: int = 0
    cost_usd: float = 0.0
    escalated: int = 0
    agree: int = 0  # the detected task is the origin's label

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.graded if self.graded else None

    @property
    def cost_per_1k(self) -> float:
        return 1000 * self.cost_usd / self.items if self.items else 0.0

    @property
    def escalation(self) -> float:
        return self.escalated / self.items if self.items else 0.0

    @property
    def agreement(self) -> float:
        return self.agree / self.items if self.items else 0.0


def _configured_thresholds(snaps: Sequence[Mapping[str, Any]]) -> list[float]:
    return [float(s["threshold"]) for s in snaps[: max(1, len(snaps) - 1)]]


async def report_rows(root: Path, settings: Settings | None = None) -> list[Row]:
    """Per detected task (in `router.tasks.TASKS` order), then 'overall': each item decided by the
    real cascade over its part's stored results, at its task's configured policy."""
    index = json.loads((Path(root) / INDEX).read_text(encoding="utf-8"))
    outcome: dict[str, tuple[bool, float, bool]] = {}  # id -> correct, cost, escalated
    for part in sorted({f"{e['origin']}.{e['task']}" for e in index["items"]}):
        store = RunStore(Path(root) / part)
        if not store.exists():
            raise ConfigError(f"mixed run {root}: part {part} was not run")
        replay = Replay(store)
        cascade = replay.cascade(
            CONFIG, _configured_thresholds(replay.snapshots), settings=settings.cascade if settings else None
        )
        suite_fp = replay.manifest["suite"]["fingerprint"]
        fps = {s["name"]: s["fingerprint"] for s in replay.snapshots}
        for entry in replay.manifest["items"]:
            result = await cascade.run(replay_request(entry["id"]), task=replay.task)
            gk = generation_key(fps[result.final.tier], entry["prompt_sha"])
            grade = store.grades.records.get(grade_key(gk, suite_fp, entry["id"]))
            if grade is None:
                raise ConfigError(f"mixed run {root}: part {part} has no grade of {entry['id']}; rerun it")
            outcome[entry["id"]] = (grade.correct, result.cost_usd, result.escalated)
    rows = {t: Row(t) for t in TASKS}
    overall = Row("overall")
    for entry in index["items"]:
        if entry["id"] not in outcome:
            raise ConfigError(f"mixed run {root}: no result for {entry['id']}; rerun it")
        correct, cost, escalated = outcome[entry["id"]]
        for row in (rows[entry["task"]], overall):
            row.items += 1
            row.cost_usd += cost
            row.escalated += escalated
            row.agree += entry["task"] == entry["origin_task"]
            if entry["graded"]:
                row.graded += 1
                row.correct += correct
    return [r for r in rows.values() if r.items] + [overall]


def _fmt_accuracy(row: Row) -> str:
    acc = row.accuracy
    return "n/a" if acc is None else f"{acc:.1%} ({row.correct}/{row.graded})"


def table_rows(rows: Sequence[Row]) -> list[list[str]]:
    """The report's cells: task, items, graded, accuracy, cost per 1k requests, escalation, agreement."""
    return [
        [
            r.task,
            str(r.items),
            str(r.graded),
            _fmt_accuracy(r),
            f"${r.cost_per_1k:.4f}",
            f"{r.escalation:.1%}",
            f"{r.agreement:.1%}",
        ]
        for r in rows
    ]


HEADERS = [
    "detected task",
    "items",
    "graded",
    "accuracy",
    "cost / 1k requests",
    "escalated",
    "detection = origin label",
]


def markdown(rows: Sequence[Row], *, command: str, tiers: Sequence[str]) -> str:
    lines = [
        "# Mixed traffic",
        "",
        "The suites' items interleaved with open-ended prompts, each judged by the policy of the task the "
        "service detects for it (not its suite's label), decided by the real cascade replayed over the "
        f"stored results (tiers: {', '.join(tiers)}). Accuracy counts graded items only; open-ended "
        "prompts have no reference answer (n/a) but count in cost and escalation.",
        "",
        f"Regenerate: `{command}`",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    return "\n".join(lines) + "\n"
