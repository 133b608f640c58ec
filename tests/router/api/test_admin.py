"""The admin API in one process on a SQLite ledger: keys, teams and user limits made, used,
changed and revoked through it; every admin route closed to client keys (enumerated from the
app, so a new route cannot be missed); the audit log complete and free of secrets; over-limit
answers that name the limit and its reset; a key held to its models.

The tiers are a scripted upstream on loopback: each answer costs what its usage says, so the
budgets here are small numbers of requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from router.admission.auth import Principal, is_admin
from router.api import routes_admin
from tests.support.accounting import running
from tests.support.control import bearer, control_config
from tests.support.fault_upstream import FaultUpstream

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def upstream() -> Any:
    with FaultUpstream() as up:
        yield up


@pytest.fixture
async def app(tmp_path: Path, upstream: FaultUpstream) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str], Path]]:
    ledger = tmp_path / "ledger.sqlite3"
    cfg, raw = control_config(tmp_path, upstream.base_url, ledger=str(ledger), keys={"legacy": {"usd_per_day": 5.0}})
    async with running(cfg) as client:
        yield client, raw, ledger


def body(model: str = "small", user: str | None = None, max_tokens: int = 8) -> dict[str, Any]:
    found: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": max_tokens}
    if user is not None:
        found["user"] = user
    return found


async def admin(client: httpx.AsyncClient, raw: dict[str, str], method: str, path: str, **kw: Any) -> httpx.Response:
    return await client.request(method, path, headers=bearer(raw["root"]), **kw)


async def test_a_key_is_made_used_limited_to_models_and_revoked_through_the_admin_api(
    app: tuple[httpx.AsyncClient, dict[str, str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    client, raw, ledger = app
    caplog.set_level(logging.DEBUG)
    r = await admin(client, raw, "POST", "/admin/teams", json={"name": "research", "requests_per_minute": 100})
    assert r.status_code == 201, r.text
    r = await admin(client, raw, "POST", "/admin/keys", json={"name": "ana", "team": "research", "models": ["small"]})
    assert r.status_code == 201, r.text
    made = r.json()
    key = made["key"]
    assert key.startswith("trk-") and made["team"] == "research" and made["models"] == ["small"]

    ok = await client.post("/v1/chat/completions", json=body("small", user="u1"), headers=bearer(key))
    assert ok.status_code == 200, ok.text
    for model in ("large", "auto"):  # a key limited to small: 403, naming what it may use
        refused = await client.post("/v1/chat/completions", json=body(model), headers=bearer(key))
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert error["code"] == "model_not_allowed" and error["param"] == "model"
        assert f"may not use the model '{model}'" in error["message"] and "small" in error["message"]
    listed = (await client.get("/v1/models", headers=bearer(key))).json()["data"]
    assert [m["id"] for m in listed] == ["small"]

    # its spend, per key, team and user, as the ledger holds it
    spend = (await admin(client, raw, "GET", "/admin/keys/ana/spend")).json()
    assert spend["requests_today"] == 1 and spend["usd_today"] > 0
    team = (await admin(client, raw, "GET", "/admin/teams/research/spend")).json()
    user = (await admin(client, raw, "GET", "/admin/teams/research/users/u1/spend")).json()
    assert team["usd_today"] == spend["usd_today"] == user["usd_today"]

    # limits change without a restart; the list never shows a hash
    r = await admin(client, raw, "PATCH", "/admin/keys/ana", json={"models": None, "usd_per_day": 1.0})
    assert r.status_code == 200 and r.json()["models"] is None and r.json()["usd_per_day"] == 1.0
    assert (await client.post("/v1/chat/completions", json=body("large"), headers=bearer(key))).status_code == 200
    listing = (await admin(client, raw, "GET", "/admin/keys")).text
    assert "sha256$" not in listing and "hash" not in json.loads(listing)["data"][0]

    # revoked: refused at once on this replica
    r = await admin(client, raw, "POST", "/admin/keys/ana/revoke")
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    gone = await client.post("/v1/chat/completions", json=body(), headers=bearer(key))
    assert gone.status_code == 401 and "revoked" in gone.json()["error"]["message"]

    # the audit log: every action, who and what, and no secret in it or in any log line
    audit = (await admin(client, raw, "GET", "/admin/audit")).json()["data"]
    actions = [(a["actor"], a["action"], a["target"]) for a in reversed(audit)]
    assert actions == [
        ("config", "key.import", "root"),
        ("config", "key.import", "legacy"),
        ("root", "team.create", "research"),
        ("root", "key.create", "ana"),
        ("root", "key.update", "ana"),
        ("root", "key.revoke", "ana"),
    ]
    with sqlite3.connect(ledger) as conn:
        stored = conn.execute("SELECT hash FROM api_keys WHERE name = 'ana'").fetchone()[0]
        audit_text = " ".join(" ".join(map(str, row)) for row in conn.execute("SELECT * FROM audit"))
    secrets = [key, stored, *raw.values()]
    assert not any(s in audit_text for s in secrets)
    assert not any(s in caplog.text for s in secrets)


async def test_every_admin_route_refuses_a_client_key_and_no_key(
    app: tuple[httpx.AsyncClient, dict[str, str], Path],
) -> None:
    client, raw, _ = app
    # every route of the admin router (in the schema or not), and every /admin path the app's
    # OpenAPI schema lists (a route added elsewhere): a new one is tested without editing this
    declared = {
        (method, route.path)
        for route in routes_admin.router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    schema = client.app.openapi()["paths"]  # type: ignore[attr-defined]
    listed = {(m.upper(), p) for p, ops in schema.items() if p.startswith("/admin") for m in ops}
    routes = sorted(declared | listed)
    assert len(routes) >= 15  # keys, teams, users, spend, audit
    assert listed == declared  # and every one is documented in the OpenAPI schema
    for method, path in routes:
        url = re.sub(r"\{[^}]+\}", "x", path)
        as_client = await client.request(method, url, headers=bearer(raw["legacy"]), json={})
        assert as_client.status_code == 403, (method, path, as_client.text)
        assert as_client.json()["error"]["code"] == "not_an_admin_key"
        anonymous = await client.request(method, url, json={})
        assert anonymous.status_code == 401, (method, path)
    # nothing a client key tried reached the control plane; its tries are audited as refused
    # (test_admin_access.py: at a bounded rate), the anonymous ones not
    audit = (await admin(client, raw, "GET", "/admin/audit")).json()["data"]
    assert {a["action"] for a in audit} == {"key.import", "admin.refused"}
    assert {a["actor"] for a in audit if a["action"] == "admin.refused"} == {"legacy"}
    # the admin key is not a client: no completions, unless it is also given the client role
    refused = await client.post("/v1/chat/completions", json=body(), headers=bearer(raw["root"]))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "not_a_client_key"
    both = (await admin(client, raw, "POST", "/admin/keys", json={"name": "ops", "roles": ["admin", "client"]})).json()
    assert (await client.post("/v1/chat/completions", json=body(), headers=bearer(both["key"]))).status_code == 200
    assert (await client.get("/admin/keys", headers=bearer(both["key"]))).status_code == 200


async def test_over_limit_answers_name_the_limit_and_when_it_resets(
    app: tuple[httpx.AsyncClient, dict[str, str], Path],
) -> None:
    client, raw, _ = app
    # a team budget some requests fit in: once spent, 429 naming it, and Retry-After at its reset
    await admin(client, raw, "POST", "/admin/teams", json={"name": "lab", "usd_per_day": 2e-5})
    key = (await admin(client, raw, "POST", "/admin/keys", json={"name": "k1", "team": "lab"})).json()["key"]
    for _ in range(40):
        r = await client.post("/v1/chat/completions", json=body(), headers=bearer(key))
        if r.status_code != 200:
            break
    assert r.status_code == 429, "40 requests never spent $2e-5"
    assert r.json()["error"]["code"] == "insufficient_quota"
    assert "team 'lab'" in r.json()["error"]["message"] and "team.usd_per_day" in r.json()["error"]["message"]
    assert r.headers["x-tierroute-limit"] == "team.usd_per_day"
    assert 1 <= int(r.headers["retry-after"]) <= 86400  # 00:00 UTC next
    assert "x-should-retry" not in r.headers  # a reset does make room: the client may wait for it

    # a budget smaller than the request's own worst case: no Retry-After, since no reset would help
    await admin(client, raw, "PATCH", "/admin/teams/lab", json={"usd_per_day": 1e-9})
    r = await client.post("/v1/chat/completions", json=body(), headers=bearer(key))
    assert r.status_code == 429 and r.headers["x-tierroute-limit"] == "team.usd_per_day"
    assert "retry-after" not in r.headers
    assert r.headers["x-should-retry"] == "false"  # the openai SDKs would otherwise retry it twice
    message = r.json()["error"]["message"]
    assert message.startswith("This request alone may cost up to $") and "team 'lab'" in message
    assert "waiting for it to reset will not help" in message and "smaller max_tokens" in message

    # an end user's request rate within a team; another user of the team is not held by it
    await admin(client, raw, "PATCH", "/admin/teams/lab", json={"usd_per_day": None})
    await admin(client, raw, "PUT", "/admin/teams/lab/users/bob", json={"requests_per_minute": 1})
    assert (await client.post("/v1/chat/completions", json=body(user="bob"), headers=bearer(key))).status_code == 200
    r = await client.post("/v1/chat/completions", json=body(user="bob"), headers=bearer(key))
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert r.json()["error"]["type"] == "requests" and r.headers["x-tierroute-limit"] == "user.requests_per_minute"
    assert "user 'bob' of team 'lab'" in r.json()["error"]["message"] and int(r.headers["retry-after"]) <= 60
    assert (await client.post("/v1/chat/completions", json=body(user="eve"), headers=bearer(key))).status_code == 200

    # a key's token rate: reserved at admission at the worst case, so a large max_tokens is refused
    capped = (await admin(client, raw, "POST", "/admin/keys", json={"name": "k2", "tokens_per_minute": 60})).json()[
        "key"
    ]
    r = await client.post("/v1/chat/completions", json=body(max_tokens=100), headers=bearer(capped))
    assert r.status_code == 429 and r.json()["error"]["type"] == "tokens"
    assert r.headers["x-tierroute-limit"] == "key.tokens_per_minute"
    assert "retry-after" not in r.headers  # alone over the rate: no minute ever holds it
    assert r.headers["x-should-retry"] == "false"
    assert r.json()["error"]["message"].startswith("This request alone may use up to")
    assert "waiting will not help" in r.json()["error"]["message"]


async def test_admin_input_is_checked_and_answers_in_openai_shape(
    app: tuple[httpx.AsyncClient, dict[str, str], Path],
) -> None:
    client, raw, _ = app
    cases = [
        ("POST", "/admin/keys", {"name": "bad name"}, 400),
        ("POST", "/admin/keys", {"name": "k\n"}, 400),  # a bare '$' matches before a final newline
        ("POST", "/admin/teams", {"name": "lab:x"}, 400),
        ("POST", "/admin/keys", {"name": "k", "team": "nope"}, 404),
        ("POST", "/admin/keys", {"name": "legacy"}, 409),
        ("POST", "/admin/keys", {"name": "k", "models": ["huge"]}, 400),
        ("POST", "/admin/keys", {"name": "k", "usd_per_day": -1}, 400),
        ("POST", "/admin/keys", {"name": "k", "roles": ["root"]}, 400),
        ("PATCH", "/admin/keys/nobody", {"usd_per_day": 1}, 404),
        ("POST", "/admin/keys/nobody/revoke", None, 404),
        ("PUT", "/admin/teams/none/users/u", {}, 404),
        # past PostgreSQL's INTEGER (and, at 10**20, SQLite's): a 400, not a 500 from the driver
        ("POST", "/admin/keys", {"name": "k", "requests_per_minute": 10**20}, 400),
        ("POST", "/admin/keys", {"name": "k", "tokens_per_minute": 2**31}, 400),
        ("POST", "/admin/teams", {"name": "t", "requests_per_minute": 10**20}, 400),
        ("PATCH", "/admin/keys/legacy", {"tokens_per_minute": 10**20}, 400),
        # the attack review's finding: a value of another JSON type was coerced, so a bool was the
        # unix time 1 ("in the past") and "yes" granted tierroute.tests
        ("PATCH", "/admin/keys/legacy", {"expires_at": True}, 400),
        ("PATCH", "/admin/keys/legacy", {"allow_tests": "yes"}, 400),
        ("PATCH", "/admin/keys/legacy", {"allow_tests": 1}, 400),
        ("PATCH", "/admin/keys/legacy", {"usd_per_day": True}, 400),
        ("POST", "/admin/keys", {"name": "k", "allow_tests": "true"}, 400),
        ("POST", "/admin/keys", {"name": "k", "expires_at": "2030-01-01"}, 400),
        # the same cap as the CLI's --expires-in-days (ten thousand years), held by the control plane
        ("POST", "/admin/keys", {"name": "k", "expires_at": 1e308}, 400),
        ("PATCH", "/admin/keys/legacy", {"expires_at": 1e18}, 400),
    ]
    for method, path, payload, code in cases:
        r = await admin(client, raw, method, path, json=payload)
        assert r.status_code == code, (method, path, r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        if payload and any(isinstance(v, bool | str) for k, v in payload.items() if k != "name"):
            assert "past" not in r.json()["error"]["message"]  # a type error, not a time judged
    legacy = (await admin(client, raw, "GET", "/admin/keys/legacy")).json()
    assert legacy["allow_tests"] is False and legacy["expires_at"] is None  # none of it was applied
    # a whole-number limit up to PostgreSQL's INTEGER is taken, on either store
    r = await admin(client, raw, "POST", "/admin/keys", json={"name": "k", "requests_per_minute": 2**31 - 1})
    assert r.status_code == 201 and r.json()["requests_per_minute"] == 2**31 - 1


def test_is_admin_is_the_role_check_other_routes_use() -> None:
    assert is_admin(Principal("a", None, roles=frozenset({"admin"})))
    assert not is_admin(Principal("c", None))


async def test_a_config_key_edited_after_its_import_is_named_in_a_warning(
    tmp_path: Path, upstream: FaultUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    # an operator rotating a leaked key the old way (a new hash in config.toml) keeps the old one
    # valid, since config keys are imported once: every start says so, naming the key only
    ledger = str(tmp_path / "ledger.sqlite3")
    cfg, first = control_config(tmp_path, upstream.base_url, ledger=ledger, keys={"legacy": {"usd_per_day": 5.0}})
    async with running(cfg):
        pass
    cfg, second = control_config(tmp_path, upstream.base_url, ledger=ledger, keys={"legacy": {"usd_per_day": 1.0}})
    with caplog.at_level(logging.WARNING, logger="router.control.registry"):
        async with running(cfg) as client:
            old = await client.post("/v1/chat/completions", json=body(), headers=bearer(first["legacy"]))
            new = await client.post("/v1/chat/completions", json=body(), headers=bearer(second["legacy"]))
    assert old.status_code == 200 and new.status_code == 401  # the database's key is served
    (warning,) = [r.getMessage() for r in caplog.records if "key 'legacy' differs" in r.getMessage()]
    assert "'legacy'" in warning and "its secret" in warning and "its limits" in warning
    assert first["legacy"] not in warning and second["legacy"] not in warning


async def test_a_user_with_a_control_character_is_refused_before_any_work(
    app: tuple[httpx.AsyncClient, dict[str, str], Path], upstream: FaultUpstream
) -> None:
    # PostgreSQL's TEXT takes no NUL: against `tierroute serve` on PostgreSQL, a plain key's
    # request with user "a\0b" was generated upstream, then answered 503 when its row could not be
    # written, and that row stayed first in the writer's retry queue for good: every later write
    # retried it first (one failing statement and a warning each), and no entry behind it (one a
    # real outage left) could be written again. A team key's got 503 from the limits store.
    client, raw, _ = app
    before = len(upstream.requests)
    for user in ("a\x00b", "tab\there", "bell\x07", "del\x7f"):
        r = await client.post("/v1/chat/completions", json=body(user=user), headers=bearer(raw["legacy"]))
        assert r.status_code == 400, (user, r.text)
        assert r.json()["error"]["param"] == "user"
    assert len(upstream.requests) == before  # refused before any generation
    ok = await client.post("/v1/chat/completions", json=body(user="ana@example.com ü"), headers=bearer(raw["legacy"]))
    assert ok.status_code == 200


async def test_a_key_serves_until_its_expiry_then_gets_401_saying_so(
    app: tuple[httpx.AsyncClient, dict[str, str], Path],
) -> None:
    # expiry is checked against the wall clock at each request (router.admission.auth): a key made
    # to expire two seconds ahead serves now and is refused once those seconds have passed
    client, raw, _ = app
    expires_at = time.time() + 2.0
    made = await admin(client, raw, "POST", "/admin/keys", json={"name": "brief", "expires_at": expires_at})
    assert made.status_code == 201 and made.json()["expires_at"] == expires_at
    key = made.json()["key"]
    before = await client.post("/v1/chat/completions", json=body(), headers=bearer(key))
    assert time.time() < expires_at, "the request took the whole two seconds: nothing was tested"
    assert before.status_code == 200, before.text
    await asyncio.sleep(max(0.0, expires_at - time.time()) + 0.05)
    after = await client.post("/v1/chat/completions", json=body(), headers=bearer(key))
    assert after.status_code == 401
    assert after.json() == {
        "error": {
            "message": "This API key has expired.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    # the admin API shows it as it is, and a past expiry cannot be set
    listed = {k["name"]: k for k in (await admin(client, raw, "GET", "/admin/keys")).json()["data"]}
    assert listed["brief"]["expires_at"] == expires_at
    again = await admin(client, raw, "PATCH", "/admin/keys/brief", json={"expires_at": time.time() - 1})
    assert again.status_code == 400 and "in the past" in again.json()["error"]["message"]


# every route that changes the control plane, in an order that can run (a team before its key),
# with the audit row it must write: (action, target)
MUTATIONS: list[tuple[str, str, str, dict[str, Any] | None, tuple[str, str]]] = [
    ("POST", "/admin/teams", "/admin/teams", {"name": "ops", "usd_per_day": 2.0}, ("team.create", "ops")),
    ("PATCH", "/admin/teams/{name}", "/admin/teams/ops", {"requests_per_minute": 30}, ("team.update", "ops")),
    ("POST", "/admin/keys", "/admin/keys", {"name": "eve", "team": "ops"}, ("key.create", "eve")),
    ("PATCH", "/admin/keys/{name}", "/admin/keys/eve", {"models": ["small"]}, ("key.update", "eve")),
    (
        "PUT",
        "/admin/teams/{team}/users/{user}",
        "/admin/teams/ops/users/u9",
        {"usd_per_day": 1.0},
        ("user.set", "ops/u9"),
    ),
    ("DELETE", "/admin/teams/{team}/users/{user}", "/admin/teams/ops/users/u9", None, ("user.delete", "ops/u9")),
    ("POST", "/admin/keys/{name}/revoke", "/admin/keys/eve/revoke", None, ("key.revoke", "eve")),
]


async def test_every_mutating_admin_route_writes_its_audit_row_and_no_secret(
    app: tuple[httpx.AsyncClient, dict[str, str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    client, raw, ledger = app
    caplog.set_level(logging.DEBUG)
    # enumerated from the app, as the access test does: a new mutating route fails here until it
    # is listed above with the row it writes
    schema = client.app.openapi()["paths"]  # type: ignore[attr-defined]
    mutating = {(m.upper(), p) for p, ops in schema.items() if p.startswith("/admin") for m in ops if m != "get"}
    assert mutating == {(method, template) for method, template, *_ in MUTATIONS}
    created = ""
    for method, _, url, payload, (action, target) in MUTATIONS:
        before = (await admin(client, raw, "GET", "/admin/audit")).json()["data"]
        r = await admin(client, raw, method, url, json=payload)
        assert r.is_success, (method, url, r.text)
        if action == "key.create":
            created = r.json()["key"]
        after = (await admin(client, raw, "GET", "/admin/audit")).json()["data"]
        assert len(after) == len(before) + 1, (method, url)
        row = after[0]  # newest first
        assert (row["actor"], row["action"], row["target"]) == ("root", action, target)
        assert before[0]["ts"] <= row["ts"] <= time.time()
    # what a change set is in its row: the fields sent, not the whole record
    rows = {a["action"]: a["detail"] for a in (await admin(client, raw, "GET", "/admin/audit")).json()["data"]}
    assert rows["key.update"] == {"models": ["small"]} and rows["team.update"] == {"requests_per_minute": 30}
    assert rows["user.set"]["usd_per_day"] == 1.0
    with sqlite3.connect(ledger) as conn:
        hashes = [h for (h,) in conn.execute("SELECT hash FROM api_keys")]
        audit_text = " ".join(" ".join(map(str, row)) for row in conn.execute("SELECT * FROM audit"))
    secrets = [created, *hashes, *raw.values()]
    assert created and all(secrets)
    assert not any(s in audit_text for s in secrets) and "trk-" not in audit_text and "sha256$" not in audit_text
    assert not any(s in caplog.text for s in secrets)
