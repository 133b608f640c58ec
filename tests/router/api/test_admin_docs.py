"""docs/admin.md agrees with the admin API it documents: each `curl` example on the page, sent to
the app as curl would send it, is answered 2xx.

The page's first examples sent JSON with `-d` alone, which curl labels
`application/x-www-form-urlencoded`; the service answered each with 400 ("The request body must be
a JSON object") and no test noticed. Here every example is read from the page (method, path,
headers and body, as curl builds them) and sent in order, so an example that stops working, or a
new one that never did, fails.
"""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.accounting import running
from tests.support.control import control_config
from tests.support.fault_upstream import FaultUpstream

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[3]
ADMIN_PAGE = ROOT / "docs" / "admin.md"


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
