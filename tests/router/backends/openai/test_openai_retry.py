"""The retry policy and Retry-After parsing on their own: fake clock and sleep, no network."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from router.backends.openai.retry import RetryPolicy, parse_retry_after


class Flaky(Exception):
    def __init__(self, retry_after: float | None = None) -> None:
        super().__init__("flaky")
        self.retry_after = retry_after


class Clock:
    """Time that moves only when the policy sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def run(
    policy: RetryPolicy, clock: Clock, outcomes: list[BaseException | str], *, deadline: float = 100.0
) -> tuple[str, int]:
    calls = 0
    async for attempt in policy.retrying(
        deadline=deadline,
        is_retryable=lambda e: isinstance(e, Flaky),
        retry_after=lambda e: e.retry_after if isinstance(e, Flaky) else None,
        clock=clock,
        sleep=clock.sleep,
    ):
        with attempt:
            outcome = outcomes[calls]
            calls += 1
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome, calls
    raise AssertionError("unreachable")


async def test_backoff_grows_with_jitter_within_bounds() -> None:
    policy = RetryPolicy(max_attempts=6, backoff_initial_s=0.5, backoff_max_s=3.0)
    clock = Clock()
    result = await run(policy, clock, [Flaky()] * 5 + ["done"])
    assert result == ("done", 6)
    assert len(clock.sleeps) == 5
    assert all(0.5 <= s <= 3.0 for s in clock.sleeps)
    ceilings = [0.5, 1.0, 2.0, 3.0, 3.0]
    assert all(s <= c for s, c in zip(clock.sleeps, ceilings, strict=True))


async def test_stops_after_max_attempts_and_reraises_the_last_error() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_initial_s=0.1, backoff_max_s=0.1)
    clock = Clock()
    last = Flaky()
    with pytest.raises(Flaky) as info:
        await run(policy, clock, [Flaky(), Flaky(), last, "never"])
    assert info.value is last
    assert len(clock.sleeps) == 2


async def test_non_retryable_error_is_raised_at_once() -> None:
    policy = RetryPolicy(max_attempts=5, backoff_initial_s=0.1, backoff_max_s=0.1)
    clock = Clock()
    with pytest.raises(KeyError):
        await run(policy, clock, [KeyError("x"), "never"])
    assert clock.sleeps == []


async def test_retry_after_sets_a_floor_on_the_sleep() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_initial_s=0.1, backoff_max_s=0.2)
    clock = Clock()
    assert await run(policy, clock, [Flaky(retry_after=7.0), "ok"]) == ("ok", 2)
    assert clock.sleeps == [7.0]


async def test_gives_up_at_once_when_retry_after_passes_the_deadline() -> None:
    policy = RetryPolicy(max_attempts=5, backoff_initial_s=0.1, backoff_max_s=0.2)
    clock = Clock()
    with pytest.raises(Flaky):
        await run(policy, clock, [Flaky(retry_after=30.0), "never"], deadline=10.0)
    assert clock.sleeps == []


async def test_never_sleeps_into_the_deadline() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_initial_s=1.0, backoff_max_s=1.0)
    clock = Clock()
    with pytest.raises(Flaky):
        await run(policy, clock, [Flaky()] * 10, deadline=3.5)
    assert clock.sleeps == [1.0, 1.0, 1.0]
    assert clock.now <= 3.5


def test_parse_retry_after_forms() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after({"Retry-After": "3"}, limit=60) == 3.0
    assert parse_retry_after({"retry-after": " 1.5 "}, limit=60) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "Retry-After": "9"}, limit=60) == 0.25
    date = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after({"Retry-After": date}, limit=60, now=now) == 30.0
    assert parse_retry_after({}, limit=60) is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "-4"}, 0.0),
        ({"Retry-After": "-inf"}, 0.0),
        ({"Retry-After": "inf"}, 60.0),
        ({"Retry-After": "Infinity"}, 60.0),
        ({"Retry-After": "1e9"}, 60.0),
        ({"Retry-After": "9" * 400}, None),  # longer than any real header value: not read at all
        ({"Retry-After": "nan"}, None),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": ""}, None),
        ({"Retry-After": "1_000"}, None),
        ({"retry-after-ms": "nan", "Retry-After": "2"}, 2.0),  # a bad ms form falls back to the other
        ({"retry-after-ms": "-5"}, 0.0),
        ({"retry-after-ms": "1e12"}, 60.0),
        ({"Retry-After": format_datetime(datetime(2025, 1, 1, 11, 0, tzinfo=UTC), usegmt=True)}, 0.0),
        ({"Retry-After": format_datetime(datetime(2026, 1, 1, 12, 0, tzinfo=UTC), usegmt=True)}, 60.0),
        ({"Retry-After": "Wed, 01 Jan 2025 12:00:10"}, 10.0),  # no zone: GMT, as HTTP dates are
        ({"Retry-After": "Mon, 99 Foo 2025 99:99:99 GMT"}, None),
    ],
    ids=[
        "negative",
        "-inf",
        "inf",
        "Infinity",
        "1e9",
        "400-digits",
        "nan",
        "word",
        "empty",
        "underscore",
        "bad-ms",
        "negative-ms",
        "huge-ms",
        "past-date",
        "future-date",
        "date-no-zone",
        "bad-date",
    ],
)
def test_hostile_retry_after_is_clamped_to_the_limit_or_ignored(
    headers: dict[str, str], expected: float | None
) -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after(headers, limit=60.0, now=now) == expected


async def test_nan_retry_after_does_not_poison_the_sleep() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_initial_s=0.1, backoff_max_s=0.2)
    clock = Clock()
    assert await run(policy, clock, [Flaky(retry_after=float("nan")), "ok"]) == ("ok", 2)
    assert len(clock.sleeps) == 1 and 0.1 <= clock.sleeps[0] <= 0.2


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0, backoff_initial_s=0.1, backoff_max_s=1)
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=1, backoff_initial_s=2, backoff_max_s=1)
