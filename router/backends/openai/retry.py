"""Deadline-aware retry policy on top of tenacity, and the `Retry-After` header.

The policy retries only what the caller's predicate calls retryable, at most `max_attempts` tries,
sleeping an exponential backoff with jitter in [backoff_initial_s, backoff_max_s] between them.
When the failed attempt carried a server's `Retry-After`, the sleep is at least that long. It never
sleeps into the deadline: when the next sleep would end at or past it, it gives up at once and
re-raises the last error, so the caller can tell the client now instead of after a useless wait.

`Retry-After` comes from the upstream, which is not trusted: `parse_retry_after` returns either
None (absent, not a number or an HTTP date, NaN) or a finite number of seconds clamped to
[0, limit]. Negative values and past dates read as 0, `inf` and `1e9` as `limit`. The caller picks
the limit: the backend uses its tier's timeout, so no value it forwards to a client can be larger,
and the policy below never sleeps past the request's deadline whatever it is given.

The `openai` backend's own loop (`router.backends.openai.failover`) uses this policy's attempt
budget and `backoff`, with the same rules (at least `Retry-After`, never into the deadline),
because it also moves a request between a tier's deployments; `retrying` is the same policy as a
tenacity controller, for a caller that retries one callable in one place.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    backoff_initial_s: float
    backoff_max_s: float

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ValueError("need 0 < backoff_initial_s <= backoff_max_s")

    def backoff(self, retry_number: int) -> float:
        """Sleep before retry number `retry_number` (1 = the first retry), jittered."""
        ceiling = min(self.backoff_max_s, self.backoff_initial_s * 2 ** (retry_number - 1))
        return random.uniform(self.backoff_initial_s, ceiling)

    def retrying(
        self,
        *,
        deadline: float,
        is_retryable: Callable[[BaseException], bool],
        retry_after: Callable[[BaseException], float | None] = lambda exc: None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> AsyncRetrying:
        """A tenacity controller for one logical request that must finish by `deadline` (clock time).

        Use it as ``async for attempt in policy.retrying(...): with attempt: ...``. It re-raises
        the last exception when it gives up (tenacity's ``reraise=True``).
        """
        plan = _Plan(self, deadline, retry_after, clock)
        return AsyncRetrying(
            stop=plan.stop,
            wait=plan.wait,
            retry=retry_if_exception(is_retryable),
            reraise=True,
            sleep=sleep,
        )


class _Plan:
    """The sleep after each failed attempt, computed once and shared by stop and wait.

    tenacity calls `wait` before `stop` in some versions and after it in others; both must agree on
    the same jittered number, so it is memoised per attempt.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        deadline: float,
        retry_after: Callable[[BaseException], float | None],
        clock: Callable[[], float],
    ) -> None:
        self._policy = policy
        self._deadline = deadline
        self._retry_after = retry_after
        self._clock = clock
        self._pauses: dict[int, float] = {}

    def pause(self, state: RetryCallState) -> float:
        n = state.attempt_number
        if n not in self._pauses:
            pause = self._policy.backoff(n)
            exc = state.outcome.exception() if state.outcome is not None else None
            if exc is not None:
                asked = self._retry_after(exc)
                if asked is not None and math.isfinite(asked):  # NaN would poison max() and the sleep
                    pause = max(pause, asked)
            self._pauses[n] = pause
        return self._pauses[n]

    def stop(self, state: RetryCallState) -> bool:
        if state.attempt_number >= self._policy.max_attempts:
            return True
        return self.pause(state) >= self._deadline - self._clock()

    def wait(self, state: RetryCallState) -> float:
        return self.pause(state)


def parse_retry_after(headers: Mapping[str, str], *, limit: float, now: datetime | None = None) -> float | None:
    """Seconds a server asked us to wait, from `retry-after-ms` or `Retry-After`, in [0, limit];
    None if absent or unreadable.

    `Retry-After` is either delta-seconds or an HTTP date (RFC 9110 10.2.3); `retry-after-ms` is
    the millisecond form some OpenAI-compatible servers send. Fractions are accepted (servers send
    them). NaN and text that is neither form are ignored; a negative value or a past date reads as
    0; anything past `limit`, `inf` included, reads as `limit`.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        ms = _number(raw_ms)
        if ms is not None:
            return _clamp(ms / 1000.0, limit)
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    seconds = _number(raw)
    if seconds is not None:
        return _clamp(seconds, limit)
    try:
        when = email.utils.parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP date is always GMT
        when = when.replace(tzinfo=UTC)
    now = now or datetime.now(UTC)
    try:
        return _clamp((when - now).total_seconds(), limit)
    except OverflowError:
        return limit


def _number(raw: str) -> float | None:
    """A header's value as a number; None for NaN and for what is not one. Only plain decimal
    notation counts: `float()` would also take `1_0`, which no server means."""
    text = raw.strip()
    if not text or "_" in text or len(text) > 64:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def _clamp(seconds: float, limit: float) -> float:
    return min(max(seconds, 0.0), max(limit, 0.0))
