"""`tierroute keys ...`: API keys, teams and end users' limits, from the command line.

With a config whose ledger is enabled, every command works on the ledger's database through the
same operations as the admin API (`router.control.admin.ControlPlane`), audited as `cli:USER`;
the config's `[[server.api_keys]]` are imported first, once, as `serve` does. Without `--config`
(or with `--print-config`), `keys create` prints a `[[server.api_keys]]` block to paste instead.

A key is printed once and never stored: the database (or the config) holds only its SHA-256
(`sha256$...`), and the ledger, logs and metrics know a key by its name. Every admin API operation
that changes something has its command (`keys update` takes roles, tests and expiry as `PATCH
/admin/keys/{name}` does; `keys user --delete` is `DELETE /admin/teams/{team}/users/{user}`; `keys
team list` is `GET /admin/teams`), so an operator without an admin key loses nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any


def toml_entry(
    name: str,
    key_hash: str,
    *,
    usd_per_day: float | None = None,
    usd_per_month: float | None = None,
    requests_per_minute: int | None = None,
    allow_tests: bool = False,
) -> str:
    """The `[[server.api_keys]]` block to paste into config.toml."""
    lines = ["[[server.api_keys]]", f"name = {json.dumps(name)}", f"hash = {json.dumps(key_hash)}"]
    if usd_per_day is not None:
        lines.append(f"usd_per_day = {usd_per_day!r}")
    if usd_per_month is not None:
        lines.append(f"usd_per_month = {usd_per_month!r}")
    if requests_per_minute is not None:
        lines.append(f"requests_per_minute = {requests_per_minute}")
    if allow_tests:
        lines.append("allow_tests = true  # may send tierroute.tests: code run on this host, in the sandbox")
    return "\n".join(lines) + "\n"


def _plane(args: argparse.Namespace) -> Any:
    """The control plane of the config's ledger database (config keys imported), or None when
    there is no config or its ledger is off."""
    if getattr(args, "config", None) is None:
        return None
    from router.config import load_settings
    from router.control.admin import ControlPlane
    from router.control.store import ControlStore

    settings = load_settings(args.config)
    if not settings.ledger.enabled:
        return None
    store = ControlStore(settings.ledger.location, settings.ledger)
    store.open()
    plane = ControlPlane(store, models=["auto", *(t.name for t in settings.tiers)])
    plane.import_config(settings.server.api_keys)
    return plane


def _actor() -> str:
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli:unknown"


def _limits(args: argparse.Namespace) -> Any:
    from router.control.records import Limits

    return Limits(args.usd_per_day, args.usd_per_month, args.rpm, args.tpm)


def _run(work: Any) -> int:
    """Run a control-plane call; its refusal is one line on stderr and exit status 1."""
    from router.errors import TierrouteError

    try:
        work()
    except TierrouteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    from router.admission.auth import hash_key, new_key

    plane = None if args.print_config else _plane(args)
    if plane is not None:
        client = args.client or not (args.admin or args.metrics or args.report)
        roles = [
            r
            for r, on in (("admin", args.admin), ("client", client), ("metrics", args.metrics), ("report", args.report))
            if on
        ]
        models = args.models.split(",") if args.models else None
        try:
            expires = _expiry(args.expires_in_days) if args.expires_in_days else None
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1

        def create() -> None:
            key, found = plane.create_key(
                _actor(),
                args.name,
                roles=roles,
                team=args.team,
                limits=_limits(args),
                models=models,
                allow_tests=args.allow_tests,
                expires_at=expires,
            )
            print(f"API key for '{args.name}' (shown once, store it now):\n\n    {key}\n")
            print(f"Stored in the ledger's database (roles {', '.join(found.roles)}); every replica serves it")
            print("within server.keys_poll_s, without a restart.")

        try:
            return _run(create)
        finally:
            plane.store.close()
    if args.team or args.models or args.admin or args.metrics or args.report or args.tpm or args.expires_in_days:
        print(
            "error: --team, --models, --admin, --metrics, --report, --tpm and --expires-in-days need a ledger database "
            "(--config)",
            file=sys.stderr,
        )
        return 1
    from router.control.records import ControlError, check_name

    try:
        check_name("key", args.name)  # the pattern and the reserved names, as the admin API's
    except ControlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    existing = _configured_names(args)
    if args.name in existing:
        print(f"error: the config already has a key named '{args.name}'", file=sys.stderr)
        return 1
    for flag, value in (("--usd-per-day", args.usd_per_day), ("--usd-per-month", args.usd_per_month)):
        if value is not None and value < 0:
            print(f"error: {flag} must be >= 0", file=sys.stderr)
            return 1
    if args.rpm is not None and args.rpm < 1:
        print("error: --rpm must be >= 1", file=sys.stderr)
        return 1
    key = new_key()
    block = toml_entry(
        args.name,
        hash_key(key),
        usd_per_day=args.usd_per_day,
        usd_per_month=args.usd_per_month,
        requests_per_minute=args.rpm,
        allow_tests=args.allow_tests,
    )
    out = sys.stdout
    print(f"API key for '{args.name}' (shown once, store it now):\n", file=out)
    print(f"    {key}\n", file=out)
    print("Add this to config.toml and restart `tierroute serve`:\n", file=out)
    print(block, file=out, end="")
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from router.config import load_settings

    plane = _plane(args)
    if plane is not None:
        try:
            snapshot = plane.store.snapshot()
        finally:
            plane.store.close()
        found = Table("name", "roles", "team", "limits", "models", "tests", "state")
        now = time.time()
        for k in sorted(snapshot.keys.values(), key=lambda k: k.name):
            state = "revoked" if k.revoked_at else ("expired" if not k.live(now) else "live")
            found.add_row(
                k.name,
                ",".join(k.roles),
                k.team or "-",
                _limits_text(k.limits),
                ",".join(k.models) if k.models else "all",
                "allowed" if k.allow_tests else "-",
                state,
            )
        Console(highlight=False).print(found)
        return 0
    settings = load_settings(args.config)
    table = Table("name", "usd/day", "usd/month", "requests/min", "tests")
    for k in settings.server.api_keys:
        table.add_row(
            k.name,
            _opt(k.usd_per_day),
            _opt(k.usd_per_month),
            _opt(k.requests_per_minute),
            "allowed" if k.allow_tests else "-",
        )
    console = Console(highlight=False)
    if not settings.server.api_keys:
        server = settings.server
        state = "open (allow_unauthenticated)" if server.allow_unauthenticated else "refused: no keys"
        if server.allow_unauthenticated and server.allow_client_tests_without_keys:
            state += ", and any client may send tests (allow_client_tests_without_keys)"
        console.print(f"no API keys configured; serving is {state}")
        return 0
    console.print(table)
    return 0


def _with_plane(args: argparse.Namespace, work: Any) -> int:
    plane = _plane(args)
    if plane is None:
        print(
            "error: this needs a config whose ledger is enabled (--config): keys live in its database", file=sys.stderr
        )
        return 1
    try:
        return _run(lambda: work(plane))
    finally:
        plane.store.close()


def _show(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    return _with_plane(args, lambda p: _show(p.revoke_key(_actor(), args.name).public()))


def _changes(args: argparse.Namespace, fields: tuple[str, ...]) -> dict[str, Any]:
    """The fields given on the command line; 'none' clears one."""
    out: dict[str, Any] = {}
    for name in fields:
        value = getattr(args, name, None)
        if value is None:
            continue
        if value == "none":
            out[name] = None
        elif name in ("models", "roles"):
            out[name] = value.split(",")
        elif name in ("requests_per_minute", "tokens_per_minute"):
            out[name] = int(value)
        elif name.startswith("usd"):
            out[name] = float(value)
        else:
            out[name] = value
    return out


_LIMIT_ARGS = ("usd_per_day", "usd_per_month", "requests_per_minute", "tokens_per_minute")


def cmd_keys_update(args: argparse.Namespace) -> int:
    changes = _changes(args, (*_LIMIT_ARGS, "team", "models", "roles"))
    if args.allow_tests is not None:
        changes["allow_tests"] = args.allow_tests
    if args.expires_in_days is not None:
        try:
            changes["expires_at"] = _expiry(args.expires_in_days)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if not changes:  # else an empty `key.update {}` audit row records a change that was never made
        print(
            "error: nothing to change: give a limit, --team, --models, --roles, --allow-tests or --expires-in-days",
            file=sys.stderr,
        )
        return 1
    return _with_plane(args, lambda p: _show(p.update_key(_actor(), args.name, changes).public()))


# Ten thousand years: past it a count of days is a typo, and far past it the unix time is infinite
# (`1e306` days), which the control plane could only refuse as "got inf".
def _expiry(days: str) -> float | None:
    """The unix time `days` from now ('none': never); the control plane refuses one not ahead.
    ValueError, with the message to print, for a count that is not a number or is too large."""
    from router.control.admin import MAX_EXPIRY_DAYS

    if days == "none":
        return None
    try:
        count = float(days)
    except ValueError:
        raise ValueError("--expires-in-days is a number of days, or 'none' for never") from None
    if math.isnan(count):
        raise ValueError("--expires-in-days is a number of days, or 'none' for never")
    if count <= 0:
        raise ValueError(
            "--expires-in-days must be more than 0: that expiry is in the past (`keys revoke` refuses a key now)"
        )
    if count > MAX_EXPIRY_DAYS:
        raise ValueError(f"--expires-in-days is too large (at most {MAX_EXPIRY_DAYS}, ten thousand years)")
    return time.time() + count * 86400


def cmd_keys_spend(args: argparse.Namespace) -> int:
    return _with_plane(args, lambda p: _show(p.spend(key=args.key, team=args.team, user=args.user)))


def cmd_keys_team(args: argparse.Namespace) -> int:
    changes = _changes(args, _LIMIT_ARGS)
    if args.action == "list":
        if args.name is not None or changes:
            print("error: keys team list takes no name and no limits", file=sys.stderr)
            return 1
        return _with_plane(args, lambda p: _show([t.public() for t in p.teams()]))
    if args.name is None:
        print(f"error: keys team {args.action} needs the team's name", file=sys.stderr)
        return 1
    if args.action == "create":
        return _with_plane(args, lambda p: _show(p.create_team(_actor(), args.name, _limits_of(changes)).public()))
    return _with_plane(args, lambda p: _show(p.update_team(_actor(), args.name, changes).public()))


def cmd_keys_user(args: argparse.Namespace) -> int:
    changes = _changes(args, _LIMIT_ARGS)
    if args.delete:
        if changes:
            print("error: --delete removes the user's limits; it takes no limits", file=sys.stderr)
            return 1
        return _with_plane(
            args, lambda p: _show({"removed": p.delete_user_limits(_actor(), args.team, args.user).public()})
        )
    return _with_plane(
        args, lambda p: _show(p.set_user_limits(_actor(), args.team, args.user, _limits_of(changes)).public())
    )


def cmd_keys_audit(args: argparse.Namespace) -> int:
    """One page of the audit log (newest first), with the command for the next on stderr; or,
    with --all, every row, read a page at a time."""
    from router.control.store import AUDIT_PAGE_MAX

    if not 1 <= args.limit <= AUDIT_PAGE_MAX:
        print(f"error: --limit is 1 to {AUDIT_PAGE_MAX} rows a page", file=sys.stderr)
        return 1

    def show(plane: Any) -> None:
        page = plane.store.audit_page(args.since, args.limit, args.cursor)
        rows = list(page.rows)
        while args.all and page.next_cursor is not None:
            page = plane.store.audit_page(args.since, args.limit, page.next_cursor)
            rows += page.rows
        _show(rows)
        if page.next_cursor is not None:
            print(f"more rows: rerun with --cursor {page.next_cursor} (or --all for every row)", file=sys.stderr)

    return _with_plane(args, show)


def _limits_of(changes: dict[str, Any]) -> Any:
    from router.control.records import Limits

    return Limits(**changes)


def _limits_text(limits: Any) -> str:
    parts = [
        f"{prefix}{value:g}{unit}"
        for prefix, value, unit in (
            ("$", limits.usd_per_day, "/day"),
            ("$", limits.usd_per_month, "/month"),
            ("", limits.requests_per_minute, " rpm"),
            ("", limits.tokens_per_minute, " tpm"),
        )
        if value is not None
    ]
    return " ".join(parts) or "-"


def _opt(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


def _configured_names(args: argparse.Namespace) -> set[str]:
    """Names in the config, when one was named and loads; creating a key never needs a config."""
    if getattr(args, "config", None) is None:
        return set()
    from router.config import load_settings
    from router.errors import TierrouteError

    try:
        return {k.name for k in load_settings(args.config).server.api_keys}
    except TierrouteError:
        return set()


def register(sub: Any, add: Any) -> None:
    keys = sub.add_parser("keys", help="create API keys and list the configured ones")
    ksub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    p = add(
        "create",
        "make a new API key, printed once: stored (its hash) in the ledger's database, or, without a ledger or "
        "with --print-config, as a [[server.api_keys]] block to paste",
        cmd_keys_create,
        ksub,
    )
    p.add_argument("name", help="the key's name: what the ledger, logs and metrics call it")
    p.add_argument("--usd-per-day", type=float, default=None, help="daily budget in USD (UTC days)")
    p.add_argument("--usd-per-month", type=float, default=None, help="monthly budget in USD (UTC months)")
    p.add_argument("--rpm", type=int, default=None, help="request rate limit, requests per minute")
    p.add_argument(
        "--allow-tests",
        action="store_true",
        help="let this key send tierroute.tests (Python the code_tests verifier runs on this host, sandboxed)",
    )
    p.add_argument("--tpm", type=int, default=None, help="token rate limit, input + output tokens per minute")
    p.add_argument("--team", default=None, help="the team it belongs to (its limits apply too)")
    p.add_argument("--models", default=None, help="comma-separated models it may use ('auto', tier names)")
    p.add_argument("--admin", action="store_true", help="an admin key: the admin API (not /v1 unless --client)")
    p.add_argument(
        "--client", action="store_true", help="with --admin, --metrics or --report: may send completions too"
    )
    p.add_argument(
        "--metrics", action="store_true", help="may read /metrics (every key's name and spend): a scraper's key"
    )
    p.add_argument(
        "--report", action="store_true", help="may read the dashboard under /ui/ (read-only costs and quality)"
    )
    p.add_argument("--expires-in-days", default=None, help="refused after this many days")
    p.add_argument(
        "--print-config", action="store_true", help="print a [[server.api_keys]] block instead of storing the key"
    )
    add("list", "list keys (names, roles, teams and limits, never keys)", cmd_keys_list, ksub)
    p = add("revoke", "revoke a key: refused at once here, within server.keys_poll_s everywhere", cmd_keys_revoke, ksub)
    p.add_argument("name")
    p = add(
        "update",
        "change a key's limits, team, models, roles, tests or expiry ('none' clears one)",
        cmd_keys_update,
        ksub,
    )
    p.add_argument("name")
    _limit_flags(p)
    p.add_argument("--team", default=None)
    p.add_argument("--models", default=None, help="comma-separated, or 'none' for every model")
    p.add_argument("--roles", default=None, help="comma-separated: client, admin, metrics (replaces its roles)")
    p.add_argument(
        "--allow-tests",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="may send tierroute.tests (--no-allow-tests takes it away)",
    )
    p.add_argument("--expires-in-days", default=None, help="refused after this many days from now; 'none': never")
    p = add("spend", "spend so far today and this month of a key, a team or a team's user", cmd_keys_spend, ksub)
    p.add_argument("--key", default=None)
    p.add_argument("--team", default=None)
    p.add_argument("--user", default=None)
    p = add("team", "create a team, update its limits, or list the teams", cmd_keys_team, ksub)
    p.add_argument("action", choices=("create", "update", "list"))
    p.add_argument("name", nargs="?", default=None)
    _limit_flags(p)
    p = add("user", "set an end user's limits within a team (user '*': every user's default)", cmd_keys_user, ksub)
    p.add_argument("team")
    p.add_argument("user")
    _limit_flags(p)
    p.add_argument("--delete", action="store_true", help="remove the user's limits (the team's default applies)")
    p = add("audit", "the audit log: every admin action, newest first, a page at a time", cmd_keys_audit, ksub)
    p.add_argument("--limit", type=int, default=1000, help="rows in this page (1-1000; default 1000)")
    p.add_argument("--cursor", default=None, help="where to go on: what the last page's 'more rows' line gave")
    p.add_argument("--since", type=float, default=None, help="only rows at or after this unix time")
    p.add_argument("--all", action="store_true", help="every row (from --cursor, if given), read a page at a time")


def _limit_flags(p: Any) -> None:
    for flag in ("usd-per-day", "usd-per-month", "requests-per-minute", "tokens-per-minute"):
        p.add_argument(f"--{flag}", default=None, help="a number, or 'none' for no limit")
