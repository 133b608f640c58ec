"""Labels between tenants, attacked from outside: a real server on 127.0.0.1 with real keys.

- A client's label cannot overrule an admin reviewer's on the same request, in either order
  (latest-wins let the client have the last word).
- A client filling a request's label cap cannot lock the reviewer out (the cap counted every key's
  labels together).
- A label counts against its key's request rate: a key allowed 2 requests a minute wrote 100
  labels in 2 s; now its third call of the minute, label or completion, is a 429 in OpenAI's
  shape with a Retry-After, on a SQLite ledger and on a PostgreSQL one (the shared limits).

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
import openai
import psycopg
import pytest

from router.api.app import create_app
from router.api.routes_feedback import MAX_LABELS_PER_REQUEST
from router.backends.instant import InstantBackend
from router.cli import main as cli_main
from router.config import load_settings
from tests.support.accounting import auth, chat, config_with_keys, registry
from tests.support.cache import Counting, cache_config
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


def _stored_labels(db: Path | str) -> int:
    sql = "SELECT count(*) FROM feedback"
    if isinstance(db, Path):
        with contextlib.closing(sqlite3.connect(db)) as conn:
            return int(conn.execute(sql).fetchone()[0])
    with psycopg.connect(db) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return int(row[0])


def _labels_count_against_the_keys_request_rate(tmp_path: Path, ledger_url: str | None) -> None:
    # measured on main: a key allowed 2 requests a minute wrote 100 labels of 2 KB in 2 s
    cfg, keys = cache_config(
        tmp_path,
        {"carol": {"requests_per_minute": 2}, "dave": {}},
        cache="enabled = false\n",
        ledger_url=ledger_url,
    )
    with served(cfg, {"small": Counting("small")}) as client:
        rid = ask(client, keys["carol"])  # 1 of 2
        dave = ask(client, keys["dave"])
        comment = "x" * 2000
        sent = [
            client.post(
                "/v1/feedback",
                json={"request_id": rid, "score": 0, "comment": comment},
                headers=auth(keys["carol"]),
            )
            for _ in range(20)
        ]
        assert [r.status_code for r in sent] == [200] + [429] * 19  # 2 of 2, then refused
        refused = sent[1]
        assert refused.json()["error"] == {
            "message": refused.json()["error"]["message"],
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
        assert "2 requests per minute" in refused.json()["error"]["message"]
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert refused.headers["x-tierroute-limit"] == "key.requests_per_minute"
        # the same window for completions: the labels used it up
        assert client.post("/v1/chat/completions", json=chat("2+2?"), headers=auth(keys["carol"])).status_code == 429
        # through the official client: its RateLimitError, as for a completion
        carol = openai.OpenAI(base_url=f"{str(client.base_url).rstrip('/')}/v1", api_key=keys["carol"], max_retries=0)
        with pytest.raises(openai.RateLimitError) as caught:
            carol.post("/feedback", body={"request_id": rid, "score": 1}, cast_to=httpx.Response)
        assert caught.value.code == "rate_limit_exceeded"
        # another key is not touched by carol's window
        assert all(label(client, keys["dave"], dave, 1).status_code == 200 for _ in range(5))
    assert _stored_labels(ledger_url or tmp_path / "ledger.sqlite3") == 1 + 5


def test_labels_count_against_the_keys_request_rate(tmp_path: Path) -> None:
    _labels_count_against_the_keys_request_rate(tmp_path, None)


def test_labels_count_against_the_keys_request_rate_on_postgresql(tmp_path: Path, db: str) -> None:
    _labels_count_against_the_keys_request_rate(tmp_path, db)
