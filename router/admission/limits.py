"""Admission, decided before any generation: USD budgets, request rates and token rates, at each
level a request falls under (its key, its key's team, and that team's end user: `Quota`).

A request is admitted only if it fits every level; each level keeps its counters under its
`Quota.subject`, and a refusal at one level leaves no trace at the others. Token rates
(`tokens_per_minute`) count a request at its worst case from admission (like the dollar
reservation) and at its real count once it settles, in a 60 s window.

Budgets (`usd_per_day`, `usd_per_month`, UTC calendar periods) compare what the key has spent,
as the ledger recorded it, plus a reservation for each of its requests in flight, plus the new
request's own reservation, with the limit; a request that does not fit gets 429
`insufficient_quota`. A reservation is the most the request can cost (the caller works it out from
the planned tiers' prices and limits), so it holds from the first request after a restart and
under any burst: a key's spend exceeds its budget only by what a request can cost beyond its
reservation. When the request settles its reservation is released and its actual cost charged.

The rate limit (`requests_per_minute`) is a sliding window: at most N admissions in any 60 s,
and a refused request learns from `Retry-After` when the oldest one leaves the window. A request
refused for budget does not use up the rate.

With a SQLite ledger, state lives in memory, seeded from the ledger at start-up: one process
enforces the limits. With a PostgreSQL ledger every replica decides through the database
(`SharedLimits`): an admission is one transaction that locks the key's row, reads its settled
spend, its live reservations and its requests in the last 60 s (on the database's clock, so every
replica sees one window), and, if the request fits, writes its reservation (a `pending` row with
an expiry) and its rate event. Settling replaces the reservation with the cost in one transaction.
So across any number of replicas a key overshoots a budget only by what its requests cost beyond
their reservations (only the work of a plugin verifier that does not say what it may cost:
`router.admission.accounting.unreserved_verifiers`), the same bound as one process; a reservation whose
replica died stops counting at its expiry (every tier's timeout, and verification deadline where
it has verifiers, plus 60 s). A replica that cannot reach the database refuses new work of a limited key with 503: it
never serves unlimited. The same budget rule (`check_budget`) and rate rule (`check_rate`) decide
in both modes.
"""

from __future__ import annotations

import asyncio
import calendar
import functools
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from router.admission.auth import Principal
from router.admission.quota import Quota
from router.config import ApiKeyEntry
from router.errors import QuotaError, RateLimitError, UnavailableError

log = logging.getLogger(__name__)

WINDOW_S = 60.0
# subjects kept before the next sweep drops the idle ones (an empty window, a spend of nothing this
# month): a client names a new end user with every request (`user`), and each is a subject
SWEEP_AT = 1024
# a prune round deletes up to this many rows a table per batch, batch after batch while a batch
# comes back full, for at most PRUNE_ROUND_S (SharedLimits._prune_round)
PRUNE_BATCH = 5000
PRUNE_ROUND_S = 5.0


def day_start(ts: float) -> float:
    """Unix time of 00:00 UTC on the day holding `ts`."""
    y, m, d = time.gmtime(ts)[:3]
    return float(calendar.timegm((y, m, d, 0, 0, 0)))


def month_start(ts: float) -> float:
    """Unix time of 00:00 UTC on the first of the month holding `ts`."""
    y, m = time.gmtime(ts)[:2]
    return float(calendar.timegm((y, m, 1, 0, 0, 0)))


def _quota(q: Quota | ApiKeyEntry) -> Quota:
    return q if isinstance(q, Quota) else Quota.of_key(q)


