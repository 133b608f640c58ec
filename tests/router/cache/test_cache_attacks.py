"""The response cache attacked from outside, through the HTTP API on a real SQLite ledger: what a
client's headers, another key of its team, or a refused request can make of it.

Keys, teams and permissions are made through the admin API, as an operator makes them; the tier
is `Counting` (tests/support/cache.py), so an answer generated again cannot pass for a hit.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.cache import answer
from router.ledger.entries import CacheRow
from router.ledger.sqlite_cache import EVICT_CUTOFF
from router.ledger.store import SQLiteStore
from tests.support.accounting import auth, chat, running
from tests.support.cache import Counting, cache_config
from tests.support.metrics import samples, value


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    """The app with a team cache scope, an admin key, team 'red' and its keys: ana (may send
    tests), ben (may not), and cy (two requests a minute)."""
    cfg, raw = cache_config(tmp_path, {"root": {}}, cache='enabled = true\nscope = "team"\n')
    cfg.write_text(cfg.read_text().replace('name = "root"', 'name = "root"\nroles = ["admin", "client"]'))
    async with running(cfg, backends={"small": Counting("small")}) as client:
        admin = auth(raw["root"])
        assert (await client.post("/admin/teams", json={"name": "red"}, headers=admin)).status_code == 201
        for name, fields in (
            ("ana", {"team": "red", "allow_tests": True}),
            ("ben", {"team": "red"}),
            ("cy", {"requests_per_minute": 2}),
        ):
            r = await client.post("/admin/keys", json={"name": name, **fields}, headers=admin)
            assert r.status_code == 201, r.text
            raw[name] = r.json()["key"]
        yield client, raw


async def ask(
    client: httpx.AsyncClient, key: str, body: dict[str, Any], headers: list[tuple[str, str]] | None = None
) -> httpx.Response:
    """POST a chat request, then wait for its answer's store to land."""
    r = await client.post("/v1/chat/completions", json=body, headers=[*auth(key).items(), *(headers or [])])
    await client.app.state.services.cache.close()  # type: ignore[attr-defined]
    return r


def cache_state(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["tierroute"]["cache"])


