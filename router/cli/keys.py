"""`tierroute keys create|list`: make API keys and show the configured ones.

The key is printed once and never stored: the config holds only its salted hash, and the ledger,
logs and metrics know a key by its name.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


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


def cmd_keys_create(args: argparse.Namespace) -> int:
    from router.admission.auth import hash_key, new_key

    if not _NAME.match(args.name):
        print("error: a key name is 1-64 characters of letters, digits and _.@-", file=sys.stderr)
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
    p = add("create", "make a new API key: print it once, and the config lines holding its hash", cmd_keys_create, ksub)
    p.add_argument("name", help="the key's name: what the ledger, logs and metrics call it")
    p.add_argument("--usd-per-day", type=float, default=None, help="daily budget in USD (UTC days)")
    p.add_argument("--usd-per-month", type=float, default=None, help="monthly budget in USD (UTC months)")
    p.add_argument("--rpm", type=int, default=None, help="request rate limit, requests per minute")
    p.add_argument(
        "--allow-tests",
        action="store_true",
        help="let this key send tierroute.tests (Python the code_tests verifier runs on this host, sandboxed)",
    )
    add("list", "list configured keys (names and limits, never keys)", cmd_keys_list, ksub)
