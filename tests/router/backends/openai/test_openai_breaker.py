"""The circuit breaker on its own, with an injected clock: no sleeping, no network."""

from __future__ import annotations

import pytest

from router.backends.openai.breaker import CircuitBreaker
from router.errors import CircuitOpenError


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make(failures: int = 3, cooldown_s: float = 10.0) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker("large", failures=failures, cooldown_s=cooldown_s, clock=clock), clock


def fail(breaker: CircuitBreaker, times: int = 1) -> None:
    for _ in range(times):
        breaker.acquire().failure()


def test_opens_after_consecutive_failures_only() -> None:
    breaker, _ = make(failures=3)
    fail(breaker, 2)
    breaker.acquire().success()  # a success in between resets the count
    fail(breaker, 2)
    assert breaker.state == "closed"
    assert breaker.consecutive_failures == 2
    fail(breaker)
    assert breaker.state == "open"
    assert breaker.stats()["breaker_open"] == 1.0
    assert breaker.stats()["consecutive_failures"] == 3.0


def test_open_rejects_with_the_remaining_cooldown() -> None:
    breaker, clock = make(failures=1, cooldown_s=10.0)
    fail(breaker)
    clock.advance(4.0)
    with pytest.raises(CircuitOpenError) as info:
        breaker.acquire()
    assert info.value.retry_after == pytest.approx(6.0)
    assert breaker.retry_after() == pytest.approx(6.0)
    assert breaker.stats()["breaker_rejected_total"] == 1.0


def test_half_open_admits_exactly_one_probe_and_success_closes() -> None:
    breaker, clock = make(failures=2, cooldown_s=10.0)
    fail(breaker, 2)
    clock.advance(10.0)
    assert breaker.state == "half_open"
    probe = breaker.acquire()
    assert probe.probe
    with pytest.raises(CircuitOpenError) as info:
        breaker.acquire()  # a second caller while the probe is in flight
    assert 0 < info.value.retry_after <= 10.0
    probe.success()
    assert breaker.state == "closed"
    assert breaker.consecutive_failures == 0
    assert not breaker.acquire().probe


def test_failed_probe_reopens_for_a_full_cooldown() -> None:
    breaker, clock = make(failures=2, cooldown_s=10.0)
    fail(breaker, 2)
    clock.advance(11.0)
    breaker.acquire().failure()
    assert breaker.state == "open"
    assert breaker.retry_after() == pytest.approx(10.0)
    assert breaker.stats()["breaker_opens_total"] == 2.0
    clock.advance(9.9)
    with pytest.raises(CircuitOpenError):
        breaker.acquire()
    clock.advance(0.1)
    breaker.acquire().success()
    assert breaker.state == "closed"


def test_released_probe_lets_the_next_caller_probe() -> None:
    breaker, clock = make(failures=1, cooldown_s=5.0)
    fail(breaker)
    clock.advance(5.0)
    breaker.acquire().release()  # e.g. the probing request was cancelled
    assert breaker.state == "half_open"
    probe = breaker.acquire()
    assert probe.probe
    probe.success()
    assert breaker.state == "closed"


def test_first_report_wins_and_late_calls_do_not_move_an_open_breaker() -> None:
    breaker, clock = make(failures=2, cooldown_s=5.0)
    early = breaker.acquire()  # admitted while closed, answers after the breaker opened
    fail(breaker, 2)
    early.success()
    assert breaker.state == "open"
    permit = breaker.acquire() if breaker.state != "open" else None
    assert permit is None
    clock.advance(5.0)
    probe = breaker.acquire()
    probe.failure()
    probe.success()  # ignored: the first report wins
    assert breaker.state == "open"


def test_half_open_closes_only_after_good_probes_in_a_row() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("large", failures=1, cooldown_s=10.0, successes=3, clock=clock)
    fail(breaker)
    clock.advance(10.0)
    for _ in range(2):  # good, good: still half-open, one call at a time, the next one admitted at once
        probe = breaker.acquire()
        with pytest.raises(CircuitOpenError):
            breaker.acquire()
        probe.success()
        assert breaker.state == "half_open" and breaker.retry_after() == 0.0
    breaker.acquire().failure()  # a bad one: open again, and the count starts over
    assert breaker.state == "open"
    clock.advance(10.0)
    for _ in range(2):
        breaker.acquire().success()
    assert breaker.state == "half_open"
    breaker.acquire().success()
    assert breaker.state == "closed"
    breaker.acquire()  # and closed admits anyone
    breaker.acquire()


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        CircuitBreaker("x", failures=0, cooldown_s=1)
    with pytest.raises(ValueError):
        CircuitBreaker("x", failures=1, cooldown_s=0)
    with pytest.raises(ValueError):
        CircuitBreaker("x", failures=1, cooldown_s=1, successes=0)
