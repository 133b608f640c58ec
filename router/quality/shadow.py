"""Shadow escalation: ask a larger tier too, after the client has its answer, to learn how often
the smaller tier's accepted answers are right in production.

The API calls `ShadowService.offer` once a response is complete (a plain response's background
task, a stream's code after its last chunk); `offer` does no I/O and never waits, so the client
never pays for it. For every answer a tier accepted on an 'auto' request it:

- feeds the drift detectors the acceptance of every tier the request tried (`router.quality.drift`);
  (the feedback route, `router.api.routes_feedback`, feeds them each request's first label);
- with probability `tiers[].shadow.rate`, queues the request for the tier's shadow target.

Each sampled tier has a lane: a bounded queue (`max_queue`) and `max_concurrency` workers. A job
that finds the queue full is dropped and counted (`tierroute_shadow_dropped{reason="queue_full"}`);
nothing ever waits for room. A worker estimates the job's worst case before sending it with the
function admission reserves by (`router.admission.accounting.worst_case_usd`, without verification): the
target's price for the most prompt tokens its backend can count for everything the request sends
(tools, tool calls, schemas included) and for `n` choices of the tier's max_tokens, or its whole
timeout per choice for a time-priced tier. It refuses the job when that and what the day has
spent and reserved would pass `usd_per_day`, and charges the real cost after. So the day's spend
never passes the budget. The day is the UTC day; at a restart, the day's spend is read back from
the ledger's shadow pairs.

A request a guard keeps on the machine (`GenerationRequest.local_only`, router.guards) is never
sent to a target that is not local: it is dropped and counted (`reason="local_only"`), and the
target's backend would refuse it besides (`ResidencyError`).

A shadow request is a generation only: the target's verifiers are not run (the client is not
waiting on its answer, and nothing is decided by it). It is written to the ledger as a request of
the operator key `_shadow` (never the client's), so `report costs --by key` shows its cost, and
the pair is compared by the task's agreement rule (`router.quality.agreement`) and written to
`shadow_pairs` (schema in `router.ledger.store`), with the prompt and answers in full only when
`ledger.store_prompts` is on.

At shutdown, work still running after a short grace is stopped, and what it had generated is
charged all the same: a request row of `_shadow` with decision `abandoned`, priced for the
tokens and compute streamed so far (a request with n > 1 is generated whole and not tracked, so
only its row is lost). Such a row has no pair, so a restart the same day does not count its spend
against the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from router import policy
from router.admission.accounting import worst_case_usd
from router.admission.limits import day_start
from router.admission.slots import Slots
from router.backends.base import Backend
from router.cascade import Attempt, Cascade, CascadeResult
from router.config import SHADOW_KEY, Settings, ShadowSettings
from router.generation import Delta, Generation, GenerationRequest
from router.ledger.entries import LedgerEntry, ShadowPair
from router.ledger.writer import Ledger
from router.metrics import Metrics
from router.quality.agreement import AgreementRegistry
from router.quality.drift import Alarm, DriftMonitor, Signal
from router.quality.live import Tally, threshold_label
from router.telemetry import context, spans
from router.telemetry.spans import NOOP, Span

log = logging.getLogger(__name__)

_CLOSE_GRACE_S = 5.0  # how long shutdown waits for shadow work already running


@dataclass(frozen=True)
class _Job:
    request_id: str
    request: GenerationRequest
    result: CascadeResult
    link: Span = NOOP  # the request's span: the shadow's own trace links to it (router.telemetry)


@dataclass
class _Lane:
    """One sampled tier: its settings, queue, workers and the day's budget."""

    tier: str
    target: str
    settings: ShadowSettings
    queue: asyncio.Queue[_Job] = field(default_factory=asyncio.Queue)
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    idle: int = 0
    day: float = 0.0
    spent: float = 0.0  # charged today
    reserved: float = 0.0  # estimated for the jobs running now

    def roll(self, now: float) -> None:
        today = day_start(now)
        if today != self.day:
            self.day, self.spent = today, 0.0

    def affords(self, estimate: float) -> bool:
        return self.spent + self.reserved + estimate <= self.settings.usd_per_day


