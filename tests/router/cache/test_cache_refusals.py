"""A refused request reads nothing from the cache, through the HTTP API: 401, 403, 400 and a spent
rate limit are answered before the lookup, and what the lookups metric counted says so. A spent
budget is the one refusal after a lookup: a hit costs nothing and is still served (docs/cache.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.accounting import auth, chat, running
from tests.support.cache import Counting, cache_config
from tests.support.metrics import samples, value


async def _misses(client: httpx.AsyncClient, key: str) -> float:
    """Lookups that found nothing, as /metrics counts them (a lookup of a new prompt is a miss);
    `key` an admin or metrics key (a client key gets 403 there)."""
    return value(
        samples((await client.get("/metrics", headers=auth(key))).text), "tierroute_cache_lookups_total", result="miss"
    )


async def test_a_refused_request_reads_nothing_from_the_cache(tmp_path: Path) -> None:
    keys: dict[str, dict[str, Any]] = {
        "ana": {},
        "paced": {"requests_per_minute": 2},
        "broke": {"usd_per_day": 0.0},
        "root": {"roles": ["admin"]},
    }
    cfg, raw = cache_config(tmp_path, keys)
    async with running(cfg, backends={"small": Counting("small")}) as client:
        cache = client.app.state.services.cache  # type: ignore[attr-defined]

        async def ask(key: str | None, body: dict[str, Any]) -> httpx.Response:
            r = await client.post("/v1/chat/completions", json=body, headers=auth(key) if key else {})
            await cache.close()
            return r

        made = await client.post("/admin/keys", json={"name": "narrow", "models": ["small"]}, headers=auth(raw["root"]))
        assert made.status_code == 201, made.text
        narrow = made.json()["key"]
        once = [await ask(raw["paced"], chat("Once.")) for _ in range(2)]
        assert [r.json()["tierroute"]["cache"] for r in once] == ["miss", "hit"]  # the rate: 2 of 2
        before = await _misses(client, raw["root"])
        refused = {
            "no key": await ask(None, chat("New 1.")),
            "wrong key": await ask("trk-not-a-key", chat("New 2.")),
            "not a client": await ask(raw["root"], chat("New 3.")),
            "model not allowed": await ask(narrow, chat("New 4.")),
            "invalid": await ask(raw["ana"], {**chat("New 5."), "temperature": 7}),
            "unknown model": await ask(raw["ana"], chat("New 6.", model="huge")),
            "rate spent": await ask(raw["paced"], chat("New 7.")),
        }
        after = await _misses(client, raw["root"])
        # the one refusal that follows a lookup: a spent budget (its hit would have been served)
        broke_new = await ask(raw["broke"], chat("New 8."))
        after_budget = await _misses(client, raw["root"])
    assert {k: r.status_code for k, r in refused.items()} == {
        "no key": 401,
        "wrong key": 401,
        "not a client": 403,
        "model not allowed": 403,
        "invalid": 400,
        "unknown model": 404,
        "rate spent": 429,
    }
    assert refused["rate spent"].json()["error"]["code"] == "rate_limit_exceeded"
    assert after == before  # not one of them was looked up
    assert broke_new.status_code == 429 and broke_new.json()["error"]["code"] == "insufficient_quota"
    assert after_budget == after + 1


@pytest.mark.slow
async def test_under_shared_limits_a_rate_refused_key_stops_reading_until_its_retry_after(
    tmp_path: Path, db: str
) -> None:
    keys: dict[str, dict[str, Any]] = {"paced": {"requests_per_minute": 1}, "scraper": {"roles": ["metrics"]}}
    cfg, raw = cache_config(tmp_path, keys, ledger_url=db)
    async with running(cfg, backends={"small": Counting("small")}) as client:
        first = await client.post("/v1/chat/completions", json=chat("One."), headers=auth(raw["paced"]))
        # the database's refusal of this window: that request was looked up (a replica cannot know
        # before asking), and the replica remembers the refusal until its Retry-After
        second = await client.post("/v1/chat/completions", json=chat("Two."), headers=auth(raw["paced"]))
        misses = await _misses(client, raw["scraper"])
        later = [
            await client.post("/v1/chat/completions", json=chat(f"More {i}."), headers=auth(raw["paced"]))
            for i in range(3)
        ]
        assert await _misses(client, raw["scraper"]) == misses == 2
    assert first.status_code == 200 and second.status_code == 429
    assert [r.status_code for r in later] == [429] * 3
    assert all(r.json()["error"]["code"] == "rate_limit_exceeded" for r in later)
    assert all(0 < float(r.headers["retry-after"]) <= 60 for r in later)
