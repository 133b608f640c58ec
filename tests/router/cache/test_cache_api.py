"""The response cache through the HTTP API, on a real SQLite ledger: hits, scopes, what is never
stored, the client's Cache-Control, a policy change, bounds, and rows that were tampered with.

The tier is `Counting` (tests/support/cache.py): every generation answers differently, so an
answer that was generated again cannot pass for a hit, and its count is the generations done.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from router.api.requests import ChatCompletionRequest
from router.cache import answer, keys
from tests.support.accounting import auth, chat, read_ledger, running
from tests.support.cache import Counting, cache_config
from tests.support.metrics import samples, value

KEYS: dict[str, dict[str, Any]] = {"ana": {"roles": ["client", "metrics"]}, "ben": {}}  # ana reads /metrics


def content(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def streamed(r: httpx.Response) -> tuple[str, dict[str, Any]]:
    """A stream's text and its last chunk."""
    assert r.status_code == 200, r.text
    text, last = "", {}
    lines = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    for data in lines[:-1]:
        chunk = json.loads(data)
        last = chunk
        for c in chunk["choices"]:
            text += c["delta"].get("content") or ""
    return text, last


async def test_a_repeat_is_a_hit_with_the_same_answer_and_nothing_generated(tmp_path: Path) -> None:
    cfg, raw = cache_config(tmp_path, KEYS)
    backend = Counting("small")
    async with running(cfg, backends={"small": backend}) as client:
        first = await client.post("/v1/chat/completions", json=chat("Name a colour."), headers=auth(raw["ana"]))
        await client.app.state.services.cache.close()  # type: ignore[attr-defined]  # its store is in
        second = await client.post("/v1/chat/completions", json=chat("Name a colour."), headers=auth(raw["ana"]))
        stream = await client.post(
            "/v1/chat/completions",
            json={**chat("Name a colour.", stream=True), "stream_options": {"include_usage": True}},
            headers=auth(raw["ana"]),
        )
        metrics = samples((await client.get("/metrics", headers=auth(raw["ana"]))).text)
    assert backend.calls == 1
    assert content(first) == content(second) == "answer 1 here"
    assert first.json()["tierroute"]["cache"] == "miss" and first.headers["x-tierroute-cache"] == "miss"
    hit = second.json()
    assert hit["tierroute"]["cache"] == "hit" and second.headers["x-tierroute-cache"] == "hit"
    assert hit["tierroute"]["cached_request_id"] == first.json()["id"] != hit["id"]
    assert hit["tierroute"]["cost_usd"] == 0.0 and hit["tierroute"]["tier"] == "small"
    assert hit["usage"] == first.json()["usage"] and hit["choices"] == first.json()["choices"]
    text, last = streamed(stream)  # a hit asked as a stream is an ordinary stream
    assert text == "answer 1 here" and last["tierroute"]["cache"] == "hit"
    assert last["usage"] == first.json()["usage"]
    rows = read_ledger(tmp_path / "ledger.sqlite3")
    assert len(rows) == 3
    cached = rows[hit["id"]]
    assert cached.cost_usd == 0.0 and cached.prompt_tokens == cached.completion_tokens == 0
    assert [a.decision for a in cached.attempts] == ["cached"] and cached.tier == "small"
    assert value(metrics, "tierroute_cache_lookups_total", result="hit") == 2
    assert value(metrics, "tierroute_cache_lookups_total", result="miss") == 1
    assert value(metrics, "tierroute_cache_stores_total", result="stored") == 1
    assert value(metrics, "tierroute_requests_total", outcome="cached") == 2


