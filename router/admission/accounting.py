"""Who pays for a request and what it cost: admission (budgets, rate), the ledger, and metrics,
joined at the points the HTTP layer calls: `admit` before generation, `written` before the first
byte of an answer, `record` once the answer is settled, `release` on every way out.

Admission reserves the request's worst case against its key (`worst_case_usd`). A streamed
request also gets its pending row written ahead, on the ledger's thread while generation starts:
its text leaves before the answer settles, so the row must exist first. A plain request needs no
such row (its settled row is committed before any byte is sent), which keeps it at one write.
`record` writes the settled row first and only then charges the key and counts the metrics. A
failed settled write fails the request with 503 (a stream: an error event instead of its final
chunk); the key is still charged what it spent, and for a stream the pending row stands for the
request in the ledger. While the ledger is failing, every new request waits for its own pending
row before any work, so nothing is generated that cannot be recorded; the first write that
succeeds ends that.

On a PostgreSQL ledger the budgets and rate limits of a limited key are shared by every replica
(`router.admission.limits.SharedLimits`): `ready` admits the request through the database, in the
transaction that writes its pending row (its reservation), so such a request, plain or streamed,
has its row before any work; a request that ends without a record drops it again.

A response-cache hit (`router.cache`) generates nothing: it is admitted with no reservation, by
its key's rate limit alone (a key whose budget is spent still gets its hits), and recorded at
zero cost through the same write, charge and metrics as any answer (`record_replayed`). A
request whose rate is spent is refused before the cache is read (`refuse_spent_rate`), so a
refused request costs no lookup; only a budget's refusal comes after one, since a hit would
have been served.

A label (POST /v1/feedback) is a call to the service like any other: it counts against the request
rate of its key and of the key's team (`admit_call`), before the ledger is read, and reserves
nothing (it costs nothing, and has no tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace

from router import policy
from router.admission.auth import Principal
from router.admission.lifecycle import Replayed, RequestAccount, Ticket
from router.admission.limits import (
    Limits,
    RateRefusals,
    Reservation,
    SharedCounter,
    SharedLimits,
    day_start,
    month_start,
)
from router.admission.quota import Quota
from router.cascade import CascadeResult, Tier
from router.config import Settings
from router.engine import Engine
from router.errors import QuotaError, RateLimitError, UnavailableError
from router.generation import GenerationRequest, Message
from router.ledger.entries import LedgerEntry, PendingEntry
from router.ledger.stores import open_store
from router.ledger.writer import Ledger
from router.metrics import Metrics
from router.policy import Usage, cost_usd
from router.verification import VerifierSet, worst_cost

log = logging.getLogger(__name__)

_LEDGER_RETRY_AFTER_S = 5.0
# a request that only asks a verifier whether it can say what it may cost (at start-up)
_PROBE = GenerationRequest(messages=(Message("user", "?"),), max_tokens=1)


def worst_case_usd(
    plan: Sequence[Tier],
    request: GenerationRequest,
    *,
    tiers: Mapping[str, Tier] | None = None,
    verify: bool = True,
) -> float:
    """The most a request can be charged: every planned tier generates `n` choices, each to its
    max_tokens (the request's, capped by the tier's), the prompt counted once at the most tokens
    the tier's backend can count for it (`Backend.prompt_token_limit`: everything sent, tools,
    calls and schemas included); a time-priced tier for its whole timeout per choice. With
    `verify`, each tier's verification at its costliest: of the tier's verifier sets (its own and
    one per task policy, as the task is not known yet), the one whose members' worst costs
    (`router.verification.worst_cost`: self-consistency samples, a judge's reply, a cross-tier
    prefill, a second program) come to most, each part priced at the tier that does it (found in
    `tiers`, else the tier verified, as the cascade prices it). A verifier that uses a model
    and does not say what it may cost counts nothing here (`unreserved_verifiers`).

    Admission reserves this (`Accounting.admit`); the shadow budget estimates a shadow request
    with it, without `verify` (shadow work is a generation only)."""
    by_name = tiers if tiers is not None else {t.name: t for t in plan}
    return math.fsum(_tier_worst_case(t, request, by_name, verify=verify) for t in plan)


def worst_case_tokens(plan: Sequence[Tier], request: GenerationRequest) -> int:
    """The most tokens (input + output) a request can be counted for: every planned tier's
    prompt bound and `n` choices of its max_tokens, as `worst_case_usd` prices them. What a
    token-rate limit reserves; verifiers' own tokens are not counted against it."""
    total = 0
    for tier in plan:
        sent = request.with_(max_tokens=min(request.max_tokens, tier.settings.max_tokens))
        total += tier.backend.prompt_token_limit(sent) + tier.backend.completion_token_limit(sent)
    return total


