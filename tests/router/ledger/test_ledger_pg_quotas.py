"""Team and end-user limits, and token rates, decided through one PostgreSQL for several
replicas (`SharedLimits` over separate `PostgresStore`s, as three processes would hold them).

What must hold: a team's budget is one budget for all its keys and replicas, its reservations
counted by the team's pending rows; an end user's budget within the team is its own, and
another user of the team is not held by it; a token rate counts the worst case until the request
settles and its real count after; a refusal at one level leaves nothing at another.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from router.admission.limits import Reservation, SharedLimits
from router.admission.quota import Quota
from router.errors import QuotaError, RateLimitError
from router.ledger.postgres import PostgresStore
from tests.support.ledger import attempt, entry

TEAM = Quota("team", "lab", usd_per_day=1.0)
KEYS = [Quota("key", f"k{i}") for i in range(4)]


def replicas(db: str, n: int) -> list[SharedLimits]:
    out = []
    for _ in range(n):
        s = PostgresStore(db)
        s.open()
        out.append(SharedLimits(s, hold_ttl_s=60.0, workers=4))
    return out


def close(found: list[SharedLimits]) -> None:
    for r in found:
        r.close()
        r.counter.close()  # type: ignore[attr-defined]


def reservation(i: int, key: str, usd: float, *, user: str | None = None, tokens: int = 0) -> Reservation:
    return Reservation(f"r{i}", time.time(), key, "auto", usd, 60.0, team="lab", user=user, reserved_tokens=tokens)


async def attempt_admit(r: SharedLimits, quotas: list[Quota], res: Reservation) -> str:
    try:
        await r.admit(quotas, res, time.time())
    except QuotaError as exc:
        return f"quota:{exc.limit}"
    except RateLimitError as exc:
        return f"rate:{exc.limit}"
    return "ok"


async def test_a_team_budget_is_one_for_its_keys_and_a_users_is_its_own(db: str) -> None:
    found = replicas(db, 3)
    try:
        # 40 requests of $0.15 at once from four keys of one team on three replicas: six fit in $1
        outcomes = await asyncio.gather(
            *(
                attempt_admit(found[i % 3], [KEYS[i % 4], TEAM], reservation(i, KEYS[i % 4].name, 0.15))
                for i in range(40)
            )
        )
        assert outcomes.count("ok") == 6 and outcomes.count("quota:team.usd_per_day") == 34
        store = found[0].counter
        assert isinstance(store, PostgresStore)
        assert sum(store.live_reservations().values()) == pytest.approx(0.9)
        # settled at a smaller cost, the team's spend (key_spend 'team:lab') frees the rest
        first = next(i for i, o in enumerate(outcomes) if o == "ok")
        settled = replace(
            entry(f"r{first}", time.time(), key=KEYS[first % 4].name, attempts=(attempt(0, "small", cost=0.05),)),
            team="lab",
        )
        store.write(settled)
        assert await attempt_admit(found[1], [KEYS[0], TEAM], reservation(100, "k0", 0.15)) == "ok"
        assert await attempt_admit(found[2], [KEYS[1], TEAM], reservation(101, "k1", 0.15)) == "quota:team.usd_per_day"

        # an end user's budget within another team: its own, counted by its pending rows
        roomy = Quota("team", "lab", usd_per_day=100.0)
        bob = Quota("user", "bob", team="lab", usd_per_day=0.35)
        eve = Quota("user", "eve", team="lab", usd_per_day=0.35)
        runs = [await attempt_admit(found[i % 3], [KEYS[0], roomy, bob], reservation(200 + i, "k0", 0.1, user="bob")) for i in range(5)]  # fmt: skip
        assert runs == ["ok", "ok", "ok", "quota:user.usd_per_day", "quota:user.usd_per_day"]
        assert await attempt_admit(found[0], [KEYS[0], roomy, eve], reservation(300, "k0", 0.1, user="eve")) == "ok"
    finally:
        close(found)


async def test_a_token_rate_counts_the_worst_case_then_the_real_count(db: str) -> None:
    found = replicas(db, 2)
    try:
        key = Quota("key", "tok", tokens_per_minute=1000)
        outcomes = await asyncio.gather(
            *(attempt_admit(found[i % 2], [key], reservation(i, "tok", 0.0, tokens=300)) for i in range(8))
        )
        assert outcomes.count("ok") == 3 and outcomes.count("rate:key.tokens_per_minute") == 5
        # one settles at 20 real tokens: 280 freed, so one more worst case of 300 fits, not two
        store = found[0].counter
        assert isinstance(store, PostgresStore)
        first = next(i for i, o in enumerate(outcomes) if o == "ok")
        small = attempt(0, "small", cost=0.0)
        store.write(entry(f"r{first}", time.time(), key="tok", attempts=(small,)))
        real = small.prompt_tokens + small.completion_tokens
        assert real + 2 * 300 + 300 <= 1000
        assert await attempt_admit(found[1], [key], reservation(50, "tok", 0.0, tokens=300)) == "ok"
        assert (
            await attempt_admit(found[0], [key], reservation(51, "tok", 0.0, tokens=300))
            == "rate:key.tokens_per_minute"
        )
        # a worst case over the limit by itself is refused, saying so
        with pytest.raises(RateLimitError, match="This request alone"):
            await found[0].admit([key], reservation(52, "tok", 0.0, tokens=1001), time.time())
        # a refusal at the team level leaves no token event at the key's
        broke = Quota("team", "broke", usd_per_day=0.0)
        other = Quota("key", "tok2", tokens_per_minute=1000)
        assert (
            await attempt_admit(found[0], [other, broke], reservation(60, "tok2", 0.01, tokens=900))
            == "quota:team.usd_per_day"
        )
        assert await attempt_admit(found[1], [other], reservation(61, "tok2", 0.0, tokens=900)) == "ok"
    finally:
        close(found)