async def test_keys_do_not_share_entries_and_only_deterministic_requests_are_cached(tmp_path: Path) -> None:
    cfg, raw = cache_config(tmp_path, KEYS)
    backend = Counting("small")
    async with running(cfg, backends={"small": backend}) as client:
        cache = client.app.state.services.cache  # type: ignore[attr-defined]

        async def ask(key: str, **extra: Any) -> httpx.Response:
            r = await client.post("/v1/chat/completions", json={**chat("Hi."), **extra}, headers=auth(raw[key]))
            await cache.close()
            return r

        a1, b1, a2, b2 = await ask("ana"), await ask("ben"), await ask("ana"), await ask("ben")
        sampled = [await ask("ana", temperature=0.8) for _ in range(2)]
        seeded = [await ask("ana", temperature=0.8, seed=7) for _ in range(2)]
        completion = []
        for _ in range(2):
            completion.append(
                await client.post(
                    "/v1/completions",
                    json={"model": "auto", "prompt": "Hi.", "temperature": 0},
                    headers=auth(raw["ana"]),
                )
            )
            await cache.close()  # the entry is stored in the background: wait for it, as `ask` does
    assert content(a1) == content(a2) != content(b1) == content(b2)  # each key its own entry
    assert [r.json()["tierroute"]["cache"] for r in (a1, b1, a2, b2)] == ["miss", "miss", "hit", "hit"]
    assert [r.json()["tierroute"]["cache"] for r in sampled] == ["skip", "skip"]
    assert content(sampled[0]) != content(sampled[1])
    assert [r.json()["tierroute"]["cache"] for r in seeded] == ["miss", "hit"]
    assert completion[0].json()["choices"] == completion[1].json()["choices"]
    assert completion[1].json()["tierroute"]["cache"] == "hit" and completion[1].json()["object"] == "text_completion"
    assert backend.calls == 2 + 2 + 1 + 1


async def test_cache_control_and_what_is_never_stored(tmp_path: Path) -> None:
    cfg, raw = cache_config(tmp_path, KEYS)
    backend = Counting("small")
    async with running(cfg, backends={"small": backend}) as client:
        cache = client.app.state.services.cache  # type: ignore[attr-defined]

        async def ask(body: dict[str, Any], control: str | None = None) -> httpx.Response:
            headers = auth(raw["ana"]) | ({"Cache-Control": control} if control else {})
            r = await client.post("/v1/chat/completions", json=body, headers=headers)
            await cache.close()
            return r

        q = chat("Count.")
        first = await ask(q)
        fresh = await ask(q, "no-cache")  # skips the lookup, and stores the fresh answer
        after = await ask(q)
        unstored = await ask(q, "no-store, max-age=0")
        still = await ask(q)
        cut = [await ask(chat("Long.", max_tokens=2)) for _ in range(2)]  # finish_reason length: never stored
        streamed_cut = await ask({**chat("Long, streamed.", max_tokens=2), "stream": True})
        again = await ask(chat("Long, streamed.", max_tokens=2))
        streamed_first = await ask({**chat("Streamed.", max_tokens=8), "stream": True})
        plain_after = await ask(chat("Streamed.", max_tokens=8))
    assert fresh.json()["tierroute"]["cache"] == "bypass" and content(fresh) != content(first)
    assert content(after) == content(fresh) and after.json()["tierroute"]["cache"] == "hit"
    assert unstored.json()["tierroute"]["cache"] == "bypass"
    assert content(still) == content(fresh)  # no-store did not replace the entry
    assert [c.json()["choices"][0]["finish_reason"] for c in cut] == ["length", "length"]
    assert [c.json()["tierroute"]["cache"] for c in cut] == ["miss", "miss"]
    assert streamed(streamed_cut)[1]["choices"][0]["finish_reason"] == "length"
    assert again.json()["tierroute"]["cache"] == "miss"
    # a streamed answer that ended on its own is stored, and served whole to a plain request
    assert streamed(streamed_first)[0] == content(plain_after) and plain_after.json()["tierroute"]["cache"] == "hit"


async def test_a_policy_change_invalidates_and_an_unchanged_config_still_hits(tmp_path: Path) -> None:
    await policy_change(tmp_path, None)


async def test_a_policy_change_invalidates_on_postgresql_too(tmp_path: Path, db: str) -> None:
    await policy_change(tmp_path, db)


async def policy_change(tmp_path: Path, ledger_url: str | None) -> None:
    cfg, raw = cache_config(tmp_path, KEYS, ledger_url=ledger_url)
    changed = tmp_path / "changed.toml"
    changed.write_text(cfg.read_text().replace("threshold = 0.5", "threshold = 0.6"))
    priced = tmp_path / "priced.toml"
    priced.write_text(cfg.read_text().replace("usd_per_1m_input_tokens = 0.60", "usd_per_1m_input_tokens = 0.70"))
    got = []
    for path in (cfg, changed, cfg, priced):
        async with running(path, backends={"small": Counting("small")}) as client:
            got.append(await client.post("/v1/chat/completions", json=chat("Policy?"), headers=auth(raw["ana"])))
    states = [r.json()["tierroute"]["cache"] for r in got]
    # a new threshold keys anew; the first config, restarted, finds its entry; a price is not policy
    assert states == ["miss", "miss", "hit", "hit"]
    assert content(got[2]) == content(got[0]) == content(got[3])


