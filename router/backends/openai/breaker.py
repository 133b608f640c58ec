"""A circuit breaker: stop sending work to an upstream that keeps failing, and probe it later.

States::

    closed ──(failures consecutive failed calls)──► open
    open ──(cooldown_s elapsed, next acquire)──► half_open (that caller holds the only probe)
    half_open ── probe succeeds, `successes` in a row ──► closed
    half_open ── probe succeeds, fewer so far ──► half_open (the next acquire probes again at once)
    half_open ── probe fails ──► open (cool-down starts again)

`successes` is hysteresis: an upstream that flaps (up for one call, down for the next) would
otherwise be closed by its first good probe and sent full traffic, `failures` of which fail before
it opens again, on every cool-down. While it is half-open it takes one call at a time.

A *call* is one attempt against the upstream, not one logical request: a request that is retried
three times and fails three times counts three failures. Attempts are what load the upstream, and
counting them opens the breaker while a burst of retries is still hammering a dead server.

Callers take a `Permit` per call and report exactly one outcome on it: `success()` (the upstream
answered deliberately, including a 4xx that rejects our request), `failure()` (connection error,
timeout, 408/409/429/5xx, a malformed answer), or `release()` (the call ended without saying anything
about the upstream's health, e.g. the caller was cancelled). The first report wins; later ones are
ignored, so a `finally: permit.release()` is always safe.

Only the probe's outcome moves a half-open breaker; outcomes of calls admitted before the breaker
opened are ignored until it closes again. The class does no I/O and takes no locks: it is used from
one event loop, and no method awaits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from router.errors import CircuitOpenError

BreakerState = Literal["closed", "open", "half_open"]

# While the probe is in flight there is no cool-down to report; callers should come back soon.
_HALF_OPEN_RETRY_AFTER_S = 1.0


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        failures: int,
        cooldown_s: float,
        successes: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 1:
            raise ValueError("failures must be >= 1")
        if cooldown_s <= 0:
            raise ValueError("cooldown_s must be > 0")
        if successes < 1:
            raise ValueError("successes must be >= 1")
        self.name = name
        self.failures = failures
        self.cooldown_s = cooldown_s
        self.successes = successes
        self._probes_passed = 0  # good probes in a row while half-open
        self._clock = clock
        self._state: BreakerState = "closed"
        self._consecutive = 0
        self._opened_at = 0.0
        self._probe: Permit | None = None
        self._opens_total = 0
        self._rejected_total = 0

    @property
    def state(self) -> BreakerState:
        """The state as of now (an open breaker whose cool-down ended reads as half-open)."""
        if self._state == "open" and self._cooldown_left() <= 0:
            return "half_open"
        return self._state

    @property
    def consecutive_failures(self) -> int:
        return self._consecutive

    def retry_after(self) -> float:
        """Seconds until the breaker may admit a call again (0 when it admits one now)."""
        state = self.state
        if state == "open":
            return self._cooldown_left()
        if state == "half_open" and self._probe is not None:
            return min(self.cooldown_s, _HALF_OPEN_RETRY_AFTER_S)
        return 0.0

    def acquire(self) -> Permit:
        """Admit one call or raise CircuitOpenError carrying how long to wait."""
        if self._state == "closed":
            return Permit(self, probe=False)
        if self._state == "open":
            left = self._cooldown_left()
            if left > 0:
                self._rejected_total += 1
                raise CircuitOpenError(
                    f"tier {self.name}: upstream circuit open after {self._consecutive} consecutive "
                    f"failures; next probe in {left:.1f}s",
                    retry_after=left,
                )
            self._state = "half_open"
        if self._probe is not None:
            self._rejected_total += 1
            raise CircuitOpenError(
                f"tier {self.name}: upstream circuit half-open, a probe request is in flight",
                retry_after=min(self.cooldown_s, _HALF_OPEN_RETRY_AFTER_S),
            )
        self._probe = Permit(self, probe=True)
        return self._probe

    def stats(self) -> dict[str, float]:
        state = self.state
        return {
            "breaker_open": 0.0 if state == "closed" else 1.0,
            "breaker_half_open": 1.0 if state == "half_open" else 0.0,
            "consecutive_failures": float(self._consecutive),
            "breaker_opens_total": float(self._opens_total),
            "breaker_rejected_total": float(self._rejected_total),
        }

    # -- outcomes, reported through Permit -------------------------------------------------------

    def _on_success(self, permit: Permit) -> None:
        if permit.probe:
            self._probe = None
            self._probes_passed += 1
            if self._probes_passed >= self.successes:
                self._state = "closed"
                self._consecutive = 0
                self._probes_passed = 0
        elif self._state == "closed":
            self._consecutive = 0

    def _on_failure(self, permit: Permit) -> None:
        if permit.probe:
            self._probe = None
            self._consecutive += 1
            self._open()
        elif self._state == "closed":
            self._consecutive += 1
            if self._consecutive >= self.failures:
                self._open()

    def _on_release(self, permit: Permit) -> None:
        if permit.probe:
            # The probe told us nothing; let the next caller probe instead.
            self._probe = None

    def _open(self) -> None:
        self._state = "open"
        self._probes_passed = 0
        self._opened_at = self._clock()
        self._opens_total += 1

    def _cooldown_left(self) -> float:
        return max(0.0, self._opened_at + self.cooldown_s - self._clock())


class Permit:
    """One admitted call. Report its outcome once; the first report wins."""

    __slots__ = ("_breaker", "_done", "probe")

    def __init__(self, breaker: CircuitBreaker, *, probe: bool) -> None:
        self._breaker = breaker
        self.probe = probe
        self._done = False

    def success(self) -> None:
        if not self._done:
            self._done = True
            self._breaker._on_success(self)

    def failure(self) -> None:
        if not self._done:
            self._done = True
            self._breaker._on_failure(self)

    def release(self) -> None:
        if not self._done:
            self._done = True
            self._breaker._on_release(self)
