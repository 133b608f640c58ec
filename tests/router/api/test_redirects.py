"""No response sends a client elsewhere: a path with a trailing slash is a 404 in OpenAI's shape,
not Starlette's 307 to a URL built from the request's own Host header (`Location:
http://evil.example/v1/models`, which a cache or a proxy in front could hand to others).

A keyed server answers any Host (a reverse proxy forwards its public name), so the attack is a
plain request with a chosen Host to a real server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.api.app import create_app
from router.config import load_settings
from tests.support.control import bearer, control_config
from tests.support.fault_upstream import FaultUpstream
from tests.support.servers import UvicornThread

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("redirects")
    with FaultUpstream() as upstream:
        cfg, raw = control_config(tmp, upstream.base_url, ledger=str(tmp / "ledger.sqlite3"), keys={"ana": {}})
        with UvicornThread(create_app(load_settings(cfg))) as server:
            yield server.url, raw


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models/"),
        ("GET", "/v1/models/small/"),
        ("POST", "/v1/chat/completions/"),
        ("GET", "/admin/keys/"),
        ("GET", "/healthz/"),
    ],
)
def test_a_trailing_slash_is_a_404_that_names_no_host(
    served: tuple[str, dict[str, str]], method: str, path: str
) -> None:
    url, raw = served
    for headers in ({}, bearer(raw["ana"]), bearer(raw["root"])):
        r = httpx.request(
            method, url + path, headers={**headers, "Host": "evil.example"}, follow_redirects=False, timeout=30
        )
        assert r.status_code == 404, (path, r.status_code, r.headers)
        assert "location" not in r.headers
        error: dict[str, Any] = r.json()["error"]
        assert error["type"] == "invalid_request_error" and path in error["message"]
        assert "evil.example" not in r.text


def test_the_same_paths_without_the_slash_still_answer(served: tuple[str, dict[str, str]]) -> None:
    url, raw = served
    r = httpx.get(url + "/v1/models", headers={**bearer(raw["ana"]), "Host": "evil.example"}, timeout=30)
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["auto", "small", "large"]


def test_the_bundled_app_has_redirect_slashes_off(tmp_path: Path) -> None:
    cfg, _ = control_config(tmp_path, "http://127.0.0.1:9/v1", ledger=str(tmp_path / "l.sqlite3"))
    assert create_app(load_settings(cfg)).router.redirect_slashes is False