async def test_bounds_ttl_and_eviction(tmp_path: Path) -> None:
    # one key may fill the whole cache here (its share is a tenth of it by default: test_cache_tenants.py)
    cfg, raw = cache_config(
        tmp_path, KEYS, cache="enabled = true\nmax_entries = 2\nmax_entries_per_scope = 2\nttl_s = 60\n"
    )
    async with running(cfg, backends={"small": Counting("small")}) as client:
        cache = client.app.state.services.cache  # type: ignore[attr-defined]

        async def ask(q: str) -> str:
            r = await client.post("/v1/chat/completions", json=chat(q), headers=auth(raw["ana"]))
            await cache.close()
            return str(r.json()["tierroute"]["cache"])

        assert cache.evict_every == 1  # below 100 entries, every store evicts
        for q in ("one", "two", "three"):
            assert await ask(q) == "miss"
        assert [await ask("three"), await ask("two"), await ask("one")] == ["hit", "hit", "miss"]  # oldest evicted
        cache.clock = lambda: time.time() + 61  # past the TTL, on the cache's own clock
        assert await ask("two") == "miss"
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as conn:
        assert conn.execute("SELECT count(*) FROM cache_entries").fetchone()[0] <= 2


def _tamper(db: Path, sql: str, *args: Any) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(sql, args)


async def test_a_tampered_or_moved_row_is_a_miss_and_is_dropped(tmp_path: Path) -> None:
    cfg, raw = cache_config(tmp_path, KEYS)
    db = tmp_path / "ledger.sqlite3"
    backend = Counting("small")
    async with running(cfg, backends={"small": backend}) as client:
        cache = client.app.state.services.cache  # type: ignore[attr-defined]

        async def ask(key: str = "ana") -> httpx.Response:
            r = await client.post("/v1/chat/completions", json=chat("Secret?"), headers=auth(raw[key]))
            await cache.close()
            return r

        await ask()
        # the body changed, digest left as it was: refused
        _tamper(db, "UPDATE cache_entries SET body = replace(body, 'answer 1', 'poisoned')")
        r = await ask()
        assert r.json()["tierroute"]["cache"] == "miss" and "poisoned" not in content(r)
        # a body whose digest is recomputed (the digest is no secret) but whose shape is wrong
        with sqlite3.connect(db) as conn:
            key, scope, body = conn.execute("SELECT cache_key, scope, body FROM cache_entries").fetchone()
        for bad in (
            json.dumps({**json.loads(body), "choices": [{"index": 0, "message": {"role": "assistant", "content": 7}}]}),
            json.dumps({**json.loads(body), "usage": {"prompt_tokens": -1}}),
            "[" * 100_000,
            "not json",
        ):
            _tamper(db, "UPDATE cache_entries SET body = ?, digest = ?", bad, answer.digest(key, scope, bad))
            r = await ask()
            assert r.status_code == 200 and r.json()["tierroute"]["cache"] == "miss"
        # ana's entry handed to ben: another scope's row is never read (and would fail its digest)
        assert (await ask()).json()["tierroute"]["cache"] == "hit"  # the last miss stored a good answer
        bens = keys.cache_key(
            ChatCompletionRequest(**chat("Secret?")),
            shape="chat.completion",
            policy=cache.policy,
            scope="key:ben",
            client_code=False,
        )
        _tamper(db, "UPDATE cache_entries SET cache_key = ?, scope = 'key:ben'", bens)
        moved = await ask("ben")
        assert moved.json()["tierroute"]["cache"] == "miss" and content(moved) == "answer 7 here"  # not ana's 6
        metrics = samples((await client.get("/metrics", headers=auth(raw["ana"]))).text)
    assert value(metrics, "tierroute_cache_lookups_total", result="invalid") == 6
    assert value(metrics, "tierroute_cache_lookups_total", result="hit") == 1
    assert backend.calls == 1 + 5 + 1  # each refused row was answered by generating, the hit was not