async def test_a_no_store_in_a_repeated_cache_control_header_is_honoured(
    api: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    # HTTP reads repeated header lines as one comma-separated list (RFC 9110, 5.3); a proxy may
    # split them so. Reading only the first line stored an answer its client said not to store.
    client, raw = api
    split = [("cache-control", "max-age=60"), ("cache-control", "no-store")]
    first = await ask(client, raw["ben"], chat("Private?"), split)
    again = await ask(client, raw["ben"], chat("Private?"))
    assert cache_state(first) == "bypass"
    assert cache_state(again) == "miss"  # nothing was stored


async def test_a_hit_refused_by_the_rate_limit_is_not_counted_as_a_hit(
    api: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    # the lookup runs before admission: counting a hit there made every 429 of a paced key a
    # "hit", so the hit rate an operator reads grew with the refusals
    client, raw = api
    got = [await ask(client, raw["cy"], chat("Paced.")) for _ in range(5)]
    assert [r.status_code for r in got] == [200, 200, 429, 429, 429]
    assert [cache_state(r) for r in got[:2]] == ["miss", "hit"]
    metrics = samples((await client.get("/metrics", headers=auth(raw["root"]))).text)
    assert value(metrics, "tierroute_cache_lookups_total", result="hit") == 1
    assert value(metrics, "tierroute_requests_total", outcome="cached") == 1


async def test_a_team_key_without_the_tests_permission_does_not_get_answers_checked_with_it(
    api: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    # the verifiers are told whether the caller may have code run (`client_code`): code_tests then
    # runs the prompt's own helpers and examples, so the permission decides the answer too
    client, raw = api
    code = chat('def add(a, b):\n    """\n    >>> add(1, 2)\n    3\n    """\n')
    ana = [await ask(client, raw["ana"], code) for _ in range(2)]
    ben = [await ask(client, raw["ben"], code) for _ in range(2)]
    assert [cache_state(r) for r in ana] == ["miss", "hit"]
    assert [cache_state(r) for r in ben] == ["miss", "hit"]  # ben's own entry, not ana's
    plain = [await ask(client, raw[k], chat("Team answer?")) for k in ("ana", "ben")]
    assert [cache_state(r) for r in plain] == ["miss", "miss"]


async def test_a_forged_row_cannot_name_a_tier_the_config_does_not_have(
    api: tuple[httpx.AsyncClient, dict[str, str]], tmp_path: Path
) -> None:
    # the digest is no secret: whoever can write the database can make a row pass it. A hit's tier
    # becomes the response's header, a ledger row's tier and a metrics label, so a forged name
    # would grow new series and ledger tiers with every row; a real entry names a configured tier
    # (the tiers are in the policy version)
    client, raw = api
    assert cache_state(await ask(client, raw["ben"], chat("Forged?"))) == "miss"
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as conn:
        key, scope, body = conn.execute("SELECT cache_key, scope, body FROM cache_entries").fetchone()
        forged = json.dumps({**json.loads(body), "tier": "forged-tier", "task": "t" * 200})
        conn.execute("UPDATE cache_entries SET body = ?, digest = ?", (forged, answer.digest(key, scope, forged)))
    r = await ask(client, raw["ben"], chat("Forged?"))
    assert cache_state(r) == "miss" and r.headers["x-tierroute-tier"] == "small"
    metrics = (await client.get("/metrics", headers=auth(raw["root"]))).text
    assert "forged-tier" not in metrics
    assert value(samples(metrics), "tierroute_cache_lookups_total", result="invalid") == 1


async def test_bodies_equal_as_json_share_an_entry_and_bodies_a_model_reads_differently_do_not(
    api: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    # the key is the request as the API parsed it: JSON escapes, key order, 0 and 0.0, a null for a
    # default and an unknown field read as one request; text the model would read differently
    # (another Unicode normal form, a space) is another request
    client, raw = api

    async def raw_ask(text: bytes) -> str:
        r = await client.post(
            "/v1/chat/completions", content=text, headers=auth(raw["ben"]) | {"content-type": "application/json"}
        )
        await client.app.state.services.cache.close()  # type: ignore[attr-defined]
        return cache_state(r)

    first = b'{"model":"auto","messages":[{"role":"user","content":"caf\xc3\xa9"}],"temperature":0,"max_tokens":8}'
    same = (
        b'{"max_tokens":8,"temperature":0.0,"seed":null,"metadata":{"x":1},"store":true,'
        b'"messages":[{"content":"caf\\u00e9","role":"user"}],"model":"auto"}'
    )
    other = (
        b'{"model":"auto","messages":[{"role":"user","content":"cafe\xcc\x81"}],"temperature":0,"max_tokens":8}',
        b'{"model":"auto","messages":[{"role":"user","content":"caf\xc3\xa9 "}],"temperature":0,"max_tokens":8}',
    )
    assert [await raw_ask(first), await raw_ask(same)] == ["miss", "hit"]
    assert [await raw_ask(b) for b in other] == ["miss", "miss"]


def test_eviction_walks_the_created_index_without_sorting_the_table(tmp_path: Path) -> None:
    # eviction runs on the ledger's one thread, every 1% of max_entries stores: ordering the
    # whole table by (created, cache_key) took 0.8-1.4 s at 1M entries, during which every
    # request's ledger write waited; the cutoff read off the created index took 23-31 ms
    store = SQLiteStore(tmp_path / "ledger.sqlite3")
    store.open()
    try:
        plan = " ".join(str(r[3]) for r in store.conn.execute(f"EXPLAIN QUERY PLAN {EVICT_CUTOFF}", (5,)))
        assert "TEMP B-TREE" not in plan and "COVERING INDEX cache_entries_created" in plan
        now = time.time()
        for i in range(6):
            body = json.dumps({"i": i})
            key = f"k{i}"
            row = CacheRow(key, "*", "p", "chat.completion", "small", "r", now + i, now + 60, len(body), body,
                           answer.digest(key, "*", body))  # fmt: skip
            store.cache_put(row, max_entries=3 if i >= 4 else None)
        kept = [store.cache_get(f"k{i}", "*", now) is not None for i in range(6)]
        assert kept == [False, False, False, True, True, True]  # the newest three
    finally:
        store.close()