def refuse_oversized(plan: Sequence[Tier], request: GenerationRequest, *, stream: bool) -> None:
    """400 (`AnswerTooLargeError`, naming the parameter to lower) when a planned tier could not take
    the answer the client asks for whole: an `openai` tier reads at most `max_response_bytes`, and
    an answer over it is the request's doing, never the upstream's failure
    (`router.backends.openai.answer_size`). Each tier is asked with max_tokens as the cascade
    bounds it; only the last streams live, and a request of n > 1 is never streamed from a tier."""
    for tier in plan:
        sent = request.with_(max_tokens=min(request.max_tokens, tier.settings.max_tokens))
        tier.backend.refuse_oversized(sent, stream=stream and request.n == 1 and tier is plan[-1])


def _tier_worst_case(tier: Tier, request: GenerationRequest, tiers: Mapping[str, Tier], *, verify: bool) -> float:
    settings = tier.settings
    sent = request.with_(max_tokens=min(request.max_tokens, settings.max_tokens))  # as the cascade bounds it
    usage = Usage(
        tier.backend.prompt_token_limit(sent),
        tier.backend.completion_token_limit(sent),
        request.n * settings.timeout_s,
    )
    generating = cost_usd(settings.price, usage)
    if not verify:
        return generating
    return generating + max(_verifying(tier, vs, sent, tiers) for vs in _verifier_sets(tier))


def _verifier_sets(tier: Tier) -> list[VerifierSet]:
    return [tier.verifiers, *(judge.verifiers for judge in tier.tasks.values())]


def _verifying(tier: Tier, verifiers: VerifierSet, request: GenerationRequest, tiers: Mapping[str, Tier]) -> float:
    parts = []
    for member in verifiers.members:
        found = worst_cost(member.verifier, request)
        if found is not None:
            parts += [
                (
                    tiers.get(p.tier or tier.name, tier).settings.price,
                    Usage(p.prompt_tokens, p.completion_tokens, p.seconds),
                )
                for p in found.parts()
            ]
    return policy.verification_cost(parts)


def lifetime_s(tiers: Sequence[Tier]) -> float:
    """The longest a request can run: every tier to its timeout, and its verifying (if it has
    verifiers) to its verification deadline."""
    return math.fsum(
        t.settings.timeout_s + (t.settings.verify_timeout_s if any(_verifier_sets(t)) else 0.0) for t in tiers
    )


def unreserved_verifiers(tiers: Sequence[Tier]) -> list[str]:
    """`tier.verifier` for every verifier that asks a model for work without saying what it may
    cost: its work is charged when done but not reserved, so it can take a key past its budget."""
    return sorted(
        {
            f"{t.name}.{m.verifier.name}"
            for t in tiers
            for vs in _verifier_sets(t)
            for m in vs.members
            if worst_cost(m.verifier, _PROBE) is None
        }
    )


