"""Tenants of one cache, through the HTTP API: one key's many distinct requests evict only its own
entries (`cache.max_entries_per_scope`), on a real SQLite file and a real PostgreSQL ledger.

The tier is `Counting` (tests/support/cache.py): every generation answers differently, so a hit
is told from a generation by its text as well as by `tierroute.cache`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from router.config import load_settings
from router.errors import ConfigError
from tests.support.accounting import auth, chat, running
from tests.support.cache import Counting, cache_config

KEYS: dict[str, dict[str, object]] = {"ana": {}, "ben": {}, "cy": {}}


def _entries(db: Path | str) -> dict[str, int]:
    """Entries per scope, read from the database itself."""
    sql = "SELECT scope, count(*) FROM cache_entries GROUP BY scope"
    if isinstance(db, Path):
        with sqlite3.connect(db) as conn:
            return dict(conn.execute(sql).fetchall())
    with psycopg.connect(db) as conn:
        return {str(s): int(n) for s, n in conn.execute(sql).fetchall()}


async def flood(tmp_path: Path, ledger_url: str | None) -> None:
    # room for 8 in all, 3 per key: without the share, ben's 20 distinct requests flushed ana's and cy's
    cfg, raw = cache_config(
        tmp_path, KEYS, cache="enabled = true\nmax_entries = 8\nmax_entries_per_scope = 3\n", ledger_url=ledger_url
    )
    async with running(cfg, backends={"small": Counting("small")}) as client:
        cache = client.app.state.services.cache  # type: ignore[attr-defined]

        async def ask(key: str, q: str) -> tuple[str, str]:
            r = await client.post("/v1/chat/completions", json=chat(q), headers=auth(raw[key]))
            await cache.close()  # its store is in before the next request
            assert r.status_code == 200, r.text
            return r.json()["tierroute"]["cache"], r.json()["choices"][0]["message"]["content"]

        ana = [await ask("ana", q) for q in ("a1", "a2")]
        cy = [await ask("cy", "c1")]
        flooded = [await ask("ben", f"flood {i}") for i in range(20)]
        assert [s for s, _ in ana + cy + flooded] == ["miss"] * 23
        # the others' entries survived ben's flood, answered as stored
        assert [await ask("ana", q) for q in ("a1", "a2")] == [("hit", text) for _, text in ana]
        assert await ask("cy", "c1") == ("hit", cy[0][1])
        # ben kept his newest 3 and lost his older ones
        assert [(await ask("ben", f"flood {i}"))[0] for i in (19, 18, 17)] == ["hit"] * 3
        assert (await ask("ben", "flood 0"))[0] == "miss"
    db = ledger_url if ledger_url is not None else tmp_path / "ledger.sqlite3"
    counts = _entries(db)
    assert counts["key:ana"] == 2 and counts["key:cy"] == 1 and counts["key:ben"] <= 3, counts
    assert sum(counts.values()) <= 8


async def test_one_key_flooding_the_cache_evicts_only_its_own_entries(tmp_path: Path) -> None:
    await flood(tmp_path, None)


@pytest.mark.slow
async def test_one_key_flooding_the_cache_evicts_only_its_own_entries_on_postgresql(tmp_path: Path, db: str) -> None:
    await flood(tmp_path, db)


async def test_the_global_bound_still_holds_when_many_keys_fill_the_cache(tmp_path: Path) -> None:
    names = {f"k{i}": {} for i in range(4)}
    cfg, raw = cache_config(tmp_path, names, cache="enabled = true\nmax_entries = 4\nmax_entries_per_scope = 2\n")
    async with running(cfg, backends={"small": Counting("small")}) as client:
        cache = client.app.state.services.cache  # type: ignore[attr-defined]
        for i in range(4):
            for q in ("x", "y"):
                r = await client.post("/v1/chat/completions", json=chat(q), headers=auth(raw[f"k{i}"]))
                assert r.status_code == 200
                await cache.close()
    counts = _entries(tmp_path / "ledger.sqlite3")
    assert sum(counts.values()) <= 4 and all(n <= 2 for n in counts.values()), counts
    assert "key:k3" in counts  # the newest survive: the oldest of all went


def test_a_share_larger_than_the_whole_cache_is_refused(tmp_path: Path) -> None:
    cfg, _ = cache_config(tmp_path, KEYS, cache="enabled = true\nmax_entries = 100\nmax_entries_per_scope = 101\n")
    with pytest.raises(ConfigError, match="max_entries_per_scope"):
        load_settings(cfg)
    zero, _ = cache_config(tmp_path, KEYS, cache="enabled = true\nmax_entries_per_scope = 0\n", name="zero.toml")
    with pytest.raises(ConfigError, match="max_entries_per_scope"):
        load_settings(zero)
    default, _ = cache_config(tmp_path, KEYS, cache="enabled = true\nmax_entries = 50\n", name="default.toml")
    assert load_settings(default).cache.scope_share == 5  # a tenth of max_entries


async def test_a_keyless_server_is_one_tenant_with_the_whole_cache(tmp_path: Path) -> None:
    cfg, _ = cache_config(tmp_path, {}, cache="enabled = true\nmax_entries = 20\n")  # its share would be 2
    cfg.write_text(cfg.read_text().replace("[server]\n", "[server]\nallow_unauthenticated = true\n", 1))
    async with running(cfg, backends={"small": Counting("small")}) as client:
        cache = client.app.state.services.cache  # type: ignore[attr-defined]
        for i in range(6):
            assert (await client.post("/v1/chat/completions", json=chat(f"q{i}"))).status_code == 200
            await cache.close()
        again = await client.post("/v1/chat/completions", json=chat("q0"))
    assert again.json()["tierroute"]["cache"] == "hit"
    assert _entries(tmp_path / "ledger.sqlite3") == {"key:anonymous": 6}
