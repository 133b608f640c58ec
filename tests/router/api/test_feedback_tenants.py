"""Labels between tenants, attacked from outside: a real server on 127.0.0.1 with real keys.

- A client's label cannot overrule an admin reviewer's on the same request, in either order
  (latest-wins let the client have the last word).
- A client filling a request's label cap cannot lock the reviewer out (the cap counted every key's
  labels together).

What the service makes of the labels is read the way an operator reads it: `tierroute report
quality` on the ledger.
"""

from __future__ import annotations

import contextlib
import csv
import io
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.api.app import create_app
from router.api.routes_feedback import MAX_LABELS_PER_REQUEST
from router.backends.instant import InstantBackend
from router.cli import main as cli_main
from router.config import load_settings
from tests.support.accounting import auth, chat, config_with_keys, registry
from tests.support.servers import UvicornThread

pytestmark = pytest.mark.slow  # a server on loopback, and the CLI


@contextlib.contextmanager
def served(cfg: Path, backends: dict[str, Any]) -> Iterator[httpx.Client]:
    with (
        UvicornThread(create_app(load_settings(cfg), backends=backends, registry=registry())) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as client,
    ):
        yield client


def ask(client: httpx.Client, key: str, content: str = "What is 2 + 2?") -> str:
    r = client.post("/v1/chat/completions", json=chat(content), headers=auth(key))
    assert r.status_code == 200, r.text
    assert r.json()["tierroute"]["tier"] == "small"
    return str(r.json()["tierroute"]["request_id"])


def label(client: httpx.Client, key: str, request_id: str, score: Any) -> httpx.Response:
    return client.post("/v1/feedback", json={"request_id": request_id, "score": score}, headers=auth(key))


def report_rows(ledger: Path) -> list[dict[str, str]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["report", "quality", "--csv", "--ledger", str(ledger)]) == 0
    return list(csv.DictReader(io.StringIO(out.getvalue())))


def reviewed_setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    return config_with_keys(
        tmp_path,
        {"alice": {}, "root": {"roles": ["admin"]}},
        verifiers='[[tiers.verifiers]]\nname = "escalate_marked"\n',
    )


BACKENDS = {"small": InstantBackend("small", "4"), "large": InstantBackend("large", "4")}


def test_a_clients_label_never_overrules_an_admin_reviewers_whatever_the_order(tmp_path: Path) -> None:
    # measured on main: the request the client labelled after the reviewer read as right (latest wins)
    cfg, keys = reviewed_setup(tmp_path)
    with served(cfg, dict(BACKENDS)) as client:
        after, before = ask(client, keys["alice"]), ask(client, keys["alice"])
        assert label(client, keys["root"], after, 0).status_code == 200  # the reviewer: wrong
        assert label(client, keys["alice"], after, 1).status_code == 200  # the client, later: "right"
        assert label(client, keys["alice"], before, 1).status_code == 200  # the client first
        assert label(client, keys["root"], before, False).status_code == 200  # then the reviewer
        # a request only the client labelled keeps the client's label
        alone = ask(client, keys["alice"])
        assert label(client, keys["alice"], alone, True).status_code == 200
    (row,) = report_rows(tmp_path / "ledger.sqlite3")
    assert (row["tier"], row["labelled"], row["labelled_right"]) == ("small", "3", "1")


def test_a_client_filling_the_label_cap_does_not_lock_the_reviewer_out(tmp_path: Path) -> None:
    # measured on main: the reviewer's label after the client's 100 got 400 too_many_labels
    cfg, keys = reviewed_setup(tmp_path)
    with served(cfg, dict(BACKENDS)) as client:
        rid = ask(client, keys["alice"])
        for n in range(1, MAX_LABELS_PER_REQUEST + 1):
            r = label(client, keys["alice"], rid, 1)
            assert r.status_code == 200 and r.json()["labels"] == n, r.text
        refused = label(client, keys["alice"], rid, 1)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "too_many_labels"
        reviewed = label(client, keys["root"], rid, 0)
        assert reviewed.status_code == 200, reviewed.text
        # the count a giver sees is its own: the reviewer's first; the client learns nothing of it
        assert reviewed.json()["labels"] == 1
        assert label(client, keys["alice"], rid, 1).json()["error"]["code"] == "too_many_labels"
    with contextlib.closing(sqlite3.connect(tmp_path / "ledger.sqlite3")) as conn:
        counts = dict(conn.execute("SELECT key_id, count(*) FROM feedback GROUP BY key_id").fetchall())
    assert counts == {"alice": MAX_LABELS_PER_REQUEST, "root": 1}
    (row,) = report_rows(tmp_path / "ledger.sqlite3")
    assert (row["labelled"], row["labelled_right"]) == ("1", "0")  # the reviewer's verdict
