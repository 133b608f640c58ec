"""Who pays for a request and what it cost: admission (budgets, rate), the ledger, and metrics,
joined at the two points the HTTP layer calls: `admit` before generation, `record` once the
answer is settled.

`record` writes the ledger first and only then charges the key and counts the metrics, so the
three never disagree about a request that was not committed. A failed ledger write fails the
request with 503: answering without recording would make budgets and cost reports wrong, and a
200 must imply a committed row.
"""

from __future__ import annotations

import asyncio
import logging
import time

from router.auth import Principal
from router.cascade import CascadeResult
from router.config import Settings
from router.engine import Engine
from router.errors import QuotaError, RateLimitError, UnavailableError
from router.ledger import Ledger, LedgerEntry, open_store
from router.limits import Hold, Limits, day_start, month_start
from router.metrics import Metrics

log = logging.getLogger(__name__)


class Accounting:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.ledger = Ledger(open_store(settings.ledger.path)) if settings.ledger.enabled else None
        # a forgotten hold stops counting once every tier could have timed out
        ttl = sum(t.timeout_s for t in settings.tiers) + 60.0
        self.limits = Limits(settings.server.api_keys, hold_ttl_s=ttl)
        self.metrics = Metrics(lambda: engine.backends)

    async def start(self) -> None:
        if self.ledger is None:
            if self.limits.has_budgets:
                log.warning("ledger.enabled = false: key budgets count only what this process has served")
            return
        await self.ledger.open()
        now = time.time()
        self.limits.seed(
            await self.ledger.spend_by_key(day_start(now)), await self.ledger.spend_by_key(month_start(now)), now
        )
        log.info("ledger open at %s", self.settings.ledger.path)

    async def close(self) -> None:
        if self.ledger is not None:
            await self.ledger.close()

    def admit(self, principal: Principal, request_id: str) -> Hold:
        try:
            hold = self.limits.admit(principal, request_id)
        except QuotaError:
            self.metrics.refused.labels("insufficient_quota").inc()
            raise
        except RateLimitError:
            self.metrics.refused.labels("rate_limited").inc()
            raise
        self.metrics.in_flight.set(self.limits.in_flight)
        return hold

    def release(self, hold: Hold) -> None:
        hold.release()
        self.metrics.in_flight.set(self.limits.in_flight)

    async def record(self, principal: Principal, request_id: str, result: CascadeResult) -> None:
        # shielded: a client that hangs up now has still cost what it cost, so the write, the
        # charge and the metrics finish even when the request's task is cancelled
        await asyncio.shield(self._record(principal, request_id, result))

    async def _record(self, principal: Principal, request_id: str, result: CascadeResult) -> None:
        hold = self.limits.hold(request_id)
        started = hold.started if hold is not None else None
        latency_s = self.limits.monotonic() - started if started is not None else sum(
            (a.generation.latency_s if a.generation else 0.0) + a.verify_s for a in result.attempts
        )
        entry = LedgerEntry.from_result(request_id, principal.key_id, result, latency_s=latency_s)
        if self.ledger is not None:
            try:
                await self.ledger.record(entry)
            except Exception as exc:
                log.error("ledger write failed for %s: %s", request_id, exc)
                raise UnavailableError("The cost ledger could not record this request; try again.") from None
        self.limits.charge(principal.key_id, entry.cost_usd, entry.ts)
        if hold is not None:
            self.release(hold)
        self.metrics.observe(entry)
