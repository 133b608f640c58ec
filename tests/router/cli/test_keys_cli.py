"""`tierroute keys ...` on a config whose ledger is enabled: the same operations as the admin API,
audited as `cli:USER`; the config's keys imported once; `serve` accepting keys that live only in
the database. SQLite, no model, no server: seconds."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from router.admission.auth import Authenticator, check_bind
from router.cli import main
from router.cli.main import _stored_keys
from router.config import load_settings
from router.control.registry import KeyRegistry
from router.errors import AuthError, ConfigError
from tests.support.control import control_config

KEY_RE = re.compile(r"trk-[A-Za-z0-9_-]{20,}")
UPSTREAM = "http://127.0.0.1:9/v1"  # never called: nothing here generates


def run(capsys: pytest.CaptureFixture[str], cfg: Path, *argv: str) -> tuple[int, str, str]:
    rc = main(["--config", str(cfg), "keys", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def authenticator(cfg: Path) -> tuple[Authenticator, KeyRegistry]:
    settings = load_settings(cfg)
    registry = KeyRegistry(settings, models=["auto", "small", "large"])
    registry.open()
    return Authenticator(settings.server, keys=lambda: registry.snapshot), registry


def test_keys_teams_and_users_through_the_cli_are_the_admin_apis_and_audited(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg, _ = control_config(tmp_path, UPSTREAM, ledger=str(tmp_path / "l.sqlite3"))
    rc, _, err = run(capsys, cfg, "create", "ana", "--team", "lab")
    assert rc == 1 and "no team named 'lab'" in err  # the same refusal as the admin API's 404
    assert run(capsys, cfg, "team", "create", "lab", "--usd-per-day", "2")[0] == 0
    assert run(capsys, cfg, "user", "lab", "*", "--requests-per-minute", "5")[0] == 0
    rc, out, _ = run(capsys, cfg, "create", "ana", "--team", "lab", "--models", "small", "--tpm", "500")
    assert rc == 0
    key = KEY_RE.findall(out)[0]
    assert "[[server.api_keys]]" not in out  # stored, not a block to paste

    auth, registry = authenticator(cfg)
    who = auth.authenticate(f"Bearer {key}")
    assert (who.key_id, who.team, who.models) == ("ana", "lab", frozenset({"small"}))
    assert [q.subject for q in who.quotas] == ["ana", "team:lab"]
    quota = registry.user_quota("lab", "anyone")
    assert quota is not None and quota.requests_per_minute == 5  # the team's default for every user

    assert run(capsys, cfg, "update", "ana", "--models", "none", "--usd-per-day", "1")[0] == 0
    assert run(capsys, cfg, "revoke", "ana")[0] == 0
    registry.refresh()
    with pytest.raises(AuthError, match="revoked"):
        auth.authenticate(f"Bearer {key}")
    rc, out, _ = run(capsys, cfg, "list")
    assert rc == 0 and "ana" in out and "revoked" in out and key not in out
    rc, out, _ = run(capsys, cfg, "spend", "--team", "lab")
    assert rc == 0 and json.loads(out)["usd_today"] == 0.0
    rc, out, _ = run(capsys, cfg, "audit")
    audit = json.loads(out)
    assert [(a["action"], a["target"]) for a in reversed(audit)] == [
        ("key.import", "root"),
        ("team.create", "lab"),
        ("user.set", "lab/*"),
        ("key.create", "ana"),
        ("key.update", "ana"),
        ("key.revoke", "ana"),
    ]
    assert all(a["actor"].startswith("cli:") for a in audit[:-1]) and audit[-1]["actor"] == "config"
    assert key not in out and "sha256$" not in out
    registry.store.close()


def test_config_keys_are_imported_once_and_the_database_rules_after(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ledger = str(tmp_path / "l.sqlite3")
    cfg, raw = control_config(tmp_path, UPSTREAM, ledger=ledger, keys={"legacy": {"usd_per_day": 5.0}})
    auth, registry = authenticator(cfg)
    assert registry.snapshot.keys["legacy"].limits.usd_per_day == 5.0
    registry.store.close()
    # the config changes the key's budget and the key is revoked in the database: neither the
    # edit nor a restart brings the config's version back
    cfg.write_text(cfg.read_text().replace("usd_per_day = 5.0", "usd_per_day = 9.0"))
    assert run(capsys, cfg, "revoke", "legacy")[0] == 0
    auth, registry = authenticator(cfg)
    assert registry.snapshot.keys["legacy"].limits.usd_per_day == 5.0
    with pytest.raises(AuthError, match="revoked"):
        auth.authenticate(f"Bearer {raw['legacy']}")
    assert auth.authenticate(f"Bearer {raw['root']}").roles == frozenset({"admin"})
    imports = [a for a in registry.store.audit() if a["action"] == "key.import"]
    assert sorted(a["target"] for a in imports) == ["legacy", "root"]
    registry.store.close()


def test_serve_accepts_keys_that_live_only_in_the_database(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg, _ = control_config(tmp_path, UPSTREAM, ledger=str(tmp_path / "l.sqlite3"))
    bare = tmp_path / "bare.toml"  # the same ledger and tiers, no [[server.api_keys]]
    text = cfg.read_text()
    bare.write_text(text[: text.index("[[server.api_keys]]")] + text[text.index("[ledger]") :])
    settings = load_settings(bare)
    with pytest.raises(ConfigError, match="server.api_keys is empty"):
        check_bind(settings.server, stored_keys=_stored_keys(settings))
    rc, out, _ = run(capsys, bare, "create", "ops", "--admin")
    assert rc == 0 and "roles admin" in out
    check_bind(settings.server, stored_keys=_stored_keys(settings))  # no refusal now


def test_an_expiry_or_a_limit_the_database_cannot_hold_is_refused_in_words(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # `--expires-in-days nan` was stored as NULL (a key that never expires, the opposite of what
    # was asked) and `inf` as an expiry no JSON can carry; `--rpm 1e20` ended in a traceback
    cfg, _ = control_config(tmp_path, UPSTREAM, ledger=str(tmp_path / "l.sqlite3"))
    for args, said in (
        (("--expires-in-days", "nan"), "--expires-in-days is a number of days"),
        (("--expires-in-days", "inf"), "--expires-in-days is too large"),  # not "got inf"
        (("--rpm", str(10**20)), "requests_per_minute"),
        (("--tpm", str(2**31)), "tokens_per_minute"),
    ):
        rc, _, err = run(capsys, cfg, "create", "k", *args)
        assert rc == 1 and err.startswith("error: ") and said in err and "Traceback" not in err, (args, err)
    assert run(capsys, cfg, "create", "k", "--expires-in-days", "1", "--rpm", str(2**31 - 1))[0] == 0


def test_every_change_the_admin_api_makes_the_cli_makes_too(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # roles, tests and expiry of a key, a user's limits removed, the teams listed: the operations
    # PATCH /admin/keys/{name}, DELETE /admin/teams/{team}/users/{user} and GET /admin/teams do
    cfg, _ = control_config(tmp_path, UPSTREAM, ledger=str(tmp_path / "l.sqlite3"))
    assert run(capsys, cfg, "team", "create", "lab", "--usd-per-day", "2")[0] == 0
    assert run(capsys, cfg, "team", "create", "ops")[0] == 0
    rc, out, _ = run(capsys, cfg, "team", "list")
    assert rc == 0 and [(t["name"], t["usd_per_day"]) for t in json.loads(out)] == [("lab", 2.0), ("ops", None)]
    rc, out, _ = run(capsys, cfg, "create", "ana")
    key = KEY_RE.findall(out)[0]

    before = time.time()
    rc, out, err = run(capsys, cfg, "update", "ana", "--roles", "client,metrics", "--allow-tests", "--expires-in-days", "2")  # fmt: skip
    assert rc == 0, err
    shown = json.loads(out)
    assert shown["roles"] == ["client", "metrics"] and shown["allow_tests"] is True
    assert before + 2 * 86400 <= shown["expires_at"] <= time.time() + 2 * 86400
    auth, registry = authenticator(cfg)
    who = auth.authenticate(f"Bearer {key}")
    assert who.roles == frozenset({"client", "metrics"}) and who.may_send_tests
    registry.store.close()
    rc, out, _ = run(capsys, cfg, "update", "ana", "--no-allow-tests", "--expires-in-days", "none", "--roles", "client")
    assert rc == 0
    shown = json.loads(out)
    assert (shown["roles"], shown["allow_tests"], shown["expires_at"]) == (["client"], False, None)
    # refused as the admin API refuses: in words, nothing changed
    for args, said in (
        (("--roles", "root"), "root"),
        (("--expires-in-days", "-1"), "in the past"),
        (("--expires-in-days", "soon"), "--expires-in-days"),
        # the attack review's findings: a count of days whose unix time is infinite was refused as
        # "got inf", and no flag at all wrote an empty `key.update {}` audit row (the list below)
        (("--expires-in-days", "1e306"), "too large"),
        (("--expires-in-days", "inf"), "too large"),
        (("--expires-in-days", "nan"), "a number of days"),
        (("--expires-in-days=-inf",), "in the past"),
        ((), "nothing to change"),
    ):
        rc, _, err = run(capsys, cfg, "update", "ana", *args)
        assert rc == 1 and err.startswith("error: ") and said in err and "Traceback" not in err, (args, err)
        assert "got inf" not in err
    rc, _, err = run(capsys, cfg, "create", "eve", "--expires-in-days", "1e306")
    assert rc == 1 and "too large" in err and "got inf" not in err

    assert run(capsys, cfg, "user", "lab", "bob", "--requests-per-minute", "5")[0] == 0
    rc, _, err = run(capsys, cfg, "user", "lab", "bob", "--delete", "--usd-per-day", "1")
    assert rc == 1 and "takes no limits" in err
    rc, out, _ = run(capsys, cfg, "user", "lab", "bob", "--delete")
    assert rc == 0  # and says what it removed, as set
    assert json.loads(out)["removed"] == {
        "team": "lab",
        "user": "bob",
        "usd_per_day": None,
        "usd_per_month": None,
        "requests_per_minute": 5,
        "tokens_per_minute": None,
    }
    rc, _, err = run(capsys, cfg, "user", "lab", "bob", "--delete")
    assert rc == 1 and "has no limits for user 'bob'" in err  # the admin API's 404, in words
    auth, registry = authenticator(cfg)
    assert ("lab", "bob") not in registry.snapshot.users
    registry.store.close()

    rc, out, _ = run(capsys, cfg, "audit")
    actions = [(a["action"], a["target"]) for a in reversed(json.loads(out)) if a["actor"].startswith("cli:")]
    assert actions == [
        ("team.create", "lab"),
        ("team.create", "ops"),
        ("key.create", "ana"),
        ("key.update", "ana"),
        ("key.update", "ana"),
        ("user.set", "lab/bob"),
        ("user.delete", "lab/bob"),
    ]
    assert key not in out


def test_keys_create_help_says_where_the_key_goes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["keys", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "stored (its hash) in the ledger's database" in said and "config lines holding its hash" not in said
