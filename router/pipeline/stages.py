"""Stages: the steps a request passes on its way to the cascade and back, that plugins can add.

A stage sees one request through a typed `StageContext` and may, before generation:

- refuse it (raise `StageRefused`, or any `RequestError`: a 400 in the surface's error shape, before
  any tier has worked and before anything is charged beyond the admission the key already passed);
- rewrite what is generated (`ctx.request = ctx.request.with_(...)`: a redaction, a system prompt),
  never for whom: the request goes on as the caller's (`GenerationRequest.tenant`) however it was made;
- narrow the plan (`ctx.narrow(names)`: a router that picks tiers before generation; a stage can
  only take tiers away, never add one the client did not already reach);
- answer it from a stored answer (return a `CachedAnswer`: a semantic cache), served and recorded
  exactly as an exact-cache hit is.

After generation a stage sees the settled `CascadeResult` and may refuse the answer (raise; the
answer is then not delivered, and its cost is still recorded) or add a note. A stage that sets
`inspects_output = True` is shown every answer before any of it is sent: a streamed request is
then answered whole and streamed afterwards, since text already sent cannot be taken back.

What every stage writes to `ctx.notes[stage.name]` reaches the client in the `tierroute` object's
`stages` field, so a client can see which stage acted and why; what it records with `ctx.acted`
is counted in /metrics (`tierroute_stage_actions_total`). A stage that found something the
service must not keep clears `ctx.cacheable` (the response cache does not store the answer) or
`ctx.shadowable` (the answer is not offered to shadow escalation); `ctx.task()` is the request's
task (router.tasks), detected once and handed on to the cascade. Stages run in the order the
config lists them (`[[stages]]`), after the exact response cache and admission, on every API
surface alike.

Stages plug in through the entry-point group ``tierroute.stages`` (`router.plugins`): each entry
point names a callable ``register_stages(register)`` and ``register(name, factory)`` adds a
factory ``(params) -> Stage``. The built-ins (`router.pipeline.builtin`) register the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from router.errors import ConfigError, RequestError
from router.plugins import STAGES, Registry

if TYPE_CHECKING:
    from router.admission.auth import Principal
    from router.cache.answer import CachedAnswer
    from router.cascade import CascadeResult, Tier
    from router.config import StageSpec
    from router.generation import GenerationRequest
    from router.tasks import TaskLabel


class StageRefused(RequestError):
    """A stage refused the request or its answer: a 400 whose code names the stage."""

    def __init__(self, stage: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param, code=f"refused_by_{stage}")
        self.stage = stage


@dataclass(frozen=True)
class StageAction:
    """One thing a stage did, as /metrics counts it: never the data it acted on."""

    stage: str
    action: str  # the stage's word for it: "block", "redact", "keep_local", "log_only", "restore"...
    kind: str  # what it acted on: an entity kind ("EMAIL_ADDRESS"), never its text
    where: Literal["request", "answer"]


@dataclass
class StageContext:
    """One request as the stages see it. `request`, `plan`, `notes`, `actions`, `state`, `cacheable`
    and `shadowable` are the stages' to change (see the module docstring for how); the rest is read-only."""

    surface: str  # the API the request came through: "chat.completions", "completions"
    principal: Principal
    model: str  # what the client asked for: "auto" or a tier's name
    request: GenerationRequest
    plan: tuple[Tier, ...]
    notes: dict[str, Any] = field(default_factory=dict)  # stage name -> what it says, shown to the client
    actions: list[StageAction] = field(default_factory=list)  # counted in /metrics
    # a stage's own per-request state, by stage name: kept between its `before` and `after`, never shown
    state: dict[str, Any] = field(default_factory=dict, repr=False)
    cacheable: bool = True  # False: the response cache does not store this request's answer
    shadowable: bool = True  # False: the answer is not offered to shadow escalation
    # how the request's task is detected (the cascade's own rule); None: it is not (tests)
    detect: Callable[[GenerationRequest], TaskLabel] | None = field(default=None, repr=False)
    detected: TaskLabel | None = field(default=None, repr=False)

    def task(self) -> str | None:
        """The request's task (router.tasks), detected once on the request as the stage sees it;
        the cascade is handed the same label."""
        if self.detected is None and self.detect is not None:
            self.detected = self.detect(self.request)
        return None if self.detected is None else self.detected.task

    def acted(self, stage: str, action: str, kind: str, where: Literal["request", "answer"] = "request") -> None:
        self.actions.append(StageAction(stage, action, kind, where))

    def narrow(self, names: Iterable[str]) -> None:
        """Keep only the planned tiers named, in the plan's order; at least one must stay."""
        wanted = set(names)
        kept = tuple(t for t in self.plan if t.name in wanted)
        unknown = wanted - {t.name for t in self.plan}
        if unknown or not kept:
            raise ValueError(f"narrow(): {sorted(unknown) or 'nothing'} is not a subset of the plan")
        self.plan = kept


class Stage:
    """A step on every request. Override `before`, `after` or both; the defaults do nothing."""

    name: str = ""
    inspects_output: bool = False  # True: every answer is shown to `after` before any of it is sent

    def __init__(self, params: dict[str, Any]) -> None:
        """A stage is made from its config entry's params; this one takes none. A subclass pops
        what it knows and passes the rest here, so a misspelt param is refused at start."""
        if params:
            raise ValueError(f"unknown params {sorted(params)}")

    async def before(self, ctx: StageContext) -> CachedAnswer | None:
        """Before generation: refuse, rewrite, narrow, or return a stored answer to serve."""
        return None

    async def after(self, ctx: StageContext, result: CascadeResult) -> None:
        """After generation, before the answer is delivered (or, for a stream of a stage that does
        not inspect output, once it has been)."""
        return None


StageFactory = Callable[[dict[str, Any]], Stage]


class StageRegistry(Registry[StageFactory]):
    kind = "stage"

    @classmethod
    def from_entry_points(cls) -> StageRegistry:
        reg = cls()
        reg.load(STAGES)
        return reg


def build_stages(specs: Sequence[StageSpec], registry: StageRegistry | None = None) -> list[Stage]:
    """The configured stages, in order, each made from its params (a bad one is a ConfigError)."""
    if not specs:
        return []
    registry = registry or StageRegistry.from_entry_points()
    stages = []
    for i, spec in enumerate(specs):
        factory = registry.get(spec.name)
        try:
            stage = factory(dict(spec.params))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"stages[{i}] ({spec.name}): bad params {spec.params!r}: {exc}") from None
        stage.name = stage.name or spec.name
        stages.append(stage)
    return stages
