"""Team, end-user and token-rate limits in one process (a SQLite ledger's `Limits`), with a fake
clock: a team's budget is shared by its keys, a user's is its own, a token window holds worst
cases until they settle, every refusal names its limit and reset, and a refusal at one level
leaves nothing at another."""

from __future__ import annotations

import calendar

import pytest

from router.admission.auth import Principal
from router.admission.limits import Limits, check_budget
from router.admission.quota import Quota
from router.errors import QuotaError, RateLimitError

T0 = float(calendar.timegm((2025, 3, 31, 23, 0, 0)))  # an hour before a day and a month end


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def member(name: str, team: Quota, **limits: float | int) -> Principal:
    return Principal(name, None, team=team.name, key_quotas=(Quota("key", name, **limits), team))  # type: ignore[arg-type]


def test_a_team_budget_is_shared_by_its_keys_and_a_user_budget_is_its_own() -> None:
    wall, mono = Clock(T0), Clock(0.0)
    lim = Limits([], clock=wall, monotonic=mono, hold_ttl_s=300)
    team = Quota("team", "lab", usd_per_day=1.0)
    a, b = member("a", team), member("b", team)
    ha = lim.admit(a, "r1", 0.4)
    lim.admit(b, "r2", 0.4)
    with pytest.raises(QuotaError) as err:
        lim.admit(a, "r3", 0.4)  # 0.8 held by the team's two keys + 0.4 > 1.0
    assert err.value.limit == "team.usd_per_day" and "team 'lab'" in str(err.value)
    assert err.value.retry_after == pytest.approx(3600.0)  # 00:00 UTC, an hour away
    lim.settle(ha, 0.1, 20, wall.t)  # settled at its cost: charged to the key and the team
    ha.release()
    assert lim.spent("a") == (pytest.approx(0.1), pytest.approx(0.1))
    assert lim.spent("team:lab") == (pytest.approx(0.1), pytest.approx(0.1))
    lim.admit(a, "r4", 0.5)  # 0.1 + 0.4 + 0.5 fits exactly

    bob = Quota("user", "bob", team="lab", requests_per_minute=1)
    other = Limits([], clock=wall, monotonic=mono, hold_ttl_s=300)
    other.admit(a, "u1", quotas=(*a.quotas, bob))
    with pytest.raises(RateLimitError) as rate:
        other.admit(b, "u2", quotas=(*b.quotas, bob))  # bob, whichever key of the team he comes through
    assert rate.value.limit == "user.requests_per_minute" and "user 'bob' of team 'lab'" in str(rate.value)
    other.admit(b, "u3", quotas=(*b.quotas, Quota("user", "eve", team="lab", requests_per_minute=1)))


def test_a_token_window_holds_worst_cases_until_they_settle() -> None:
    wall, mono = Clock(T0), Clock(0.0)
    lim = Limits([], clock=wall, monotonic=mono, hold_ttl_s=300)
    p = Principal("k", None, key_quotas=(Quota("key", "k", tokens_per_minute=1000),))
    holds = [lim.admit(p, f"r{i}", reserve_tokens=300) for i in range(3)]
    with pytest.raises(RateLimitError) as err:
        lim.admit(p, "r3", reserve_tokens=300)  # 900 + 300 > 1000
    assert err.value.kind == "tokens" and err.value.limit == "key.tokens_per_minute"
    assert err.value.retry_after == pytest.approx(60.0)
    lim.settle(holds[0], 0.0, 15, wall.t)  # its real count replaces its worst case
    holds[0].release()
    lim.admit(p, "r4", reserve_tokens=300)  # 15 + 600 + 300 fits
    with pytest.raises(RateLimitError):
        lim.admit(p, "r5", reserve_tokens=300)
    with pytest.raises(RateLimitError, match="This request alone may use up to 1001 tokens") as alone:
        lim.admit(p, "r6", reserve_tokens=1001)
    assert alone.value.retry_after is None  # no window ever holds it: waiting cannot help
    mono.t += 60.0  # the window moved past every admission
    lim.admit(p, "r7", reserve_tokens=1000)


