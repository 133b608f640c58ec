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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from router.admission.auth import Principal
from router.admission.limits import Hold, Limits, Reservation, SharedCounter, SharedLimits, day_start, month_start
from router.cascade import CascadeResult, Tier
from router.config import Settings
from router.engine import Engine
from router.errors import QuotaError, RateLimitError, UnavailableError
from router.generation import GenerationRequest
from router.ledger.entries import LedgerEntry, PendingEntry
from router.ledger.stores import open_store
from router.ledger.writer import Ledger
from router.metrics import Metrics
from router.pricing import Usage, cost_usd

log = logging.getLogger(__name__)

# chat templates add a few special tokens per message and to open the reply
_TEMPLATE_TOKENS_PER_MESSAGE = 8
_TEMPLATE_TOKENS = 16
_LEDGER_RETRY_AFTER_S = 5.0


def prompt_token_bound(request: GenerationRequest) -> int:
    """An upper bound on the prompt's tokens under any byte-level tokenizer (BPE or SentencePiece
    with byte fallback: every token covers at least one byte), plus the chat template's tokens."""
    if request.messages is None:
        return len((request.prompt or "").encode("utf-8", "surrogatepass")) + _TEMPLATE_TOKENS
    return _TEMPLATE_TOKENS + sum(
        len(m.content.encode("utf-8", "surrogatepass")) + _TEMPLATE_TOKENS_PER_MESSAGE for m in request.messages
    )


def worst_case_usd(plan: Sequence[Tier], request: GenerationRequest) -> float:
    """The most a request's generations can cost: every planned tier runs, each to its max_tokens
    (the request's, capped by the tier's) with the prompt at its token bound; a time-priced tier
    for its whole timeout. Verifier work (a judge, self-consistency samples) is not included."""
    prompt = prompt_token_bound(request)
    return sum(
        cost_usd(t.settings.price, Usage(prompt, min(request.max_tokens, t.settings.max_tokens), t.settings.timeout_s))
        for t in plan
    )


@dataclass
class Ticket:
    """An admitted request: its budget hold and its pending row's write."""

    request_id: str
    hold: Hold
    written: asyncio.Future[None] | None  # its pending row's write, if one was started
    pending: PendingEntry
    settling: bool = False  # its record is being written: that (shielded) write releases the hold
    user: str | None = None  # OpenAI's `user` field, kept in its ledger row
    shared: bool = False  # admitted through the shared limits in `ready` (its key is limited)
    reserved: bool = False  # that admission committed its reservation (its pending row)


class Accounting:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        # a forgotten hold stops counting once every tier could have timed out
        ttl = sum(t.timeout_s for t in settings.tiers) + 60.0
        store = (
            open_store(settings.ledger.location, settings=settings.ledger, hold_ttl_s=ttl)
            if settings.ledger.enabled
            else None
        )
        self.shared = (
            SharedLimits(store, settings.server.api_keys, hold_ttl_s=ttl, workers=settings.ledger.pool_size)
            if isinstance(store, SharedCounter)
            else None
        )
        # a shared store takes concurrent writes, each on its own connection; half the pool, the
        # rest left to admissions
        writers = max(1, settings.ledger.pool_size // 2) if self.shared is not None else 1
        self.ledger = Ledger(store, writers=writers) if store is not None else None
        self.metrics = Metrics(lambda: engine.backends)
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
        if self.shared is not None:
            await asyncio.to_thread(self.shared.close)
        if self.ledger is not None:
            await self.ledger.close()

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
    ) -> Ticket:
        """429 when the key's budget cannot take the request's worst case, or its rate is spent;
        otherwise reserve it, and for a stream (or while the ledger fails) start its pending row.
        With shared limits, a limited key's admission waits for `ready`."""
        reserve = worst_case_usd(plan, request)
        with self._counting_refusals():
            hold = self.limits.admit(principal, request_id, reserve)
        pending = PendingEntry(request_id, time.time(), principal.key_id, model, reserve)
        shared = self.shared is not None and self.shared.limited(principal.entry)
        ticket = Ticket(request_id, hold, None, pending, user=user, shared=shared)
        if not shared and (stream or (self.ledger is not None and not self.ledger.healthy)):
            self._begin(ticket)
        return ticket

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
                entry = self.shared.keys[ticket.pending.key_id]
                p = ticket.pending
                reservation = Reservation(p.request_id, p.ts, p.key_id, p.model, p.reserved_usd, self.shared.hold_ttl_s)
                with self._counting_refusals():
                    await self.shared.admit(entry, reservation, p.ts)
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

    async def record(self, principal: Principal, ticket: Ticket, result: CascadeResult) -> None:
        # shielded: a client that hangs up now has still cost what it cost, so the write, the
        # charge, the release and the metrics finish even when the request's task is cancelled
        ticket.settling = True
        await asyncio.shield(self._record(principal, ticket, result))

    async def _record(self, principal: Principal, ticket: Ticket, result: CascadeResult) -> None:
        hold = ticket.hold
        try:
            latency_s = self.limits.monotonic() - hold.started
            entry = LedgerEntry.from_result(
                ticket.request_id, principal.key_id, result, latency_s=latency_s, user=ticket.user
            )
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
            self.limits.charge(principal.key_id, entry.cost_usd - hold.charged_usd, entry.ts)
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
