"""docs/admin.md agrees with the admin API it documents: each `curl` example on the page, sent to
the app as curl would send it, is answered 2xx; and docs/admin-openapi.json, the schema the page
links, is what `scripts/gen_admin_openapi.py` writes and what the running app serves, listing the
errors the routes really give (OpenAI's shape, 400 for a bad body) and no 422.

The page's first examples sent JSON with `-d` alone, which curl labels
`application/x-www-form-urlencoded`; the service answered each with 400 ("The request body must be
a JSON object") and no test noticed. Here every example is read from the page (method, path,
headers and body, as curl builds them) and sent in order, so an example that stops working, or a
new one that never did, fails.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from scripts.gen_admin_openapi import OUT, render
from tests.support.accounting import running
from tests.support.control import control_config
from tests.support.fault_upstream import FaultUpstream

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[3]
ADMIN_PAGE = ROOT / "docs" / "admin.md"
SCHEMA = ROOT / OUT


def curl_examples(text: str) -> list[list[str]]:
    """Each `curl` command on the page (code lines, backslash continuations joined), as argv."""
    commands: list[list[str]] = []
    pending = ""
    for line in text.splitlines():
        code = line.strip()
        if not pending and not code.startswith("curl "):
            continue
        pending += code[:-1] + " " if code.endswith("\\") else code
        if not code.endswith("\\"):
            commands.append(shlex.split(pending))
            pending = ""
    assert not pending, f"a curl example ends in a continuation: {pending!r}"
    return commands


def as_curl_sends(argv: list[str]) -> tuple[str, str, dict[str, str], bytes | None]:
    """Method, path, headers and body of one curl command, with curl's defaults: `-d` makes a
    POST, and without a content-type header a form (`application/x-www-form-urlencoded`)."""
    assert argv[0] == "curl"
    method: str | None = None
    headers: dict[str, str] = {}
    data: str | None = None
    url: str | None = None
    args = iter(argv[1:])
    for arg in args:
        if arg == "-s":
            continue
        if arg == "-X":
            method = next(args)
        elif arg == "-H":
            name, _, value = next(args).partition(":")
            headers[name.strip().lower()] = value.strip()
        elif arg in ("-d", "--data"):
            data = next(args)
        else:
            assert url is None and not arg.startswith("-"), f"an option this test does not know: {arg}"
            url = arg
    assert url is not None, argv
    if data is not None:
        headers.setdefault("content-type", "application/x-www-form-urlencoded")
    parts = urlsplit(url if "://" in url else f"http://{url}")
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return method or ("POST" if data is not None else "GET"), path, headers, None if data is None else data.encode()


@pytest.fixture(scope="module")
def upstream() -> Any:
    with FaultUpstream() as up:
        yield up


@pytest.fixture
async def app(tmp_path: Path, upstream: FaultUpstream) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    cfg, raw = control_config(tmp_path, upstream.base_url, ledger=str(tmp_path / "ledger.sqlite3"))
    async with running(cfg) as client:
        yield client, raw


async def test_every_curl_example_in_the_admin_page_is_answered_2xx(
    app: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    client, raw = app
    examples = curl_examples(ADMIN_PAGE.read_text())
    assert len(examples) >= 6
    sent = []
    for argv in examples:
        method, path, headers, body = as_curl_sends(argv)
        assert "authorization" in headers and "$ADMIN" in headers["authorization"], argv
        headers["authorization"] = headers["authorization"].replace("$ADMIN", raw["root"])
        r = await client.request(method, path, headers=headers, content=body)
        assert r.is_success, (shlex.join(argv), r.status_code, r.text)
        sent.append((method, path))
    # they did what they say: the team, the key in it (limited, then changed, then revoked), a
    # default for every user of the team
    key = (await client.get("/admin/keys/nightly-ci", headers={"authorization": f"Bearer {raw['root']}"})).json()
    assert key["team"] == "research" and key["models"] is None and key["usd_per_month"] == 50
    assert key["requests_per_minute"] == 120 and key["revoked_at"] is not None
    users = await client.get("/admin/teams/research/users", headers={"authorization": f"Bearer {raw['root']}"})
    assert [(u["user"], u["usd_per_day"]) for u in users.json()["data"]] == [("*", 1.0)]


def test_curl_is_read_as_curl_sends_it() -> None:
    # the reading the test above relies on: a bare -d is a form POST, which the service refuses
    (argv,) = curl_examples("    curl -s localhost:8000/admin/teams -H 'X-A: b' \\\n      -d '{\"name\": \"t\"}'\n")
    assert as_curl_sends(argv) == (
        "POST",
        "/admin/teams",
        {"x-a": "b", "content-type": "application/x-www-form-urlencoded"},
        b'{"name": "t"}',
    )
    (argv,) = curl_examples("curl -X PUT localhost:8000/a/%2A?since=1 -H 'content-type: application/json' -d '{}'")
    assert as_curl_sends(argv) == ("PUT", "/a/%2A?since=1", {"content-type": "application/json"}, b"{}")


def refs(node: Any) -> set[str]:
    """The component names a piece of schema refers to, directly."""
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[1]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node))
    return set()


def test_the_committed_admin_schema_is_what_the_generator_writes() -> None:
    # stale: PYTHONPATH=$PWD .venv/bin/python scripts/gen_admin_openapi.py
    assert SCHEMA.read_text(encoding="utf-8") == render()
    assert f"]({SCHEMA.name})" in ADMIN_PAGE.read_text()  # and the page links it


async def test_the_served_schema_lists_the_errors_admin_routes_give_and_no_422(
    app: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    client, _ = app
    committed = json.loads(SCHEMA.read_text(encoding="utf-8"))
    served = client.app.openapi()  # type: ignore[attr-defined]  # what /openapi.json serves where server.docs is on
    admin_paths = {p: ops for p, ops in served["paths"].items() if p.startswith("/admin")}
    assert admin_paths == committed["paths"]
    # every component the admin paths use, followed through, is the same in both
    wanted, seen = refs(admin_paths), set()
    while wanted - seen:
        name = (wanted - seen).pop()
        seen.add(name)
        assert served["components"]["schemas"][name] == committed["components"]["schemas"][name], name
        wanted |= refs(committed["components"]["schemas"][name])
    assert {"ErrorResponse", "ErrorDetail"} <= seen and not {"HTTPValidationError", "ValidationError"} & seen
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, ops in admin_paths.items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert "422" not in codes, (method, path)  # a bad body is a 400 here, never FastAPI's 422
            assert {"400", "401", "403", "default"} <= codes, (method, path)
            assert ("404" in codes) == ("{" in path or method == "post" and path == "/admin/keys"), (method, path)
            assert ("409" in codes) == (method == "post" and path in ("/admin/keys", "/admin/teams")), (method, path)
            for code in codes - {"200", "201", "204"}:
                assert op["responses"][code]["content"]["application/json"]["schema"] == error_ref, (method, path)
    created = committed["components"]["schemas"]["KeyCreated"]["properties"]["key"]["description"]
    assert "salted" not in created and "sha256$" in created


async def test_an_admin_error_is_the_shape_the_schema_declares(app: tuple[httpx.AsyncClient, dict[str, str]]) -> None:
    # one of each declared status, checked against the schema's ErrorResponse fields
    client, raw = app
    admin = {"authorization": f"Bearer {raw['root']}"}
    declared = json.loads(SCHEMA.read_text(encoding="utf-8"))["components"]["schemas"]
    fields = set(declared["ErrorDetail"]["properties"])
    assert set(declared["ErrorResponse"]["properties"]) == {"error"}
    got = [
        await client.post("/admin/keys", json={"name": "k", "bogus": 1}, headers=admin),  # 400, not 422
        await client.get("/admin/keys"),  # 401
        await client.get("/admin/keys/nobody", headers=admin),  # 404
        await client.post("/admin/keys", json={"name": "root"}, headers=admin),  # 409
    ]
    assert [r.status_code for r in got] == [400, 401, 404, 409]
    for r in got:
        assert set(r.json()) == {"error"} and set(r.json()["error"]) == fields, r.text