def test_a_refusal_at_one_level_leaves_nothing_at_another() -> None:
    wall, mono = Clock(T0), Clock(0.0)
    lim = Limits([], clock=wall, monotonic=mono, hold_ttl_s=300)
    broke = Quota("team", "broke", usd_per_day=0.0)
    p = Principal("k", None, team="broke", key_quotas=(Quota("key", "k", requests_per_minute=1), broke))
    with pytest.raises(QuotaError):
        lim.admit(p, "r1", 0.01)
    q = Principal("k", None, key_quotas=(Quota("key", "k", requests_per_minute=1),))
    lim.admit(q, "r2")  # the refused request used none of the key's rate


def test_a_monthly_budget_says_when_the_month_ends() -> None:
    with pytest.raises(QuotaError) as err:
        check_budget(Quota("key", "k", usd_per_month=1.0), 0.0, 1.0, 0.0, 0.0, T0)
    assert err.value.limit == "key.usd_per_month" and err.value.retry_after == pytest.approx(3600.0)
    assert "resets on the 1st at 00:00 UTC, in 3600 s" in str(err.value)


def test_a_request_over_a_whole_budget_alone_gets_no_reset_to_wait_for() -> None:
    # its worst case is more than the budget itself: no reset makes room, so no Retry-After, and
    # it says so even while the day's budget is spent (waiting for 00:00 would not help either)
    for day_spent in (0.0, 1.0):
        with pytest.raises(QuotaError) as err:
            check_budget(Quota("key", "k", usd_per_day=1.0, usd_per_month=0.5), day_spent, 0.0, 0.0, 0.75, T0)
        assert err.value.retry_after is None and err.value.limit == "key.usd_per_month"
        assert str(err.value).startswith("This request alone may cost up to $0.750000, more than the whole $0.5")
        assert "waiting for it to reset will not help" in str(err.value)
    # exactly the budget fits alone: it is refused only while spend is in the way, with its reset
    with pytest.raises(QuotaError) as err:
        check_budget(Quota("key", "k", usd_per_day=0.75), 0.5, 0.5, 0.0, 0.75, T0)
    assert err.value.retry_after == pytest.approx(3600.0) and "may cost up to" in str(err.value)
    check_budget(Quota("key", "k", usd_per_day=0.75), 0.0, 0.0, 0.0, 0.75, T0)


def test_a_new_end_user_per_request_leaves_nothing_once_idle() -> None:
    # a client names a new `user` with every request, under a team whose default ('*') limits
    # each one: every user was a rate window, a token window and a spend kept forever (about 4 KB
    # each in a served process: 4,000 users of 512 characters grew it by 18 MB). Idle ones go.
    wall, mono = Clock(T0), Clock(0.0)
    lim = Limits([], clock=wall, monotonic=mono, hold_ttl_s=300)
    team = Quota("team", "lab")
    key = member("k", team)
    users = 5000

    def one(i: int, usd: float) -> None:
        user = Quota("user", f"u{i}", team="lab", usd_per_month=1.0, requests_per_minute=5, tokens_per_minute=100)
        hold = lim.admit(key, f"r{i}", 0.01, quotas=(*key.quotas, user), reserve_tokens=10)
        lim.settle(hold, usd, 5, wall.t)
        hold.release()

    for i in range(users):  # half of them spend something this month
        one(i, 0.001 if i % 2 else 0.0)
    mono.t += 61.0  # every window idle
    for i in range(users, 2 * users):
        one(i, 0.0)
    # without a sweep each would hold 10,000 subjects; idle ones go, so at most twice the live ones
    assert max(len(lim.rate._seen), len(lim.tokens._seen)) < 1.5 * users
    assert len(lim._spend) < 1.5 * users
    assert lim.spent("user:lab:u1") == (pytest.approx(0.001), pytest.approx(0.001))  # kept: it spent
    wall.t += 2 * 3600.0  # into April: last month's spend is nothing now
    mono.t += 61.0
    for i in range(2 * users, 3 * users):
        one(i, 0.0)
    assert len(lim._spend) < 1.5 * users and lim.spent("user:lab:u1") == (0.0, 0.0)
    with pytest.raises(RateLimitError):  # a live window still counts
        for _ in range(6):
            one(3 * users, 0.0)