class Accounting:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        *,
        user_quota: Callable[[str, str], Quota | None] | None = None,
    ) -> None:
        self.settings = settings
        # an end user's limits within a team (the control plane's), looked up per request
        self.user_quota = user_quota
        # a forgotten hold stops counting once every tier could have timed out, its verifying
        # included (on a shared ledger a reservation that expired while its request still ran
        # would free budget that request then spends)
        ttl = lifetime_s(engine.cascade.tiers) + 60.0
        store = (
            open_store(settings.ledger.location, settings=settings.ledger, hold_ttl_s=ttl)
            if settings.ledger.enabled
            else None
        )
        self.shared = (
            SharedLimits(store, hold_ttl_s=ttl, workers=settings.ledger.pool_size)
            if isinstance(store, SharedCounter)
            else None
        )
        # a shared store takes concurrent writes, each on its own connection; half the pool, the
        # rest left to admissions
        writers = max(1, settings.ledger.pool_size // 2) if self.shared is not None else 1
        self.ledger = Ledger(store, writers=writers) if store is not None else None
        self._pruning: asyncio.Task[None] | None = None  # shared limits' idle counters (SharedLimits.pruning)
        self.metrics = Metrics(lambda: engine.backends)
        self.tiers = engine.cascade.by_name  # where verifier work is priced
        unreserved = unreserved_verifiers(engine.cascade.tiers)
        if unreserved and any(
            k.usd_per_day is not None or k.usd_per_month is not None for k in settings.server.api_keys
        ):
            log.warning(
                "verifiers %s ask a model for work and do not say what it may cost: it is charged, not "
                "reserved, so a key can pass its budget by that work of its requests in flight",
                ", ".join(unreserved),
            )
        self.refusals = RateRefusals()  # under shared limits: the database's last rate refusals
        self.limits = Limits(
            settings.server.api_keys,
            hold_ttl_s=ttl,
            on_change=self.metrics.in_flight.set,
            shared=self.shared is not None,
        )

    async def start(self) -> None:
        if self.ledger is None:
            if self.limits.has_budgets:
                log.warning("ledger.enabled = false: key budgets count only what this process has served")
            return
        await self.ledger.open()
        if self.shared is not None:
            self._pruning = asyncio.create_task(
                self.shared.pruning(self.settings.ledger.prune_every_s), name="tierroute-limits-prune"
            )
        now = time.time()
        if self.shared is None:  # shared limits read the database at each admission instead
            self.limits.seed(
                await self.ledger.spend_by_key(day_start(now)), await self.ledger.spend_by_key(month_start(now)), now
            )
        unsettled = await self.ledger.pending()
        if unsettled:
            log.warning(
                "ledger: %d requests were admitted and never settled (the process died, or the disk failed, "
                "while they ran); they count against their keys' budgets at their reservation, $%.6f in all",
                len(unsettled),
                sum(p.reserved_usd for p in unsettled),
            )
        log.info("ledger open at %s", self.settings.ledger.location)

    async def close(self) -> None:
        if self._pruning is not None:
            self._pruning.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruning
            self._pruning = None
        if self.shared is not None:
            await asyncio.to_thread(self.shared.close)
        if self.ledger is not None:
            await self.ledger.close()

    def open(
        self,
        principal: Principal,
        request_id: str,
        request: GenerationRequest,
        plan: Sequence[Tier],
        model: str,
        *,
        stream: bool,
        user: str | None = None,
        cached: bool = False,
        surface: str | None = None,
    ) -> RequestAccount:
        """Admit the request (429 before any work) and give its account, which the route enters
        once (`router.admission.lifecycle`). `cached`: a cache hit, which generates nothing, so
        it reserves nothing and only the key's rate limit can refuse it. `surface`: the API it
        came through ("chat.completions", "responses", ...), kept in its ledger row."""
        ticket = self.admit(principal, request_id, request, plan, model, stream=stream, user=user, cached=cached)
        ticket.surface = surface
        return RequestAccount(self, principal, ticket)

    def admit(
        self,
        principal: Principal,
        request_id: str,
        request: GenerationRequest,
        plan: Sequence[Tier],
        model: str,
        *,
        stream: bool,
        user: str | None = None,
        cached: bool = False,
    ) -> Ticket:
        """429 when the key's budget cannot take the request's worst case, or its rate is spent;
        otherwise reserve it, and for a stream (or while the ledger fails) start its pending row.
        With shared limits, a limited key's admission waits for `ready`. A cache hit (`cached`)
        reserves nothing, no dollars and no tokens, and meets the rate limits only. First, 400
        when the answer asked for cannot be taken whole from a planned tier (`refuse_oversized`)."""
        if not cached:
            refuse_oversized(plan, request, stream=stream)
        reserve = 0.0 if cached else worst_case_usd(plan, request, tiers=self.tiers)
        quotas = self.quotas(principal, user)
        limited_tokens = any(q.tokens_per_minute is not None for q in quotas)
        tokens = worst_case_tokens(plan, request) if limited_tokens and not cached else 0
        with self._counting_refusals():
            hold = self.limits.admit(
                principal, request_id, reserve, quotas=quotas, reserve_tokens=tokens, budget=not cached
            )
        team = principal.team
        pending = PendingEntry(request_id, time.time(), principal.key_id, model, reserve, team=team, user=user)
        shared = self.shared is not None and self.shared.limited(quotas)
        ticket = Ticket(
            hold,
            None,
            pending,
            user=user,
            shared=shared,
            quotas=quotas,
            team=team,
            reserved_tokens=tokens,
            budget=not cached,
        )
        if not shared and (stream or (self.ledger is not None and not self.ledger.healthy)):
            self._begin(ticket)
        return ticket

    def refuse_spent_rate(self, principal: Principal, user: str | None) -> None:
        """429 now, with nothing counted, when a rate would refuse the request even as a cache hit:
        the route asks before it reads the cache. Exact in one process; under shared limits, from
        the database's last refusal of the subject, until its Retry-After (`RateRefusals`)."""
        quotas = self.quotas(principal, user)
        with self._counting_refusals():
            if self.shared is None:
                self.limits.check_rates(quotas)
            else:
                self.refusals.check(quotas)

    async def admit_call(self, principal: Principal, call_id: str) -> None:
        """A call that generates nothing and holds nothing (a label, POST /v1/feedback): 429 when
        the request rate of its key or its key's team is spent, else it counts there as a
        request does. Budgets and token rates do not see it: it costs nothing and has no tokens.
        Under shared limits the database decides (no pending row is written for it), and a
        subject it refused moments ago is refused again without asking it (`RateRefusals`)."""
        quotas = tuple(
            replace(q, usd_per_day=None, usd_per_month=None, tokens_per_minute=None)
            for q in self.quotas(principal, None)
            if q.requests_per_minute is not None
        )
        if not quotas:
            return
        with self._counting_refusals():
            if self.shared is None:
                self.limits.count_call(quotas)
                return
            self.refusals.check(quotas)
            now = time.time()
            call = Reservation(call_id, now, principal.key_id, "", 0.0, 0.0, team=principal.team, holds=False)
            try:
                await self.shared.admit(quotas, call, now, budget=False)
            except RateLimitError as refused:
                self.refusals.heard(quotas, refused)
                raise

    def quotas(self, principal: Principal, user: str | None) -> tuple[Quota, ...]:
        """Every level's limits a request falls under: its key's, its team's, and (when the key has
        a team and the request names a `user`) that end user's within the team."""
        found = principal.quotas
        if principal.team is not None and user and self.user_quota is not None:
            own = self.user_quota(principal.team, user)
            if own is not None:
                found = (*found, own)
        return found

    @contextlib.contextmanager
    def _counting_refusals(self) -> Iterator[None]:
        try:
            yield
        except QuotaError:
            self.metrics.refused.labels("insufficient_quota").inc()
            raise
        except RateLimitError:
            self.metrics.refused.labels("rate_limited").inc()
            raise

    def _begin(self, ticket: Ticket) -> None:
        if self.ledger is not None and ticket.written is None:
            ticket.written = self.ledger.begin(ticket.pending)
            ticket.written.add_done_callback(_retrieve)

    async def ready(self, ticket: Ticket) -> None:
        """Before any work: while the ledger is failing, wait for this request's pending row (503
        if it cannot be written). A healthy ledger costs no wait here. A key under shared
        limits is admitted here, through the database (429, or 503 when it cannot be reached)."""
        if ticket.shared and self.shared is not None:
            if not ticket.reserved:
                p = ticket.pending
                reservation = Reservation(
                    p.request_id,
                    p.ts,
                    p.key_id,
                    p.model,
                    p.reserved_usd,
                    self.shared.hold_ttl_s,
                    team=p.team,
                    user=p.user,
                    reserved_tokens=ticket.reserved_tokens,
                )
                with self._counting_refusals():
                    try:
                        await self.shared.admit(ticket.quotas, reservation, p.ts, budget=ticket.budget)
                    except RateLimitError as refused:
                        self.refusals.heard(ticket.quotas, refused)
                        raise
                ticket.reserved = True
            return
        if self.ledger is not None and not self.ledger.healthy:
            self._begin(ticket)
            await self.written(ticket)

    async def written(self, ticket: Ticket) -> None:
        """Before the first byte of an answer: its pending row is committed, or 503."""
        if ticket.written is None:
            return
        try:
            await asyncio.shield(ticket.written)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the store raised, the request cannot be recorded
            log.error("ledger: pending row of %s not written: %s", ticket.request_id, exc)
            raise UnavailableError(
                "The cost ledger cannot record requests right now; try again.", retry_after=_LEDGER_RETRY_AFTER_S
            ) from None

    def release(self, ticket: Ticket) -> None:
        """Every way a request ends comes here (a second call does nothing); a request whose
        record is being written is released by that write, after its charge."""
        if not ticket.settling:
            ticket.hold.release()
            if ticket.reserved and self.shared is not None:
                ticket.reserved = False
                self.shared.drop(ticket.request_id)
            elif ticket.written is not None and self.ledger is not None:
                # a stream that ended with nothing recorded and nothing spent (a tier refused it
                # before any output: a prompt over its context, a token outside its vocabulary):
                # its pending row would count its reservation against the key for the day
                written, ticket.written = ticket.written, None
                self.ledger.drop_after(written, ticket.request_id)

    async def record(self, principal: Principal, ticket: Ticket, result: CascadeResult) -> None:
        # shielded: a client that hangs up now has still cost what it cost, so the write, the
        # charge, the release and the metrics finish even when the request's task is cancelled
        ticket.settling = True
        await asyncio.shield(self._record(principal, ticket, result))

    async def record_replayed(self, principal: Principal, ticket: Ticket, replayed: Replayed) -> None:
        """A cache hit's row, at zero cost: written and counted as `record` writes a generated one."""
        ticket.settling = True

        def entry(latency_s: float) -> LedgerEntry:
            p = ticket.pending
            return replayed.entry(
                p.request_id, principal.key_id, p.model, latency_s=latency_s, user=ticket.user, team=ticket.team
            )

        await asyncio.shield(self._record_entry(principal, ticket, entry))

    async def _record(self, principal: Principal, ticket: Ticket, result: CascadeResult) -> None:
        def entry(latency_s: float) -> LedgerEntry:
            return LedgerEntry.from_result(
                ticket.request_id, principal.key_id, result, latency_s=latency_s, user=ticket.user, team=ticket.team
            )

        await self._record_entry(principal, ticket, entry)

    async def _record_entry(self, principal: Principal, ticket: Ticket, make: Callable[[float], LedgerEntry]) -> None:
        hold = ticket.hold
        try:
            latency_s = self.limits.monotonic() - hold.started
            entry = dataclasses.replace(make(latency_s), surface=ticket.surface)
            failed = None
            if self.ledger is not None:
                if ticket.written is not None:  # its pending row first, or the settled row could come before it
                    with contextlib.suppress(Exception):
                        await asyncio.shield(ticket.written)
                try:
                    await self.ledger.record(entry)
                except Exception as exc:  # noqa: BLE001 - reported as 503 below, once the key is charged
                    failed = exc
            # charged even when the write failed: the work was done, and this process's budgets
            # must see it (the pending row carries it, at its reservation, past a restart)
            # (less what an expired hold already charged for it)
            tokens = entry.prompt_tokens + entry.completion_tokens
            self.limits.settle(hold, entry.cost_usd - hold.charged_usd, tokens, entry.ts)
        finally:
            hold.release()
        if failed is not None:
            log.error("ledger write failed for %s (its pending row stands for it): %s", ticket.request_id, failed)
            raise UnavailableError(
                "The cost ledger could not record this request; try again.", retry_after=_LEDGER_RETRY_AFTER_S
            )
        self.metrics.observe(entry)


def _retrieve(fut: asyncio.Future[None]) -> None:
    """A pending row's failure is reported by `written` when it matters; never as 'never retrieved'."""
    if not fut.cancelled():
        fut.exception()
