"""Who may read what the control plane knows, checked over HTTP against the app on a SQLite ledger:
/metrics (it names every key and its spend) only for admin and metrics keys, and refused admin
attempts written to the audit log, bounded so a caller cannot fill it.

The tiers are a scripted upstream on loopback, as in test_admin.py.
"""

from __future__ import annotations

import json
import re
import sqlite3
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


def admin_routes(client: httpx.AsyncClient) -> list[tuple[str, str]]:
    schema = client.app.openapi()["paths"]  # type: ignore[attr-defined]
    return sorted((m.upper(), p) for p, ops in schema.items() if p.startswith("/admin") for m in ops)


def refusals(ledger: Path) -> list[tuple[str, str, dict[str, Any]]]:
    with sqlite3.connect(ledger) as conn:
        found = conn.execute("SELECT actor, target, detail FROM audit WHERE action = 'admin.refused' ORDER BY rowid")
        return [(actor, target, json.loads(detail)) for actor, target, detail in found]


async def test_refused_admin_attempts_of_known_keys_are_audited_at_a_bounded_rate(
    tmp_path: Path, upstream: FaultUpstream
) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    cfg, raw = control_config(tmp_path, upstream.base_url, ledger=str(ledger), keys={"ana": {}, "ben": {}})
    now = [1000.0]
    async with running(cfg) as client:
        client.app.state.services.refusals.clock = lambda: now[0]  # type: ignore[attr-defined]
        routes = admin_routes(client)
        # a client key tries every admin route three times within a minute: one row, the rest counted
        for _ in range(3):
            for method, path in routes:
                url = re.sub(r"\{[^}]+\}", "x", path)
                r = await client.request(method, url, headers=bearer(raw["ana"]), json={})
                assert r.status_code == 403, (method, path)
        (first,) = refusals(ledger)
        assert first[0] == "ana" and first[1] == routes[0][1]  # the route's template, not the path sent
        assert first[2] == {"method": routes[0][0], "status": 403, "reason": "not_admin"}
        # a minute later its next attempt is written, carrying what the minute held back
        now[0] += 61.0
        assert (await client.get("/admin/teams/blue", headers=bearer(raw["ana"]))).status_code == 403
        _, (actor, target, detail) = refusals(ledger)
        assert (actor, target) == ("ana", "/admin/teams/{name}")
        assert sum(detail["suppressed"].values()) == 3 * len(routes) - 1
        assert detail["suppressed"][f"{routes[0][0]} {routes[0][1]} 403"] == 2

        # a revoked key is known: audited with its 401
        assert (await admin(client, raw, "POST", "/admin/keys/ben/revoke")).status_code == 200
        for _ in range(2):
            assert (await client.get("/admin/keys", headers=bearer(raw["ben"]))).status_code == 401
        assert refusals(ledger)[-1] == ("ben", "/admin/keys", {"method": "GET", "status": 401, "reason": "revoked"})

        # unknown keys and no key: never a row (anyone can send them), counted by reason
        for _ in range(50):
            assert (await client.get("/admin/keys", headers=bearer(f"trk-{'A' * 43}"))).status_code == 401
        assert (await client.delete("/admin/teams/x/users/y")).status_code == 401
        assert len(refusals(ledger)) == 3
        assert (await client.get("/admin/keys", headers=bearer(raw["ana"]))).status_code == 403  # counted, held back
        metrics = (await client.get("/metrics", headers=bearer(raw["root"]))).text
    for reason, n in (("unknown_key", 50), ("no_key", 1), ("revoked", 2), ("not_admin", 3 * len(routes) + 2)):
        assert f'tierroute_admin_refused_total{{reason="{reason}"}} {n}.0' in metrics, reason
    # the replica's stop writes what it still counted (ana's last, ben's second): no attempt lost
    rows = refusals(ledger)
    assert [(a, t, d) for a, t, d in rows[3:]] == [
        ("ana", "*", {"suppressed": {"GET /admin/keys 403": 1}}),
        ("ben", "*", {"suppressed": {"GET /admin/keys 401": 1}}),
    ]
    # and no key, no hash in the audit table
    with sqlite3.connect(ledger) as conn:
        audit_text = " ".join(" ".join(map(str, row)) for row in conn.execute("SELECT * FROM audit"))
        hashes = [h for (h,) in conn.execute("SELECT hash FROM api_keys")]
    assert not any(s in audit_text for s in [*raw.values(), *hashes, "trk-"])
