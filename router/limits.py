"""Per-key admission, decided before any generation: USD budgets, then a request rate limit.

Budgets (`usd_per_day`, `usd_per_month`, UTC calendar periods) compare what the key has spent,
as the ledger recorded it, plus an estimate for each of its requests still in flight, with the
limit. The cost of a request is only known once it is answered, so a budget is soft by at most the
cost of the requests admitted while the key was just under it: the request that crosses the line
is served, the next one gets 429 `insufficient_quota`. The in-flight estimate is the key's recent
mean cost per request, which keeps a burst from slipping many requests past a nearly spent budget.

The rate limit (`requests_per_minute`) is a sliding window: at most N admissions in any 60 s,
and a refused request learns from `Retry-After` when the oldest one leaves the window. A request
refused for budget does not use up the rate.

State lives in memory, seeded from the ledger at start-up. Several replicas would each enforce
the full limit; a shared ledger (PostgreSQL) and a shared limiter are the way past one machine.
"""

from __future__ import annotations

import calendar
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from router.auth import Principal
from router.config import ApiKeyEntry
from router.errors import QuotaError, RateLimitError

log = logging.getLogger(__name__)

WINDOW_S = 60.0
_EWMA = 0.2  # weight of the newest cost in a key's running mean cost per request


def day_start(ts: float) -> float:
    """Unix time of 00:00 UTC on the day holding `ts`."""
    y, m, d = time.gmtime(ts)[:3]
    return float(calendar.timegm((y, m, d, 0, 0, 0)))


def month_start(ts: float) -> float:
    """Unix time of 00:00 UTC on the first of the month holding `ts`."""
    y, m = time.gmtime(ts)[:2]
    return float(calendar.timegm((y, m, 1, 0, 0, 0)))


class RateLimiter:
    """Sliding-window log per key: exact, and O(1) amortised per request."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._seen: dict[str, deque[float]] = {}

    def acquire(self, key_id: str, per_minute: int) -> None:
        now = self.clock()
        seen = self._seen.setdefault(key_id, deque())
        while seen and seen[0] <= now - WINDOW_S:
            seen.popleft()
        if len(seen) >= per_minute:
            retry_after = seen[0] + WINDOW_S - now
            raise RateLimitError(
                f"Rate limit reached for key '{key_id}': {per_minute} requests per minute. "
                f"Retry in {math.ceil(retry_after)} s.",
                retry_after=retry_after,
            )
        seen.append(now)


@dataclass
class _Spend:
    day: float = 0.0  # the UTC day start these totals belong to
    month: float = 0.0
    day_usd: float = 0.0
    month_usd: float = 0.0
    mean_cost: float | None = None  # running mean cost per request, for in-flight estimates

    def roll(self, now: float) -> None:
        d, m = day_start(now), month_start(now)
        if d != self.day:
            self.day, self.day_usd = d, 0.0
        if m != self.month:
            self.month, self.month_usd = m, 0.0


@dataclass
class Hold:
    """An admitted request: its in-flight cost estimate counts against the key until released."""

    request_id: str
    key_id: str
    estimate_usd: float
    started: float  # monotonic
    expires: float  # monotonic; a hold nobody released stops counting then
    _limits: Limits | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._limits is not None:
            self._limits._drop(self)
            self._limits = None


class Limits:
    """Admission for every key in the config. Runs on the event loop thread only."""

    def __init__(
        self,
        keys: Iterable[ApiKeyEntry],
        *,
        hold_ttl_s: float = 600.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys = {k.name: k for k in keys}
        self.hold_ttl_s = hold_ttl_s
        self.clock = clock
        self.monotonic = monotonic
        self.rate = RateLimiter(monotonic)
        self._spend: dict[str, _Spend] = {}
        self._holds: dict[str, Hold] = {}

    @property
    def has_budgets(self) -> bool:
        return any(k.usd_per_day is not None or k.usd_per_month is not None for k in self.keys.values())

    def seed(self, day_usd: dict[str, float], month_usd: dict[str, float], now: float) -> None:
        """Start from what the ledger says each key spent today and this month (as of `now`)."""
        for key_id in set(day_usd) | set(month_usd):
            s = self._spend_of(key_id, now)
            s.day_usd = day_usd.get(key_id, 0.0)
            s.month_usd = month_usd.get(key_id, 0.0)

    def spent(self, key_id: str) -> tuple[float, float]:
        """(today, this month) in USD, settled requests only."""
        s = self._spend_of(key_id, self.clock())
        return s.day_usd, s.month_usd

    def reserved(self, key_id: str) -> float:
        self._expire()
        return sum(h.estimate_usd for h in self._holds.values() if h.key_id == key_id)

    def admit(self, principal: Principal, request_id: str) -> Hold:
        """Raise QuotaError or RateLimitError, or return a hold to release when the request ends."""
        entry = principal.entry
        now = self.monotonic()
        if entry is not None:
            self._check_budget(entry)
            if entry.requests_per_minute is not None:
                self.rate.acquire(entry.name, entry.requests_per_minute)
        spend = self._spend.get(principal.key_id)
        estimate = spend.mean_cost if spend is not None and spend.mean_cost is not None else 0.0
        hold = Hold(request_id, principal.key_id, estimate, now, now + self.hold_ttl_s, self)
        self._holds[request_id] = hold
        return hold

    def hold(self, request_id: str) -> Hold | None:
        return self._holds.get(request_id)

    def charge(self, key_id: str, usd: float, ts: float) -> None:
        """Add a settled request's cost to its key's spend."""
        s = self._spend_of(key_id, self.clock())
        if day_start(ts) == s.day:
            s.day_usd += usd
        if month_start(ts) == s.month:
            s.month_usd += usd
        s.mean_cost = usd if s.mean_cost is None else (1 - _EWMA) * s.mean_cost + _EWMA * usd

    def _check_budget(self, entry: ApiKeyEntry) -> None:
        if entry.usd_per_day is None and entry.usd_per_month is None:
            return
        day_usd, month_usd = self.spent(entry.name)
        pending = self.reserved(entry.name)
        for period, spent, limit, resets in (
            ("daily", day_usd, entry.usd_per_day, "at 00:00 UTC"),
            ("monthly", month_usd, entry.usd_per_month, "on the 1st at 00:00 UTC"),
        ):
            if limit is not None and spent + pending >= limit:
                raise QuotaError(
                    f"You exceeded your current quota: key '{entry.name}' has used ${spent:.6f} "
                    f"(+${pending:.6f} in flight) of its ${limit:g} {period} budget; it resets {resets}."
                )

    def _spend_of(self, key_id: str, now: float) -> _Spend:
        s = self._spend.get(key_id)
        if s is None:
            s = self._spend[key_id] = _Spend(day=day_start(now), month=month_start(now))
        s.roll(now)
        return s

    def _drop(self, hold: Hold) -> None:
        if self._holds.get(hold.request_id) is hold:
            del self._holds[hold.request_id]

    def _expire(self) -> None:
        now = self.monotonic()
        for rid in [rid for rid, h in self._holds.items() if h.expires <= now]:
            log.warning("request %s held its budget reservation past %.0f s; dropping it", rid, self.hold_ttl_s)
            self._holds[rid]._limits = None
            del self._holds[rid]

    @property
    def in_flight(self) -> int:
        return len(self._holds)