def check_budget(
    quota: Quota | ApiKeyEntry,
    day_usd: float,
    month_usd: float,
    pending: float,
    reserve_usd: float,
    now: float | None = None,
) -> None:
    """QuotaError when the settled spend (today, this month) plus what is held in flight plus
    this request's reservation passes a budget; it names the budget and when it resets."""
    q = _quota(quota)
    at = time.time() if now is None else now
    y, m = time.gmtime(at)[:2]
    next_month = calendar.timegm((y + m // 12, m % 12 + 1, 1, 0, 0, 0))
    periods = (
        ("daily", "usd_per_day", day_usd, q.usd_per_day, "at 00:00 UTC", day_start(at) + 86400.0),
        ("monthly", "usd_per_month", month_usd, q.usd_per_month, "on the 1st at 00:00 UTC", float(next_month)),
    )
    # a request whose worst case alone passes a budget is refused without a Retry-After: no reset
    # makes room for it, so a client told to wait would wait for a day and be refused again
    for period, field_name, _, limit, _, _ in periods:
        if limit is not None and reserve_usd > limit:
            raise QuotaError(
                f"This request alone may cost up to ${reserve_usd:.6f}, more than the whole ${limit:g} "
                f"{period} budget of {q.label} ({q.level}.{field_name}): waiting for it to reset will not "
                f"help; ask for a smaller max_tokens, or one named tier.",
                retry_after=None,
                limit=f"{q.level}.{field_name}",
            )
    for period, field_name, spent, limit, resets, reset_at in periods:
        if limit is not None and (spent >= limit or spent + pending + reserve_usd > limit):
            wait = max(1.0, reset_at - at)
            raise QuotaError(
                f"You exceeded your current quota: {q.label} has used ${spent:.6f} "
                f"(+${pending:.6f} reserved in flight) of its ${limit:g} {period} budget "
                f"({q.level}.{field_name}), and this request may cost up to ${reserve_usd:.6f} "
                f"(a smaller max_tokens, or one named tier, reserves less); it resets {resets}, "
                f"in {math.ceil(wait)} s.",
                retry_after=wait,
                limit=f"{q.level}.{field_name}",
            )


def check_rate(quota: Quota | ApiKeyEntry, recent: int, oldest_age_s: float | None) -> None:
    """RateLimitError when `recent` admissions in the last minute (the oldest `oldest_age_s` ago)
    leave no room for one more."""
    q = _quota(quota)
    per_minute = q.requests_per_minute
    if per_minute is not None and recent >= per_minute:
        retry_after = max(0.0, WINDOW_S - (oldest_age_s or 0.0))
        raise RateLimitError(
            f"Rate limit reached for {q.label}: {per_minute} requests per minute "
            f"({q.level}.requests_per_minute). Retry in {math.ceil(retry_after)} s.",
            retry_after=retry_after,
            kind="requests",
            limit=f"{q.level}.requests_per_minute",
        )


def check_tokens(quota: Quota, used: int, reserve_tokens: int, oldest_age_s: float | None) -> None:
    """RateLimitError when the tokens admitted in the last minute (each request at its worst
    case until it settles, then at its real count) plus this request's worst case pass the
    token rate."""
    per_minute = quota.tokens_per_minute
    if per_minute is None or used + reserve_tokens <= per_minute:
        return
    limit = f"{quota.level}.tokens_per_minute"
    if reserve_tokens > per_minute:  # no Retry-After: no window ever holds it
        raise RateLimitError(
            f"This request alone may use up to {reserve_tokens} tokens (input + output), more than the "
            f"{per_minute} tokens per minute of {quota.label} ({limit}): waiting will not help; ask for a "
            f"smaller max_tokens, or one named tier.",
            retry_after=None,
            kind="tokens",
            limit=limit,
        )
    retry_after = max(0.0, WINDOW_S - (oldest_age_s or 0.0))
    raise RateLimitError(
        f"Rate limit reached for {quota.label}: {per_minute} tokens per minute ({limit}); {used} used "
        f"in the last minute and this request may use up to {reserve_tokens}. Retry in {math.ceil(retry_after)} s.",
        retry_after=retry_after,
        kind="tokens",
        limit=limit,
    )


class RateLimiter:
    """Sliding-window log per subject: exact, and O(1) amortised per request."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._seen: dict[str, deque[float]] = {}
        self._sweep_at = SWEEP_AT

    def _window(self, subject: str) -> deque[float]:
        now = self.clock()
        seen = self._seen.setdefault(subject, deque())
        while seen and seen[0] <= now - WINDOW_S:
            seen.popleft()
        return seen

    def _sweep(self) -> None:
        # amortised O(1): the next sweep waits until the subjects kept have doubled
        if len(self._seen) < self._sweep_at:
            return
        for subject in [s for s in self._seen if not self._window(s)]:
            del self._seen[subject]
        self._sweep_at = max(SWEEP_AT, 2 * len(self._seen))

    def check(self, quota: Quota) -> None:
        seen = self._window(quota.subject)
        check_rate(quota, len(seen), self.clock() - seen[0] if seen else None)

    def add(self, subject: str) -> None:
        self._sweep()
        self._window(subject).append(self.clock())

    def acquire(self, key_id: str, per_minute: int) -> None:
        quota = Quota("key", key_id, requests_per_minute=per_minute)
        self.check(quota)
        self.add(key_id)


class TokenWindow:
    """Tokens admitted per subject in the last minute: each request at its worst case from
    admission, then at its real count once it settles (`settle`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._seen: dict[str, deque[list[float]]] = {}  # [admitted at, tokens]
        self._of: dict[str, list[list[float]]] = {}  # a request's entries, until it settles or ends
        self._sweep_at = SWEEP_AT

    def _window(self, subject: str) -> deque[list[float]]:
        now = self.clock()
        seen = self._seen.setdefault(subject, deque())
        while seen and seen[0][0] <= now - WINDOW_S:
            seen.popleft()
        return seen

    def _sweep(self) -> None:
        if len(self._seen) < self._sweep_at:
            return
        for subject in [s for s in self._seen if not self._window(s)]:
            del self._seen[subject]
        self._sweep_at = max(SWEEP_AT, 2 * len(self._seen))

    def check(self, quota: Quota, reserve_tokens: int) -> None:
        seen = self._window(quota.subject)
        used = int(sum(e[1] for e in seen))
        check_tokens(quota, used, reserve_tokens, self.clock() - seen[0][0] if seen else None)

    def add(self, subject: str, request_id: str, tokens: int) -> None:
        self._sweep()
        item = [self.clock(), float(tokens)]
        self._window(subject).append(item)
        self._of.setdefault(request_id, []).append(item)

    def settle(self, request_id: str, tokens: int) -> None:
        for item in self._of.pop(request_id, ()):
            item[1] = float(tokens)

    def forget(self, request_id: str) -> None:
        """The request ended unsettled: its entries keep their worst case until they leave the window."""
        self._of.pop(request_id, None)


@dataclass
class _Spend:
    day: float = 0.0  # the UTC day start these totals belong to
    month: float = 0.0
    day_usd: float = 0.0
    month_usd: float = 0.0

    def roll(self, now: float) -> None:
        d, m = day_start(now), month_start(now)
        if d != self.day:
            self.day, self.day_usd = d, 0.0
        if m != self.month:
            self.month, self.month_usd = m, 0.0


@dataclass
class Hold:
    """An admitted request: its reservation counts against the key until released. Releasing
    is idempotent, and every release (and expiry) goes through `Limits._drop`."""

    request_id: str
    key_id: str
    reserved_usd: float
    started: float  # monotonic
    expires: float  # monotonic; a hold still open then is charged its reservation (see _expire)
    _limits: Limits | None = field(default=None, repr=False)
    charged_usd: float = 0.0  # what its expiry charged; the settled cost replaces it
    subjects: tuple[str, ...] = ()  # every quota it counts against (the key's first), see Quota.subject

    def release(self) -> None:
        if self._limits is not None:
            self._limits._drop(self)


class Limits:
    """Admission for every key in the config. Runs on the event loop thread only."""

    def __init__(
        self,
        keys: Iterable[ApiKeyEntry],
        *,
        hold_ttl_s: float = 600.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_change: Callable[[int], None] | None = None,
        shared: bool = False,
    ) -> None:
        self.keys = {k.name: k for k in keys}
        # shared: budgets and rates are decided by `SharedLimits` through the database; this object
        # keeps only the process's holds (the in-flight gauge, release bookkeeping)
        self.shared = shared
        self.hold_ttl_s = hold_ttl_s
        self.clock = clock
        self.monotonic = monotonic
        self.rate = RateLimiter(monotonic)
        self.tokens = TokenWindow(monotonic)
        self.on_change = on_change  # told the number of holds whenever it changes (the in-flight gauge)
        self._spend: dict[str, _Spend] = {}
        # in admission order, which with one TTL is expiry order: expiring looks at the front only
        self._holds: dict[str, Hold] = {}
        self._reserved: dict[str, float] = {}  # per key, the sum of its holds' reservations
        self._held: dict[str, int] = {}  # per key, how many holds
        self._sweep_at = SWEEP_AT  # see _sweep

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
        """USD reserved by the key's requests in flight."""
        self._expire()
        return self._reserved.get(key_id, 0.0)

    def admit(
        self,
        principal: Principal,
        request_id: str,
        reserve_usd: float = 0.0,
        *,
        quotas: Sequence[Quota] | None = None,
        reserve_tokens: int = 0,
        budget: bool = True,
    ) -> Hold:
        """Raise QuotaError or RateLimitError, or return a hold, reserving `reserve_usd` (the most
        the request can cost) against every quota it falls under (`quotas`: the principal's own,
        its key's and team's, unless given) until it is released; a token-limited quota also
        counts `reserve_tokens` in its token window until the request settles. Without `budget` (a
        cache hit, which costs nothing) only the rate limits decide."""
        found = tuple(principal.quotas if quotas is None else quotas)
        now = self.monotonic()
        self._expire()
        self._sweep()
        if not self.shared:
            # every quota is checked before any counts the request: a refusal leaves no trace
            for q in found:
                if budget and q.has_budget:
                    self._check_budget(q, reserve_usd)
                if q.requests_per_minute is not None:
                    self.rate.check(q)
                if q.tokens_per_minute is not None:
                    self.tokens.check(q, reserve_tokens)
            for q in found:
                if q.requests_per_minute is not None:
                    self.rate.add(q.subject)
                if q.tokens_per_minute is not None:
                    self.tokens.add(q.subject, request_id, reserve_tokens)
        if request_id in self._holds:
            raise ValueError(f"request {request_id} is already admitted")
        key = principal.key_id
        subjects = tuple(dict.fromkeys([key, *(q.subject for q in found)]))
        hold = Hold(request_id, key, reserve_usd, now, now + self.hold_ttl_s, self, subjects=subjects)
        self._holds[request_id] = hold
        for subject in subjects:
            self._reserved[subject] = self._reserved.get(subject, 0.0) + reserve_usd
            self._held[subject] = self._held.get(subject, 0) + 1
        self._changed()
        return hold

    def check_rates(self, quotas: Sequence[Quota]) -> None:
        """RateLimitError when a rate is spent even for a request that costs no tokens (a cache
        hit): checked, never counted. Under shared limits the database decides (`RateRefusals`)."""
        if self.shared:
            return
        for q in quotas:
            if q.requests_per_minute is not None:
                self.rate.check(q)
            if q.tokens_per_minute is not None:
                self.tokens.check(q, 0)

    def count_call(self, quotas: Sequence[Quota]) -> None:
        """Admit a call that generates and holds nothing (a label) by the request rates alone:
        RateLimitError, or it counts in the window of every quota with a request rate, as a
        request does. Under shared limits the database decides (`SharedLimits.admit`)."""
        if self.shared:
            return
        limited = [q for q in quotas if q.requests_per_minute is not None]
        for q in limited:  # every quota checked before any counts the call: a refusal leaves no trace
            self.rate.check(q)
        for q in limited:
            self.rate.add(q.subject)

    def hold(self, request_id: str) -> Hold | None:
        return self._holds.get(request_id)

    def charge(self, key_id: str, usd: float, ts: float) -> None:
        """Add a settled request's cost to one subject's spend (a key's name, or `Quota.subject`)."""
        s = self._spend_of(key_id, self.clock())
        if day_start(ts) == s.day:
            s.day_usd += usd
        if month_start(ts) == s.month:
            s.month_usd += usd

    def settle(self, hold: Hold, usd: float, tokens: int, ts: float) -> None:
        """A request settled: its cost is charged to every quota it counted against, and its
        token windows hold its real count instead of its worst case."""
        for subject in hold.subjects or (hold.key_id,):
            self.charge(subject, usd, ts)
        self.tokens.settle(hold.request_id, tokens)

    def _check_budget(self, quota: Quota | ApiKeyEntry, reserve_usd: float) -> None:
        q = _quota(quota)
        if not q.has_budget:
            return
        day_usd, month_usd = self.spent(q.subject)
        check_budget(q, day_usd, month_usd, self._reserved.get(q.subject, 0.0), reserve_usd, self.clock())

    def _sweep(self) -> None:
        """Drop the spend of subjects that spent nothing this month and hold nothing (an end user
        seen last month, or never charged): `spent` reads zero for them as before."""
        if len(self._spend) < self._sweep_at:
            return
        now = self.clock()
        for subject in [k for k in self._spend if k not in self._held]:
            s = self._spend_of(subject, now)
            if s.day_usd == 0.0 and s.month_usd == 0.0:
                del self._spend[subject]
        self._sweep_at = max(SWEEP_AT, 2 * len(self._spend))

    def _spend_of(self, key_id: str, now: float) -> _Spend:
        s = self._spend.get(key_id)
        if s is None:
            s = self._spend[key_id] = _Spend(day=day_start(now), month=month_start(now))
        s.roll(now)
        return s

    def _drop(self, hold: Hold) -> None:
        hold._limits = None
        if self._holds.get(hold.request_id) is not hold:
            return
        del self._holds[hold.request_id]
        self.tokens.forget(hold.request_id)
        for key in hold.subjects or (hold.key_id,):
            self._held[key] -= 1
            if self._held[key]:
                self._reserved[key] -= hold.reserved_usd
            else:  # exactly zero once nothing is held, whatever the float rounding on the way
                del self._held[key]
                del self._reserved[key]
        self._changed()

    def _expire(self) -> None:
        now = self.monotonic()
        while self._holds:
            hold = next(iter(self._holds.values()))
            if hold.expires > now:
                return
            # still running (a stalled stream, a slow verifier) or forgotten: either way it may have
            # spent up to its reservation, so that is charged now; its record, if it ever settles,
            # replaces the charge with the actual cost (Accounting.record)
            log.warning(
                "request %s held its budget reservation past %.0f s; charging the reservation",
                hold.request_id,
                self.hold_ttl_s,
            )
            for subject in hold.subjects or (hold.key_id,):
                self.charge(subject, hold.reserved_usd, self.clock())
            hold.charged_usd = hold.reserved_usd
            self._drop(hold)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(len(self._holds))

    @property
    def in_flight(self) -> int:
        return len(self._holds)


@dataclass(frozen=True)
class KeyWindow:
    """What the shared store knows of one quota's subject at admission, read under its lock."""

    day_usd: float  # settled cost today (UTC)
    month_usd: float  # settled cost this month
    reserved_usd: float  # live reservations (unsettled, unexpired), from every replica
    recent: int  # admissions in the last WINDOW_S seconds, every replica's
    oldest_age_s: float | None  # how long ago the oldest of those was
    tokens: int = 0  # tokens admitted in the last WINDOW_S seconds (worst case until settled)
    tokens_oldest_age_s: float | None = None


@dataclass(frozen=True)
class Reservation:
    """A request to admit: its pending row's fields and how long its reservation may live."""

    request_id: str
    ts: float
    key_id: str
    model: str
    reserved_usd: float
    ttl_s: float
    team: str | None = None
    user: str | None = None
    reserved_tokens: int = 0
    holds: bool = True  # False: a call that holds nothing (a label): its rate events, and no pending row


class RateRefusals:
    """The request-rate refusals a replica last heard from the shared store, per subject, until
    their `Retry-After`. A rate window only drains with time, so until then that subject would be
    refused again: a request can be turned away before any work that needs no admission first
    (a cache lookup), without asking the database. The first refusal of a window is the
    database's own."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._until: dict[str, float] = {}

    def heard(self, quotas: Sequence[Quota], refused: RateLimitError) -> None:
        if refused.kind != "requests" or refused.limit is None or refused.retry_after is None:
            return  # a token rate refuses by the request's size, which a hit does not have
        now = self.clock()
        if len(self._until) >= SWEEP_AT:
            self._until = {s: t for s, t in self._until.items() if t > now}
        level = refused.limit.split(".", 1)[0]
        for q in quotas:
            if q.level == level:
                self._until[q.subject] = now + refused.retry_after

    def check(self, quotas: Sequence[Quota]) -> None:
        now = self.clock()
        for q in quotas:
            until = self._until.get(q.subject)
            if until is not None and until > now and q.requests_per_minute is not None:
                check_rate(q, q.requests_per_minute, WINDOW_S - (until - now))  # the same 429, its wait left


@runtime_checkable
class SharedCounter(Protocol):
    """A store that admits requests for all replicas at once (the PostgreSQL ledger). Both
    methods block; `SharedLimits` calls them off the event loop."""

    def admit(
        self,
        reservation: Reservation,
        quotas: Sequence[Quota],
        day_start: float,
        month_start: float,
        decide: Callable[[Quota, KeyWindow], None],
    ) -> None:
        """In one transaction holding every quota's lock (in one order, so two admissions never
        wait on each other): read each window, call `decide` (which raises to refuse), then write
        the reservation (unless it `holds` nothing) and, for a quota with a request or token
        rate, its events."""

    def drop(self, request_id: str) -> None:
        """Release an unsettled reservation (the request ended without a record)."""

    def prune(self, keep_day: float, keep_month: float, batch: int = PRUNE_BATCH) -> dict[str, int]:
        """Delete the counters no admission reads again (events past the window, spend of days
        before `keep_day` and months before `keep_month`, idle end users' rows), at most `batch`
        rows a table, safely beside admissions on every replica; what was deleted, per table."""


class SharedLimits:
    """Budgets and rate limits decided through a store every replica shares."""

    def __init__(
        self, counter: SharedCounter, keys: Iterable[ApiKeyEntry] = (), *, hold_ttl_s: float, workers: int
    ) -> None:
        self.counter = counter
        self.keys = {k.name: k for k in keys}
        self.hold_ttl_s = hold_ttl_s
        # admissions wait on the database's row lock, not on the ledger's writer thread
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tierroute-limits")

    def limited(self, found: ApiKeyEntry | Sequence[Quota] | None) -> bool:
        if found is None:
            return False
        quotas = [Quota.of_key(found)] if isinstance(found, ApiKeyEntry) else found
        return any(q.limited for q in quotas)

    async def admit(
        self, found: ApiKeyEntry | Sequence[Quota], reservation: Reservation, now: float, *, budget: bool = True
    ) -> None:
        """Raise QuotaError, RateLimitError, or UnavailableError (the database is unreachable:
        the request is refused rather than served unlimited); return once the reservation is
        committed. Without `budget` (a cache hit) only the rate limits decide."""
        quotas = [Quota.of_key(found)] if isinstance(found, ApiKeyEntry) else [q for q in found if q.limited]

        def decide(q: Quota, w: KeyWindow) -> None:
            if budget and q.has_budget:
                check_budget(q, w.day_usd, w.month_usd, w.reserved_usd, reservation.reserved_usd, now)
            check_rate(q, w.recent, w.oldest_age_s)
            check_tokens(q, w.tokens, reservation.reserved_tokens, w.tokens_oldest_age_s)

        loop = asyncio.get_running_loop()
        call = functools.partial(self.counter.admit, reservation, quotas, day_start(now), month_start(now), decide)
        try:
            await loop.run_in_executor(self._pool, call)
        except (QuotaError, RateLimitError):
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the database said, the key cannot be checked
            log.error("shared limits: cannot admit %s: %s", reservation.request_id, exc)
            raise UnavailableError(
                "The budget and rate-limit store cannot be reached; try again.", retry_after=5.0
            ) from None

    async def pruning(self, every_s: float) -> None:
        """Forever, every `every_s` (jittered, so replicas started together do not all try at
        once; one prunes at a time anyway): drop the counters no admission reads again. An end
        user is a subject of its own, and a client can name a new one with every request: without
        this, each would keep its rows for good (with one process, `Limits._sweep` does this in
        memory). Yesterday's and last month's spend rows are kept for requests settling late."""
        while True:
            await asyncio.sleep(every_s * random.uniform(0.5, 1.5))
            await self._prune_round()

    async def _prune_round(self, batch: int = PRUNE_BATCH, round_s: float = PRUNE_ROUND_S) -> None:
        """Prune in batches until a batch leaves every table with less than a batch to delete, or
        `round_s` has passed: one batch a round was a fixed rate (5,000 rows a minute), which a
        client naming a new `user` on every request outruns."""
        loop = asyncio.get_running_loop()
        until = time.monotonic() + round_s
        total: dict[str, int] = {}
        while True:
            now = time.time()
            call = functools.partial(
                self.counter.prune, day_start(now - 86400.0), month_start(now - 86400.0), batch=batch
            )
            try:
                done = await loop.run_in_executor(self._pool, call)
            except Exception as exc:  # noqa: BLE001 - the next round tries again; nothing depends on it
                log.warning("shared limits: pruning idle counters failed (the next round retries): %s", exc)
                break
            for table, n in done.items():
                total[table] = total.get(table, 0) + n
            if max(done.values(), default=0) < batch or time.monotonic() >= until:
                break
        if any(total.values()):
            log.info("shared limits: pruned %s", ", ".join(f"{n} {t}" for t, n in total.items() if n))

    def drop(self, request_id: str) -> None:
        """Release in the background; a release that fails leaves the reservation to expire."""
        future = self._pool.submit(self.counter.drop, request_id)
        future.add_done_callback(_log_failed_drop)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _log_failed_drop(future: Future[None]) -> None:
    exc = future.exception()
    if exc is not None:
        log.warning("shared limits: a reservation was not released (it expires instead): %s", exc)
