"""One request's way through accounting, as one object the route enters once.

A request is admitted (429 before any work), made ready (503 before any work while the ledger
fails; a shared-limits key admitted through the database), its pending row awaited before the first
byte of a stream, its settled row recorded before the client sees the answer, and on every way out
the work it did without an answer recorded and its budget hold released. Six calls a route had to
remember, in order, on every path (`admit`, `ready`, `written`, `record`, and on the way out the
spent work and `release`); here `Accounting.open` admits, `async with` makes ready and guarantees
the way out, and a stream that outlives the handler takes the way out with it
(`contextlib.AsyncExitStack.pop_all`). A cache hit is recorded with `record_replayed` instead
of `record`: the same way out, a row that says nothing was generated.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from router.admission.auth import Principal
from router.admission.limits import Hold
from router.admission.quota import Quota
from router.cascade import CascadeResult, Spent
from router.ledger.entries import LedgerEntry, PendingEntry
from router.telemetry import context as telemetry
from router.telemetry.attempts import replayed_facts, result_facts

log = logging.getLogger(__name__)


@dataclass
class Ticket:
    """An admitted request: its budget hold and its pending row's write."""

    hold: Hold
    written: asyncio.Future[None] | None  # its pending row's write, if one was started
    pending: PendingEntry
    settling: bool = False  # its record is being written: that (shielded) write releases the hold
    user: str | None = None  # OpenAI's `user` field, kept in its ledger row
    shared: bool = False  # admitted through the shared limits in `ready` (its key is limited)
    reserved: bool = False  # that admission committed its reservation (its pending row)
    quotas: tuple[Quota, ...] = ()  # every level's limits it falls under: key, team, end user
    team: str | None = None  # the key's team at admission: the ledger row's, and its spend's
    reserved_tokens: int = 0  # the most tokens (input + output) it can use: its token-rate reservation
    budget: bool = True  # False: a cache hit, admitted by its rate limit alone (it costs nothing)
    surface: str | None = None  # the API it came through: its ledger row's, its metrics' and its span's

    @property
    def request_id(self) -> str:
        return self.pending.request_id  # one copy: the row the ledger writes for it


class Replayed(Protocol):
    """An answer served without generating (a cache hit, `router.cache.answer.CachedAnswer`):
    what its ledger row says."""

    @property
    def tier(self) -> str: ...
    @property
    def task(self) -> str | None: ...

    def entry(
        self, request_id: str, key_id: str, model: str, *, latency_s: float, user: str | None, team: str | None = None
    ) -> LedgerEntry: ...


class Accounts(Protocol):
    """What an account asks of the service's accounting (`router.admission.accounting.Accounting`)."""

    async def ready(self, ticket: Ticket) -> None: ...

    async def written(self, ticket: Ticket) -> None: ...

    async def record(self, principal: Principal, ticket: Ticket, result: CascadeResult) -> None: ...

    async def record_replayed(self, principal: Principal, ticket: Ticket, replayed: Replayed) -> None: ...

    def release(self, ticket: Ticket) -> None: ...


class RequestAccount:
    """An admitted request's account: `ready` on entering, `written`, `record`, and `close` on
    every way out (entering's failure included; a second `close` does nothing)."""

    def __init__(self, accounting: Accounts, principal: Principal, ticket: Ticket) -> None:
        self.accounting = accounting
        self.principal = principal
        self.ticket = ticket
        self.spent = Spent()  # what a request that ends without an answer has cost: recorded all the same
        self._recorded = False
        self._closed = False
        # its span and log line (router.telemetry), when tracing or JSON logs are on: the same id
        # as the response's and the ledger's, and the key's name (never the key)
        self.telemetry = telemetry.current()
        if self.telemetry is not None:
            self.telemetry.request_id = ticket.request_id
            self.telemetry.key = principal.key_id
            self.telemetry.model = ticket.pending.model
            self.telemetry.surface = ticket.surface

    @property
    def request_id(self) -> str:
        return self.ticket.request_id

    async def __aenter__(self) -> RequestAccount:
        try:
            await self.accounting.ready(self.ticket)  # a failing ledger: 503 before any work
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def written(self) -> None:
        """Before the first byte of an answer: its pending row is committed, or 503."""
        await self.accounting.written(self.ticket)

    async def record(self, result: CascadeResult) -> None:
        """The settled row, committed before the client sees the answer (503 if it cannot be)."""
        if self.telemetry is not None:
            self.telemetry.facts = result_facts(result)
        await self.accounting.record(self.principal, self.ticket, result)
        self._recorded = True

    async def record_replayed(self, replayed: Replayed) -> None:
        """A cache hit's row (nothing generated, nothing charged), committed before the client sees it."""
        if self.telemetry is not None:
            self.telemetry.facts = replayed_facts(replayed.tier, replayed.task)
        await self.accounting.record_replayed(self.principal, self.ticket, replayed)
        self._recorded = True

    async def close(self) -> None:
        """The way out: work done without a recorded answer (a tier failed after another answered,
        the client left mid-answer) is recorded and charged, once; then the hold is released."""
        if self._closed:
            return
        self._closed = True
        try:
            result, self.spent.result = self.spent.result, None
            if result is not None and not self._recorded:
                if self.telemetry is not None:
                    self.telemetry.facts = result_facts(result)
                try:
                    await self.accounting.record(self.principal, self.ticket, result)
                except Exception as exc:  # noqa: BLE001 - the request is already failing; keep its own error
                    log.error("could not record the spent work of %s: %s", self.request_id, exc)
        finally:
            self.accounting.release(self.ticket)