async def test_a_hit_meets_the_rate_limit_but_not_the_budget(tmp_path: Path) -> None:
    keys = {"ana": {}, "broke": {"usd_per_day": 0.0}, "paced": {"requests_per_minute": 2}}
    cfg, raw = cache_config(tmp_path, keys, cache='enabled = true\nscope = "global"\n')
    async with running(cfg, backends={"small": Counting("small")}) as client:
        r = await client.post("/v1/chat/completions", json=chat("Shared."), headers=auth(raw["ana"]))
        await client.app.state.services.cache.close()  # type: ignore[attr-defined]
        broke_hit = await client.post("/v1/chat/completions", json=chat("Shared."), headers=auth(raw["broke"]))
        broke_new = await client.post("/v1/chat/completions", json=chat("New."), headers=auth(raw["broke"]))
        paced = [
            await client.post("/v1/chat/completions", json=chat("Shared."), headers=auth(raw["paced"]))
            for _ in range(3)
        ]
    assert content(broke_hit) == content(r) and broke_hit.json()["tierroute"]["cache"] == "hit"
    assert broke_new.status_code == 429 and broke_new.json()["error"]["code"] == "insufficient_quota"
    assert [p.status_code for p in paced] == [200, 200, 429]
    assert paced[2].json()["error"]["code"] == "rate_limit_exceeded"


async def test_the_official_client_reads_a_hit_plain_and_streamed(tmp_path: Path) -> None:
    cfg, raw = cache_config(tmp_path, KEYS)
    async with running(cfg, backends={"small": Counting("small")}) as client:
        sdk = openai.AsyncOpenAI(base_url="http://localhost/v1", api_key=raw["ana"], http_client=client, max_retries=0)
        ask = {"model": "auto", "messages": [{"role": "user", "content": "SDK?"}], "temperature": 0, "max_tokens": 8}
        first = await sdk.chat.completions.create(**ask)  # type: ignore[call-overload]
        await client.app.state.services.cache.close()  # type: ignore[attr-defined]
        hit = await sdk.chat.completions.create(**ask)  # type: ignore[call-overload]
        stream = await sdk.chat.completions.create(stream=True, stream_options={"include_usage": True}, **ask)  # type: ignore[call-overload]
        chunks = [c async for c in stream]
    assert hit.choices[0].message.content == first.choices[0].message.content == "answer 1 here"
    assert (hit.model_extra or {})["tierroute"]["cache"] == "hit" and hit.usage == first.usage
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "answer 1 here"
    assert chunks[-1].usage == first.usage and (chunks[-1].model_extra or {})["tierroute"]["cache"] == "hit"


async def test_a_request_served_greedy_is_cached_whatever_temperature_it_named(tmp_path: Path) -> None:
    # an omitted (or null) temperature and one below router.api.requests.GREEDY_BELOW are served
    # at temperature 0, as greedy as `"temperature": 0`: the cache skipped them as sampled, so a
    # repeat was generated again
    cfg, raw = cache_config(tmp_path, KEYS)
    backend = Counting("small")
    async with running(cfg, backends={"small": backend}) as client:
        cache = client.app.state.services.cache  # type: ignore[attr-defined]

        async def ask(content: str, **sampling: Any) -> httpx.Response:
            body = {"model": "auto", "messages": [{"role": "user", "content": content}], "max_tokens": 8, **sampling}
            r = await client.post("/v1/chat/completions", json=body, headers=auth(raw["ana"]))
            await cache.close()
            return r

        said = {}
        for name, sampling in (("omitted", {}), ("null", {"temperature": None}), ("tiny", {"temperature": 1e-5})):
            first, again = await ask(name, **sampling), await ask(name, **sampling)
            said[name] = [r.json()["tierroute"]["cache"] for r in (first, again)]
            assert content(first) == content(again), name
        sampled = [await ask("sampled", temperature=0.5) for _ in range(2)]
    assert said == {"omitted": ["miss", "hit"], "null": ["miss", "hit"], "tiny": ["miss", "hit"]}
    assert [r.json()["tierroute"]["cache"] for r in sampled] == ["skip", "skip"]
    assert backend.calls == 3 + 2
