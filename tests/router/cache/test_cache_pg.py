"""The response cache shared by replicas on one PostgreSQL ledger: two real `tierroute serve`
processes behind a round-robin balancer, and the store's own rules on a real server.

The tier is the scripted OpenAI-compatible upstream (tests/support/fault_upstream.py), which
answers each generation differently here and counts what reaches it: a hit on the other replica
is the first replica's answer, word for word, with nothing sent upstream.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from router.cache import answer
from router.ledger.entries import CacheRow
from router.ledger.postgres import PostgresStore
from tests.support.accounting import auth, chat, keys_section
from tests.support.config import write_config
from tests.support.fault_upstream import FaultUpstream, ok
from tests.support.servers import serve_process

TIER = """
[[tiers]]
name = "large"
backend = "openai"
max_tokens = 16
timeout_s = 10
[tiers.openai]
base_url = "{base_url}"
model = "scripted"
max_attempts = 1
[tiers.price]
usd_per_1m_input_tokens = 0.60
usd_per_1m_output_tokens = 2.40
"""


def stream_text(r: httpx.Response) -> tuple[str, str]:
    """A stream's text and its `tierroute.cache`."""
    text, cache = "", ""
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            text += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
            cache = chunk.get("tierroute", {}).get("cache", cache)
    return text, cache


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_hit_on_one_replica_is_the_answer_another_generated(tmp_path: Path, db: str) -> None:
    with FaultUpstream() as upstream:
        upstream.script(ok(("first", " answer")), ok(("second", " answer")), ok(("third", " answer")))
        body, raw = keys_section({"ana": {}, "ben": {"requests_per_minute": 100}})
        text = f'[server]\n{body}\n[ledger]\nurl = "{db}"\n[cache]\nenabled = true\n' + TIER.format(
            base_url=upstream.base_url
        )
        cfg = write_config(tmp_path / "config.toml", text)
        with contextlib.ExitStack() as stack:
            a, b = (stack.enter_context(serve_process(cfg, log_path=tmp_path / f"serve{i}.log"))[1] for i in range(2))
            q = chat("Which answer?", max_tokens=16)
            first = httpx.post(f"{a}/v1/chat/completions", json=q, headers=auth(raw["ana"]), timeout=60)
            assert first.status_code == 200, first.text
            stored(db, 1)  # in the background, once the answer is sent
            again = httpx.post(f"{b}/v1/chat/completions", json=q, headers=auth(raw["ana"]), timeout=60)
            streamed = httpx.post(
                f"{a}/v1/chat/completions", json={**q, "stream": True}, headers=auth(raw["ana"]), timeout=60
            )
            # another key (a shared-limits one: admitted through the database) has its own entries
            other = httpx.post(f"{b}/v1/chat/completions", json=q, headers=auth(raw["ben"]), timeout=60)
            stored(db, 2)
            other_again = httpx.post(f"{a}/v1/chat/completions", json=q, headers=auth(raw["ben"]), timeout=60)
    hit = again.json()
    assert hit["tierroute"]["cache"] == "hit", hit
    assert hit["choices"] == first.json()["choices"] and hit["choices"][0]["message"]["content"] == "first answer"
    assert stream_text(streamed) == ("first answer", "hit")
    assert other.json()["tierroute"]["cache"] == "miss"
    assert other.json()["choices"][0]["message"]["content"] != "first answer"
    assert other_again.json()["tierroute"]["cache"] == "hit"
    assert other_again.json()["choices"] == other.json()["choices"]
    assert len(upstream.requests) == 2  # what reached the upstream: ana's first and ben's first
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT r.request_id, r.cost_usd, a.decision, a.prompt_tokens + a.completion_tokens "
            "FROM requests r JOIN attempts a USING (request_id)"
        ).fetchall()
        assert conn.execute("SELECT count(*) FROM cache_entries").fetchone()[0] == 2
    by_id = {r[0]: r[1:] for r in rows}
    assert by_id[hit["id"]] == (0.0, "cached", 0)
    assert by_id[first.json()["id"]][1] == "accepted" and by_id[first.json()["id"]][0] > 0


def stored(db: str, n: int) -> None:
    """Wait until the database holds n entries."""
    deadline = time.monotonic() + 30
    with psycopg.connect(db, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM cache_entries").fetchone() != (n,):
            assert time.monotonic() < deadline, f"{n} entries were never stored"
            time.sleep(0.05)


def _row(key: str, scope: str, created: float, ttl: float = 60.0) -> CacheRow:
    body = json.dumps({"v": 1, "key": key})
    return CacheRow(key, scope, "p", "chat.completion", "t", "r", created, created + ttl, len(body), body,
                    answer.digest(key, scope, body))  # fmt: skip


@pytest.mark.slow
def test_the_store_shares_entries_matches_scope_and_evicts_the_oldest(db: str) -> None:
    one, two = PostgresStore(db), PostgresStore(db)
    one.open()
    two.open()
    try:
        now = time.time()
        one.cache_put(_row("k1", "key:ana", now), max_entries=2)
        assert two.cache_get("k1", "key:ana", now) == one.cache_get("k1", "key:ana", now) is not None
        assert two.cache_get("k1", "key:ben", now) is None  # another scope never reads it
        assert two.cache_get("k1", "key:ana", now + 61) is None  # expired
        two.cache_put(_row("k2", "key:ana", now + 1), max_entries=2)
        one.cache_put(_row("k3", "key:ana", now + 2), max_entries=2)  # evicts k1, the oldest
        assert [two.cache_get(k, "key:ana", now + 3) is not None for k in ("k1", "k2", "k3")] == [False, True, True]
        two.cache_put(_row("k2", "key:ana", now + 3, ttl=1.0), max_entries=2)  # replaced in place
        one.cache_put(_row("k4", "key:ana", now + 10), max_entries=5)  # k2 has expired: dropped
        assert two.cache_get("k2", "key:ana", now) is None
        one.cache_drop("k3")
        assert two.cache_get("k3", "key:ana", now + 3) is None
        for k in ("k5", "k6", "k7"):  # without max_entries a store evicts nothing (only expired rows)
            two.cache_put(_row(k, "key:ana", now + 11), max_entries=None)
        assert [one.cache_get(k, "key:ana", now + 12) is not None for k in ("k4", "k5", "k6", "k7")] == [True] * 4
    finally:
        one.close()
        two.close()