def prompt_json(request: GenerationRequest) -> str:
    """The prompt as canonical JSON (the form `shadow_pairs.prompt_json` stores and hashes)."""
    if request.messages is not None:
        value: object = {"messages": [{"role": m.role, "content": m.content} for m in request.messages]}
    else:
        value = {"prompt": request.prompt}
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class ShadowService:
    """The shadow lanes, live tallies and drift detectors of one app."""

    def __init__(
        self,
        settings: Settings,
        cascade: Cascade,
        ledger: Ledger | None,
        metrics: Metrics,
        *,
        rules: AgreementRegistry | None = None,
        sandboxes: Slots | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.sandboxes = sandboxes
        self.cascade = cascade
        self.ledger = ledger
        self.metrics = metrics
        self.rules = rules
        self.rng = rng or random.Random()
        self.clock = clock
        self.lanes: dict[str, _Lane] = {}
        for t in settings.tiers:
            target = settings.shadow_target(t)
            if t.shadow is not None and target is not None:
                self.lanes[t.name] = _Lane(t.name, target, t.shadow)
        self.tallies: dict[tuple[str, float], Tally] = {}
        self.drift = DriftMonitor(self._baseline, self._warmup)
        self.started = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.rules is None:
            self.rules = AgreementRegistry.from_entry_points()
        now = self.clock()
        spent: dict[str, float] = {}
        if self.ledger is not None and self.lanes:
            for pair in await self.ledger.pairs(since=day_start(now)):
                spent[pair.tier] = spent.get(pair.tier, 0.0) + pair.shadow_cost_usd
        for lane in self.lanes.values():
            lane.roll(now)
            lane.spent = spent.get(lane.tier, 0.0)
            self.metrics.shadow.spend.labels(lane.tier).set(lane.spent)
            lane.workers = [
                asyncio.create_task(self._work(lane), name=f"shadow-{lane.tier}-{i}")
                for i in range(lane.settings.max_concurrency)
            ]
        self.started = True

    async def close(self) -> None:
        """Drop what waits, give what runs a moment to finish (and be recorded), stop the rest."""
        self.started = False
        for lane in self.lanes.values():
            while not lane.queue.empty():
                lane.queue.get_nowait()
                self.metrics.shadow.dropped.labels(lane.tier, "stopped").inc()
        workers = [w for lane in self.lanes.values() for w in lane.workers]
        deadline = time.monotonic() + _CLOSE_GRACE_S
        while time.monotonic() < deadline and any(lane.idle < len(lane.workers) for lane in self.lanes.values()):
            await asyncio.sleep(0.05)
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for lane in self.lanes.values():
            lane.workers = []

    # -- the hook ---------------------------------------------------------------------------------

    def offer(self, request_id: str, request: GenerationRequest, result: CascadeResult) -> None:
        """Called once the client has the whole answer. Never blocks, never raises."""
        try:
            self._offer(request_id, request, result)
        except Exception:  # noqa: BLE001 - a bookkeeping fault must not touch a delivered answer
            log.exception("shadow: could not consider %s", request_id)

    async def offered(self, request_id: str, request: GenerationRequest, result: CascadeResult) -> None:
        """`offer` as a response's background task. A coroutine, so Starlette runs it on the event
        loop: a plain function went to the thread pool after every answer (a tenth of the router's
        own time under load, py-spy), and a job put on a lane's asyncio queue from that thread
        would not wake the lane's worker safely. A streamed answer calls `offer` on the loop too."""
        self.offer(request_id, request, result)

    def _offer(self, request_id: str, request: GenerationRequest, result: CascadeResult) -> None:
        if result.model != "auto" or result.unverified:
            return  # a tier the client named accepts everything: no acceptance to learn from
        now = self.clock()
        task = self._task(result)
        last = self.cascade.tiers[-1].name
        for a in result.attempts:
            if a.tier == last or a.generation is None or a.error or a.skipped or a.abandoned:
                continue
            tally = self._tally(a.tier, a.threshold)
            tally.tried += 1
            tally.accepted += int(a.accepted)
            self.metrics.shadow.acceptance.labels(a.tier, threshold_label(a.threshold)).set(tally.acceptance or 0.0)
            self._alarms(self.drift.observe(a.tier, task, "acceptance", a.accepted, now))
        final = result.final
        lane = self.lanes.get(final.tier)
        if lane is None or not self.started or final.tier == last or not final.accepted:
            return
        if request.local_only and not self.cascade.by_name[lane.target].settings.is_local:
            # a guard keeps this request on the machine (router.guards): a remote target never sees it
            self.metrics.shadow.dropped.labels(lane.tier, "local_only").inc()
            return
        if self.rng.random() >= lane.settings.rate:
            return
        self.metrics.shadow.sampled.labels(lane.tier).inc()
        lane.roll(now)
        if not lane.affords(0.0):
            self.metrics.shadow.dropped.labels(lane.tier, "budget").inc()
            return
        if lane.queue.qsize() >= lane.settings.max_queue + lane.idle:
            self.metrics.shadow.dropped.labels(lane.tier, "queue_full").inc()
            return
        lane.queue.put_nowait(_Job(request_id, request, result, context.request_span()))
        self.metrics.shadow.queue.labels(lane.tier).set(max(0, lane.queue.qsize() - lane.idle))

    # -- the workers ------------------------------------------------------------------------------

    async def _work(self, lane: _Lane) -> None:
        while True:
            lane.idle += 1
            try:
                job = await lane.queue.get()
            finally:
                lane.idle -= 1
            self.metrics.shadow.queue.labels(lane.tier).set(lane.queue.qsize())
            # shadow work is a trace of its own, linked to the request it shadows
            span = spans.start(
                f"tierroute.shadow {lane.target}",
                links=(job.link,),
                attributes={
                    "tierroute.request_id": job.request_id,
                    "tierroute.tier": lane.tier,
                    "tierroute.shadow.target": lane.target,
                },
            )
            try:
                await self._shadow(lane, job, span)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one failed comparison must not stop the lane
                spans.fail(span, exc)
                log.exception("shadow: %s to %s failed", job.request_id, lane.target)
                self.metrics.shadow.dropped.labels(lane.tier, "failed").inc()
            finally:
                span.end()

    async def _shadow(self, lane: _Lane, job: _Job, span: Span = NOOP) -> None:
        target = self.cascade.by_name[lane.target]
        request = job.request.with_(
            max_tokens=min(job.request.max_tokens, target.settings.max_tokens),
            deadline=time.monotonic() + target.settings.timeout_s,
            trace=span if span.is_recording() else None,  # the target's upstream call hangs under it
        )
        estimate = worst_case_usd([target], request, tiers=self.cascade.by_name, verify=False)
        lane.roll(self.clock())
        if not lane.affords(estimate):
            self.metrics.shadow.dropped.labels(lane.tier, "budget").inc()
            return
        lane.reserved += estimate
        started = time.monotonic()
        progress = _Progress()
        try:
            gen = await _generate(target.backend, request, progress)
        except asyncio.CancelledError:
            # stopped at shutdown: the target did the work, so its row is written all the same
            await self._charge_stopped(lane, job, progress.partial(time.monotonic() - started))
            raise
        except Exception as exc:  # noqa: BLE001 - an unavailable or failing target: no pair, counted
            log.warning("shadow: target %s failed for %s: %s", lane.target, job.request_id, exc)
            self.metrics.shadow.dropped.labels(lane.tier, "failed").inc()
            # a target that failed mid-answer (a cut stream, its deadline) did the work up to there:
            # charged like stopped work, or a failing target would spend without touching the budget
            await self._charge_stopped(lane, job, progress.partial(time.monotonic() - started), "failed")
            return
        finally:
            lane.reserved -= estimate
        cost = target.cost_of(gen)
        lane.spent += cost
        if span.is_recording():
            span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": gen.prompt_tokens,
                    "gen_ai.usage.output_tokens": gen.completion_tokens,
                    "tierroute.cost_usd": cost,
                }
            )
        self.metrics.shadow.spend.labels(lane.tier).set(lane.spent)
        attempt = Attempt(tier=lane.target, threshold=0.0, generation=gen, accepted=True, cost_usd=cost)
        attempt.reason = f"shadow of {job.request_id} (tier {lane.tier})"
        attempt.score = policy.combine([])
        shadow_result = CascadeResult(model=lane.target, attempts=[attempt], final=attempt, task=job.result.task)
        shadow_result.counterfactual_usd = cost
        shadow_id = f"shadow-{job.request_id}"
        entry = LedgerEntry.from_result(shadow_id, SHADOW_KEY, shadow_result, latency_s=time.monotonic() - started)
        self.metrics.observe_shadow(entry)
        try:
            pair = await self._compare(lane, job, shadow_id, gen.text, cost)
        except Exception:
            if self.ledger is not None:  # no pair, but the money was spent: its row all the same
                await self.ledger.record(entry)
            raise
        if self.ledger is not None:
            try:
                await self.ledger.record_pair(pair, entry)
            except Exception as exc:  # noqa: BLE001 - a lost sample, not a client's record
                log.warning("shadow: pair of %s not written: %s", job.request_id, exc)
        self.observe_pair(pair)

    async def _charge_stopped(
        self, lane: _Lane, job: _Job, partial: Generation | None, why: str = "stopped at shutdown"
    ) -> None:
        """The row of shadow work stopped before it finished, priced for what it streamed."""
        if partial is None:
            return  # nothing streamed yet: nothing known to charge
        try:
            target = self.cascade.by_name[lane.target]
            cost = target.cost_of(partial)
            lane.spent += cost
            self.metrics.shadow.spend.labels(lane.tier).set(lane.spent)
            attempt = Attempt(tier=lane.target, threshold=0.0, generation=partial, accepted=False, cost_usd=cost)
            attempt.abandoned = True
            attempt.reason = f"shadow of {job.request_id} (tier {lane.tier}) {why}"
            attempt.score = policy.combine([])
            result = CascadeResult(model=lane.target, attempts=[attempt], final=attempt, task=job.result.task)
            result.counterfactual_usd = cost
            entry = LedgerEntry.from_result(f"shadow-{job.request_id}", SHADOW_KEY, result, latency_s=partial.latency_s)
            self.metrics.observe_shadow(entry)
            if self.ledger is not None:
                await self.ledger.record(entry)
        except Exception as exc:  # noqa: BLE001 - shutting down or failed already: log it, go on
            log.warning("shadow: stopped work of %s not recorded: %s", job.request_id, exc)

    async def _compare(self, lane: _Lane, job: _Job, shadow_id: str, shadow_text: str, cost: float) -> ShadowPair:
        assert self.rules is not None
        final = job.result.final
        answer = job.result.generation.text
        task = self._task(job.result)
        # the code rule runs the caller's tests in the sandbox: one of the host's slots, waited for
        # (the lane's workers bound how many wait), as a verifier's run takes one
        slots = self.sandboxes if task == "code" else None
        async with slots.hold(wait=True) if slots is not None else contextlib.nullcontext():
            found = await self.rules.compare(task, job.request, answer, shadow_text)
        store = self.settings.ledger.store_prompts
        prompt = prompt_json(job.request)
        return ShadowPair(
            request_id=job.request_id,
            shadow_request_id=shadow_id,
            ts=self.clock(),
            tier=lane.tier,
            target=lane.target,
            task=job.result.task.task if job.result.task else None,
            score=final.score,
            threshold=final.threshold,
            scores={name: s.value for name, s in final.scores.items() if s.value is not None},
            agree=found.agree,
            rule=found.rule,
            detail=found.detail,
            answer_extracted=found.answer,
            shadow_extracted=found.shadow,
            prompt_sha256=sha256(prompt),
            answer_sha256=sha256(answer),
            shadow_sha256=sha256(shadow_text),
            shadow_cost_usd=cost,
            prompt_json=prompt if store else None,
            answer_text=answer if store else None,
            shadow_text=shadow_text if store else None,
        )

    def observe_pair(self, pair: ShadowPair) -> None:
        """Count a compared pair in the live estimates and the agreement drift detector."""
        tally = self._tally(pair.tier, pair.threshold)
        tally.pairs += 1
        tally.agreed += int(pair.agree)
        m, label = self.metrics.shadow, threshold_label(pair.threshold)
        m.pairs.labels(pair.tier, pair.target, "true" if pair.agree else "false").inc()
        low, high = tally.interval or (0.0, 1.0)
        m.agreement.labels(pair.tier, label).set(tally.agreement or 0.0)
        m.accuracy.labels(pair.tier, label).set(tally.agreement or 0.0)
        m.agreement_low.labels(pair.tier, label).set(low)
        m.agreement_high.labels(pair.tier, label).set(high)
        self._alarms(self.drift.observe(pair.tier, pair.task or "open_ended", "agreement", pair.agree, pair.ts))

    def observe_feedback(self, tier: str, task: str, right: bool, ts: float) -> None:
        """Count a request's first label (`router.quality.feedback`) in the feedback drift detector."""
        self._alarms(self.drift.observe(tier, task, "feedback", right, ts))

    # -- helpers ----------------------------------------------------------------------------------

    def _tally(self, tier: str, threshold: float) -> Tally:
        return self.tallies.setdefault((tier, threshold), Tally())

    @staticmethod
    def _task(result: CascadeResult) -> str:
        return result.task.task if result.task else "open_ended"

    def _alarms(self, raised: list[Alarm]) -> None:
        for alarm in raised:
            log.warning(alarm.describe())
            self.metrics.shadow.alarms.labels(alarm.tier, alarm.task, alarm.signal, alarm.direction).inc()
        for tier, task, signal, direction, stat, alarmed in self.drift.state():
            self.metrics.shadow.statistic.labels(tier, task, signal, direction).set(stat)
            self.metrics.shadow.alarm.labels(tier, task, signal, direction).set(1.0 if alarmed else 0.0)

    def _baseline(self, tier: str, signal: Signal, task: str) -> float | None:
        cfg = self._settings(tier)
        if cfg is None or signal == "feedback":  # labels have no stated baseline: learned
            return None
        stated = cfg.baseline_accept if signal == "acceptance" else cfg.baseline_agree
        return stated.get(task, stated.get("*"))

    def _warmup(self, tier: str) -> int:
        cfg = self._settings(tier)
        return cfg.baseline_n if cfg is not None else ShadowSettings.model_fields["baseline_n"].default

    def _settings(self, tier: str) -> ShadowSettings | None:
        try:
            return self.settings.tier(tier).shadow
        except KeyError:
            return None


