"""Who may read what the control plane knows, checked over HTTP against the app on a SQLite ledger:
/metrics (it names every key and its spend) only for admin and metrics keys, and refused admin
attempts written to the audit log, bounded so a caller cannot fill it.

The tiers are a scripted upstream on loopback, as in test_admin.py.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.cli import main
from tests.support.accounting import running
from tests.support.control import bearer, control_config
from tests.support.fault_upstream import FaultUpstream

pytestmark = pytest.mark.timeout(120)

KEY_RE = re.compile(r"trk-[A-Za-z0-9_-]{20,}")
ERROR_FIELDS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def upstream() -> Any:
    with FaultUpstream() as up:
        yield up


@pytest.fixture
async def app(
    tmp_path: Path, upstream: FaultUpstream, capsys: pytest.CaptureFixture[str]
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str], Path]]:
    """Teams red and blue with a client key each (ana, ben), the admin key root, and a scraper's
    key made as an operator would: `tierroute keys create prom --metrics`."""
    ledger = tmp_path / "ledger.sqlite3"
    cfg, raw = control_config(tmp_path, upstream.base_url, ledger=str(ledger))
    assert main(["--config", str(cfg), "keys", "create", "prom", "--metrics"]) == 0
    (raw["prom"],) = KEY_RE.findall(capsys.readouterr().out)
    async with running(cfg) as client:
        for team, key in (("red", "ana"), ("blue", "ben")):
            assert (await admin(client, raw, "POST", "/admin/teams", json={"name": team})).status_code == 201
            made = await admin(client, raw, "POST", "/admin/keys", json={"name": key, "team": team})
            raw[key] = made.json()["key"]
        yield client, raw, ledger


async def admin(client: httpx.AsyncClient, raw: dict[str, str], method: str, path: str, **kw: Any) -> httpx.Response:
    return await client.request(method, path, headers=bearer(raw["root"]), **kw)


def chat() -> dict[str, Any]:
    return {"model": "small", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 8}


async def test_metrics_name_keys_and_spend_only_to_admin_and_metrics_keys(
    app: tuple[httpx.AsyncClient, dict[str, str], Path],
) -> None:
    client, raw, _ = app
    for key in ("ana", "ben"):
        assert (await client.post("/v1/chat/completions", json=chat(), headers=bearer(raw[key]))).status_code == 200

    # a client key of team red learns nothing of team blue's key or spend: 403, OpenAI's shape
    refused = await client.get("/metrics", headers=bearer(raw["ana"]))
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert set(error) == ERROR_FIELDS and error["code"] == "not_a_metrics_key"
    assert "ben" not in refused.text and "tierroute_key_cost" not in refused.text
    assert (await client.get("/metrics")).status_code == 401
    assert (await client.get("/metrics", headers=bearer("trk-" + "x" * 43))).status_code == 401

    # the scraper's key and an admin key read every key's spend
    for reader in ("prom", "root"):
        scraped = await client.get("/metrics", headers=bearer(raw[reader]))
        assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
        assert re.search(r'^tierroute_key_cost_usd_total\{key="ben"\} [0-9.e-]+$', scraped.text, re.M)
        assert 'tierroute_key_cost_usd_total{key="ana"}' in scraped.text

    # and the scraper's key reads nothing else: no completions, no admin API
    as_client = await client.post("/v1/chat/completions", json=chat(), headers=bearer(raw["prom"]))
    assert as_client.status_code == 403 and as_client.json()["error"]["code"] == "not_a_client_key"
    as_admin = await client.get("/admin/keys", headers=bearer(raw["prom"]))
    assert as_admin.status_code == 403 and as_admin.json()["error"]["code"] == "not_an_admin_key"
    listed = {k["name"]: k["roles"] for k in (await admin(client, raw, "GET", "/admin/keys")).json()["data"]}
    assert listed["prom"] == ["metrics"] and listed["ana"] == ["client"]
