"""Every audit row is reachable, through the admin API and the CLI, however many there are.

The outside review pushed a key's creation row out of both with 1,001 updates: they showed the
newest 1,000 rows and had no way past them. Here 1,004 updates follow the creation (some rows
share one timestamp, as rows written in one instant do), and the pages are walked with a cursor
and a page size until none is left: every row comes back exactly once, newest first, the creation
last; `keys audit --all` prints them all, and `keys audit --limit` says how to go on.

The app runs in-process on a real SQLite ledger; the CLI is `tierroute`'s own entry point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.cli import main
from router.control.store import ControlStore
from tests.support.accounting import running
from tests.support.control import bearer, control_config

pytestmark = pytest.mark.timeout(300)

UPDATES = 1_004
UPSTREAM = "http://127.0.0.1:9/v1"  # never called: nothing here generates


def _fill(store: ControlStore) -> int:
    """`UPDATES` key.update rows after ana's key.create, written as the control plane writes them
    (one transaction here, not 1,004 HTTP calls), eight of them sharing one timestamp; how many
    rows the log then holds."""
    with store.transaction() as sql:
        row = sql.run("SELECT ts FROM audit WHERE action = 'key.create'").one()
        assert row is not None
        created = float(row[0])
        rows = [
            (created + 1 + i * 1e-3, "root", "key.update", "ana", json.dumps({"usd_per_day": i}))
            for i in range(UPDATES)
        ]
        rows[:8] = [(created + 0.5, "root", "key.update", "ana", json.dumps({"usd_per_day": i})) for i in range(8)]
        for values in rows:
            sql.run("INSERT INTO audit (ts, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)", values)
        count = sql.run("SELECT count(*) FROM audit").one()
    assert count is not None
    return int(count[0])


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["ts"], row["actor"], row["action"], row["target"], json.dumps(row["detail"], sort_keys=True))


async def _walk(client: httpx.AsyncClient, admin: str, limit: int) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": limit}
    for _ in range(UPDATES):  # bounded: a cursor that never ended would fail here
        r = await client.get("/admin/audit", params=params, headers=bearer(admin))
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["data"]) <= limit
        seen += page["data"]
        if not page.get("has_more"):
            assert page.get("next_cursor") is None
            return seen
        params = {"limit": limit, "cursor": page["next_cursor"]}
    raise AssertionError("the pages never ended")


@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
async def test_every_audit_row_is_reachable_through_the_admin_api(
    tmp_path: Path, request: pytest.FixtureRequest, store: str
) -> None:
    ledger = str(tmp_path / "ledger.sqlite3") if store == "sqlite" else request.getfixturevalue("db")
    cfg, raw = control_config(tmp_path, UPSTREAM, ledger=ledger)
    async with running(cfg) as client:
        r = await client.post("/admin/keys", json={"name": "ana"}, headers=bearer(raw["root"]))
        assert r.status_code == 201
        total = _fill(client.app.state.services.keys.store)  # type: ignore[attr-defined]
        assert total == UPDATES + 2  # root's import, ana's creation, the updates

        for limit in (1000, 7, 333):
            rows = await _walk(client, raw["root"], limit)
            assert ("key.create", "ana") in [(r["action"], r["target"]) for r in rows], (limit, len(rows))
            assert len(rows) == total and len({_key(r) for r in rows}) == total, limit
            assert [r["ts"] for r in rows] == sorted((r["ts"] for r in rows), reverse=True)
            assert (rows[-2]["action"], rows[-2]["target"]) == ("key.create", "ana")
            assert (rows[-1]["action"], rows[-1]["target"]) == ("key.import", "root")
        first = (await client.get("/admin/audit", headers=bearer(raw["root"]))).json()
        assert len(first["data"]) == 1000 and first["has_more"] is True  # the default page, as before

        forged = ({"cursor": "1:9223372036854775808"}, {"cursor": "1:" + "9" * 20}, {"cursor": "1:\u0661\u0662"})
        for bad in (
            {"limit": 0},
            {"limit": 1001},
            {"cursor": "nonsense"},
            {"cursor": "1e400:0"},
            {"cursor": "1:-1"},
            *forged,
        ):
            r = await client.get("/admin/audit", params=bad, headers=bearer(raw["root"]))
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", (bad, r.text)


def test_every_audit_row_is_reachable_through_the_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    cfg, _ = control_config(tmp_path, UPSTREAM, ledger=str(ledger))
    assert main(["--config", str(cfg), "keys", "create", "ana"]) == 0
    store = ControlStore(ledger)
    store.open()
    _fill(store)
    store.close()
    capsys.readouterr()

    # `keys audit` as an operator first runs it, following what it says until it says no more
    walked: list[dict[str, Any]] = []
    argv = ["--config", str(cfg), "keys", "audit"]
    for _ in range(10):
        assert main(argv) == 0
        out, err = capsys.readouterr()
        walked += json.loads(out)
        if "--cursor" not in err:
            break
        argv = [*argv[:4], "--limit", "400", "--cursor", err.split("--cursor ")[1].split()[0]]
    assert ("key.create", "ana") in [(r["action"], r["target"]) for r in walked], len(walked)
    assert len(walked) == UPDATES + 2 and len({_key(r) for r in walked}) == UPDATES + 2

    assert main(["--config", str(cfg), "keys", "audit", "--all", "--limit", "333"]) == 0
    rows = json.loads(capsys.readouterr()[0])
    assert [_key(r) for r in rows] == [_key(r) for r in walked]
    assert (rows[-2]["action"], rows[-2]["target"]) == ("key.create", "ana")