@dataclass
class _Progress:
    """What a shadow generation has streamed so far, so work stopped mid-way can be priced."""

    text: list[str] = field(default_factory=list)
    last: Delta | None = None

    def partial(self, elapsed_s: float) -> Generation | None:
        """The generation so far (counts as the backend reported them, else a token per piece),
        or None when nothing was streamed."""
        if self.last is None:
            return None
        last = self.last
        return Generation(
            text="".join(self.text),
            finish_reason="cancelled",
            prompt_tokens=last.prompt_tokens or 0,
            completion_tokens=last.completion_tokens if last.completion_tokens is not None else len(self.text),
            token_logprobs=None,
            latency_s=elapsed_s,
            busy_s=last.busy_s,
        )


async def _generate(backend: Backend, request: GenerationRequest, progress: _Progress) -> Generation:
    """The backend's answer, streamed (one choice) so that `progress` knows what was spent if the
    work is stopped; a request for n > 1 choices goes to `generate` whole."""
    if request.n > 1:
        return await backend.generate(request)
    result: Generation | None = None
    async for item in backend.stream(request):
        if isinstance(item, Generation):
            result = item
        else:
            progress.text.append(item.text)
            progress.last = item
    if result is None:
        raise RuntimeError(f"backend {backend.name} ended its stream without a result")
    return result
