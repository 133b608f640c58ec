"""Names the service uses for itself are not a tenant's, and end users' names are plain text.

A key may not be named `anonymous` (every caller of a server without keys is `anonymous`: its
ledger rows, its cache entries under scope `key:anonymous`, the requests its feedback may label),
nor `config` (the audit log's actor for keys imported from the config), nor `_shadow` (the ledger
key shadow work is charged to), in any case; teams are held to the same rule. The outside review
made a key named `anonymous` on a server that had served without keys, and it read that era's
cache. Every path that makes a key or a team is tried: the admin API, `tierroute keys`, the
config's `[[server.api_keys]]`.

An end user's name set by an admin (`PUT /admin/teams/{team}/users/{user}`, `tierroute keys
user`) is printable text: no newline, no escape sequence, no bidi override (U+202E) or other
format character, which would land in limit rows, the audit target and every terminal that
shows them.

The app runs in-process on a real SQLite ledger; the CLI is `tierroute`'s own entry point."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from router.admission.auth import hash_key, new_key
from router.cli import main
from router.config import load_settings
from router.control.records import KeyRecord
from router.control.registry import KeyRegistry
from router.control.store import insert_key
from router.errors import ConfigError
from tests.support.accounting import running
from tests.support.config import write_config
from tests.support.control import TIER, bearer, control_config
from tests.support.fault_upstream import FaultUpstream

pytestmark = pytest.mark.timeout(120)

RESERVED = ("anonymous", "Anonymous", "ANONYMOUS", "config", "Config", "_shadow")
UNPLAIN_USERS = (
    "ana\nforged line",
    "ana\r",
    "\x1b[31mred",
    "ana\u202etxt.exe",  # RIGHT-TO-LEFT OVERRIDE
    "ana\u2066x",  # LEFT-TO-RIGHT ISOLATE
    "zero\u200bwidth",  # ZERO WIDTH SPACE, a format character
    "\ufeffbom",
    "tab\there",
    "nbsp\u00a0x",
    "ana\x00",
)
PLAIN_USERS = ("ana", "user-42@example.com", "Zoë Müller", "名前", "a b", "*")


@pytest.fixture(scope="module")
def upstream() -> Any:
    with FaultUpstream() as up:
        yield up


def _cached_config(tmp: Path, upstream: str, server: str) -> Path:
    text = f'[server]\n{server}\n[ledger]\npath = "{tmp / "ledger.sqlite3"}"\n[cache]\nenabled = true\n'
    return write_config(
        tmp / "cfg.toml", text + TIER.format(name="small", base_url=upstream, price_in=0.1, price_out=0.4)
    )


ASK = {"model": "small", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4, "temperature": 0}


async def test_no_key_can_take_a_keyless_servers_name_and_read_its_cache(
    tmp_path: Path, upstream: FaultUpstream
) -> None:
    # the keyless era: its answer cached under scope key:anonymous
    async with running(_cached_config(tmp_path, upstream.base_url, "allow_unauthenticated = true")) as client:
        r = await client.post("/v1/chat/completions", json=ASK)
        assert r.status_code == 200 and r.json()["tierroute"]["cache"] == "miss"
        await client.app.state.services.cache.close()  # type: ignore[attr-defined]
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        assert db.execute("SELECT scope FROM cache_entries").fetchall() == [("key:anonymous",)]
    # keys turned on: no key, team or config key may be called anonymous (or config, or _shadow)
    root = new_key()
    server = f'[[server.api_keys]]\nname = "root"\nhash = "{hash_key(root)}"\nroles = ["admin"]'
    async with running(_cached_config(tmp_path, upstream.base_url, server)) as client:
        for name in RESERVED:
            r = await client.post("/admin/keys", json={"name": name}, headers=bearer(root))
            assert r.status_code == 400, (name, r.text)
            error = r.json()["error"]
            assert error["code"] == "invalid_control_request" and "reserved" in error["message"], error
            r = await client.post("/admin/teams", json={"name": name}, headers=bearer(root))
            assert r.status_code == 400 and "reserved" in r.json()["error"]["message"], (name, r.text)
        made = await client.post("/admin/keys", json={"name": "anonymous2"}, headers=bearer(root))
        assert made.status_code == 201  # only the names themselves are reserved
        r = await client.post("/v1/chat/completions", json=ASK, headers=bearer(made.json()["key"]))
        assert r.status_code == 200 and r.json()["tierroute"]["cache"] == "miss"


def test_the_cli_and_the_config_refuse_reserved_names(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg, _ = control_config(tmp_path, "http://127.0.0.1:9/v1", ledger=str(tmp_path / "l.sqlite3"))
    for name in RESERVED:
        for argv in (
            ["keys", "create", name],
            ["keys", "create", name, "--print-config"],
            ["keys", "team", "create", name],
        ):
            rc = main(["--config", str(cfg), *argv])
            out, err = capsys.readouterr()
            assert rc == 1 and "reserved" in err and "trk-" not in out, (argv, out, err)
        # a [[server.api_keys]] entry by that name: the config itself is refused, naming the key
        bad, _ = control_config(
            tmp_path, "http://127.0.0.1:9/v1", ledger=str(tmp_path / "l.sqlite3"), keys={name: {}}, name="bad.toml"
        )
        with pytest.raises(ConfigError, match="reserved"):
            load_settings(bad)
    rc = main(["--config", str(cfg), "keys", "audit"])
    audit = json.loads(capsys.readouterr()[0])
    assert rc == 0 and [a["target"] for a in audit] == ["root"]  # nothing was made


async def test_an_end_users_name_is_plain_text(tmp_path: Path, upstream: FaultUpstream) -> None:
    cfg, raw = control_config(tmp_path, upstream.base_url, ledger=str(tmp_path / "ledger.sqlite3"))
    async with running(cfg) as client:
        r = await client.post("/admin/teams", json={"name": "lab"}, headers=bearer(raw["root"]))
        assert r.status_code == 201
        for user in UNPLAIN_USERS:
            r = await client.put(
                f"/admin/teams/lab/users/{quote(user, safe='')}", json={"usd_per_day": 1.0}, headers=bearer(raw["root"])
            )
            assert r.status_code == 400, (user, r.text)
            error = r.json()["error"]
            assert error["code"] == "invalid_control_request" and "printable" in error["message"], error
            assert "U+" in error["message"]  # which character, named, not echoed raw
        for user in PLAIN_USERS:
            r = await client.put(
                f"/admin/teams/lab/users/{quote(user, safe='')}", json={"usd_per_day": 1.0}, headers=bearer(raw["root"])
            )
            assert r.status_code == 200 and r.json()["user"] == user, (user, r.text)
        audit = await client.get("/admin/audit", headers=bearer(raw["root"]))
        targets = [a["target"] for a in audit.json()["data"] if a["action"] == "user.set"]
        assert sorted(targets) == sorted(f"lab/{u}" for u in PLAIN_USERS)
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        rows = {u for (u,) in db.execute("SELECT end_user FROM user_limits")}
    assert rows == set(PLAIN_USERS)


def test_the_cli_refuses_an_unplain_user(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg, _ = control_config(tmp_path, "http://127.0.0.1:9/v1", ledger=str(tmp_path / "l.sqlite3"))
    assert main(["--config", str(cfg), "keys", "team", "create", "lab"]) == 0
    capsys.readouterr()
    for user in UNPLAIN_USERS[:4]:
        rc = main(["--config", str(cfg), "keys", "user", "lab", user, "--usd-per-day", "1"])
        _, err = capsys.readouterr()
        assert rc == 1 and "printable" in err and user not in err, (user, err)


def test_a_key_stored_before_its_name_was_reserved_is_named_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, _ = control_config(tmp_path, "http://127.0.0.1:9/v1", ledger=str(tmp_path / "l.sqlite3"))
    registry = KeyRegistry(load_settings(cfg))
    registry.open()
    assert registry.store is not None
    with registry.store.transaction() as sql:  # as an older version stored it, unchecked
        insert_key(sql, KeyRecord(name="anonymous", hash=hash_key(new_key())))
    registry.store.close()
    registry = KeyRegistry(load_settings(cfg))
    with caplog.at_level("WARNING", logger="router.control.registry"):
        registry.open()
    assert registry.store is not None
    registry.store.close()
    said = [r.getMessage() for r in caplog.records if "'anonymous'" in r.getMessage()]
    assert said and "reserved" in said[0] and "revoke it" in said[0], said
