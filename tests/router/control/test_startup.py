"""Replicas that start at the same instant on one fresh PostgreSQL (as a rollout or a compose file
starts them): each migrates, opens the control tables and imports the config's keys while the
others do, and every one must come up serving them, with each key imported once and audited once.

Four apps' lifespans are entered together in one process (each with its own pools, as separate
processes would have), which overlaps their start-ups far more tightly than processes do; the
three-process test (test_replicas.py) starts real `tierroute serve` processes together; a
process's port can be taken by another while it starts (it binds only once its start-up is done),
and the test support starts it again on another port.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI

from router.api.app import create_app
from router.config import load_settings
from router.ledger.postgres_migrations import SCHEMA_VERSION
from tests.support import servers
from tests.support.control import bearer, control_config
from tests.support.fault_upstream import FaultUpstream

pytestmark = pytest.mark.timeout(180)
REPLICAS = 4
KEYS = {f"k{i}": {"usd_per_day": 1.0} for i in range(6)}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    with FaultUpstream() as up:
        yield up


async def test_replicas_starting_together_each_serve_every_config_key_imported_once(
    db: str, tmp_path: Path, upstream: FaultUpstream
) -> None:
    cfg, raw = control_config(tmp_path, upstream.base_url, ledger=db, keys=KEYS)
    apps = [create_app(load_settings(cfg)) for _ in range(REPLICAS)]
    async with contextlib.AsyncExitStack() as stack:
        results = await asyncio.gather(
            *(stack.enter_async_context(app.router.lifespan_context(app)) for app in apps), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        assert not failed, failed
        for i, app in enumerate(apps):
            assert await served(app, raw[f"k{i}"]) == 200

    with psycopg.connect(db) as conn:
        audit = conn.execute("SELECT actor, action, target FROM audit ORDER BY target").fetchall()
        stored = {r[0] for r in conn.execute("SELECT name FROM api_keys")}
        migrations = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
    assert audit == [("config", "key.import", name) for name in sorted(["root", *KEYS])]
    assert stored == {"root", *KEYS}
    assert migrations == list(range(1, SCHEMA_VERSION + 1))


async def served(app: FastAPI, key: str) -> int:
    body: dict[str, Any] = {"model": "small", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 8}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=60) as client:
        r = await client.post("/v1/chat/completions", json=body, headers=bearer(key))
    return r.status_code


@pytest.mark.slow  # starts `tierroute serve`
def test_a_replica_whose_port_was_taken_while_it_started_starts_again_on_another(
    tmp_path: Path, upstream: FaultUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the port chosen for it is taken by another listener before it binds: it exits 3 ("address
    # already in use") after its whole start-up, as a replica of test_replicas.py once did
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        chosen = iter([port])
        free = servers.free_port
        monkeypatch.setattr(servers, "free_port", lambda: next(chosen, None) or free())
        cfg, _ = control_config(tmp_path, upstream.base_url, ledger=str(tmp_path / "ledger.sqlite3"))
        with servers.serve_process(cfg, log_path=tmp_path / "serve.log") as (_, url, output):
            assert not url.endswith(f":{port}") and httpx.get(f"{url}/readyz").status_code == 200
            assert output().count(servers.PORT_TAKEN) == 1
