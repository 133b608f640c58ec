"""`tierroute report costs`: cost, tokens, escalation, latency and savings from the live ledger;
`tierroute report quality`: live acceptance, shadow agreement, labelled accuracy and drift alarms per tier."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router.config import LedgerSettings, Settings


def _window(args: argparse.Namespace) -> tuple[float | None, float | None] | None:
    """--since and --until as times; None (after saying why) when one does not parse."""
    from router.reports import costs as reports

    try:
        return (
            reports.parse_time(args.since) if args.since else None,
            reports.parse_time(args.until) if args.until else None,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def cmd_report_costs(args: argparse.Namespace) -> int:
    from router.ledger.stores import open_store
    from router.reports import costs as reports

    span = _window(args)
    if span is None:
        return 2
    since, until = span
    ledger_path, prices, ledger_settings = _ledger_and_prices(args)
    store = open_store(ledger_path, read_only=True, settings=ledger_settings)
    store.open()
    try:
        entries = list(store.entries(since, until))
    finally:
        store.close()
    rows, total = reports.aggregate(entries, args.by)
    window = _window_text(since, until)

    if args.format == "csv":
        text = reports.to_csv(rows, total, args.by)
    elif args.format == "html":
        text = reports.to_html(
            rows,
            total,
            args.by,
            entries,
            title=f"tierroute cost report: {_shown(ledger_path)}",
            window=window,
            prices=prices,
        )
    else:
        _print_table(rows, total, args.by, window, prices, ledger_path)
        return 0
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_report_quality(args: argparse.Namespace) -> int:
    from router.ledger.stores import open_store
    from router.reports import quality as quality_report

    span = _window(args)
    if span is None:
        return 2
    since, until = span
    settings, ledger_path = _settings_and_ledger(args)
    store = open_store(ledger_path, read_only=True, settings=settings.ledger if settings is not None else None)
    store.open()
    try:
        entries = list(store.entries(since, until))
        pairs = list(store.pairs(since, until))
        # a label comes after its request: those of the window's requests are at or after `since`
        labels = list(store.feedback(since))
    finally:
        store.close()
    quality = quality_report.build(entries, pairs, settings, labels)
    window = _window_text(since, until)
    if args.html:
        last = settings.tiers[-1].name if settings is not None else None
        page = quality_report.to_html(
            quality, title=f"tierroute quality: {_shown(ledger_path)}", window=window, last=last
        )
        Path(args.html).write_text(page, encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr)
    if args.csv:
        sys.stdout.write(quality_report.to_csv(quality))
        return 0
    if args.html:
        return 0
    from rich.console import Console
    from rich.table import Table

    header, body = quality_report.table(quality)
    table = Table(*header, title=f"quality by tier, task and threshold, {window}", caption=str(ledger_path))
    for col in table.columns[3:]:
        col.justify = "right"
    for cells in body:
        table.add_row(*cells)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    console.print(table)
    console.print("est. accuracy: agreement with the larger tier, as a proxy for correctness; intervals: 95% Wilson")
    console.print(
        f"label accuracy: the share of labelled answers (POST /v1/feedback) whose latest label says right; "
        f"{quality.labels} labels"
        + (f", {quality.unplaced} labelled requests passed no threshold (in no row)" if quality.unplaced else "")
    )
    lines = quality_report.alarm_lines(quality)
    console.print("drift alarms:" if lines else "drift alarms: none")
    for line in lines:
        console.print(f"  {line}")
    return 0


def _shown(location: str) -> str:
    """A ledger's name in a title: the file's name, or the PostgreSQL URL (it carries no password)."""
    return location if "://" in location else Path(location).name


def _settings_and_ledger(args: argparse.Namespace) -> tuple[Settings | None, str]:
    """The config (None when it cannot be read and --ledger names the ledger anyway) and the
    ledger to read: --ledger, else the config's."""
    from router.config import load_settings
    from router.errors import TierrouteError

    try:
        settings = load_settings(args.config)
    except TierrouteError:
        if not args.ledger:
            raise
        return None, args.ledger
    return settings, args.ledger or settings.ledger.location


def _ledger_and_prices(args: argparse.Namespace) -> tuple[str, list[tuple[str, str]], LedgerSettings | None]:
    """The ledger to read (--ledger, else the config's) and the config's price sheet, if any."""
    from router.policy import describe

    settings, location = _settings_and_ledger(args)
    prices = [(t.name, describe(t.price)) for t in settings.tiers] if settings is not None else []
    return location, prices, settings.ledger if settings is not None else None


def _window_text(since: float | None, until: float | None) -> str:
    def fmt(ts: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))

    if since is None and until is None:
        return "all time"
    return f"from {fmt(since) if since is not None else 'the start'} to {fmt(until) if until is not None else 'now'}"


def _print_table(rows: Any, total: Any, by: str, window: str, prices: list[tuple[str, str]], path: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from router.reports import costs as reports

    header, body = reports.table_rows(rows, total, by)  # type: ignore[arg-type]
    table = Table(*header, title=f"costs by {by}, {window}", caption=str(path))
    for col in table.columns[1:]:
        col.justify = "right"
    for i, cells in enumerate(body):
        table.add_row(*cells, style="bold" if i == len(body) - 1 else None, end_section=i == len(body) - 2)
    # piped output keeps every column whole; a terminal gets rich's fit-to-width
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    console.print(table)
    for tier, price in prices:
        console.print(f"  {tier}: {price}")


def register(sub: Any, add: Any) -> None:
    report = sub.add_parser("report", help="reports from the ledger of served requests")
    rsub = report.add_subparsers(dest="report_command", metavar="REPORT", required=True)
    p = add(
        "costs",
        "cost, requests, tokens, escalation rate, latency p50/p95 and savings against the top tier",
        cmd_report_costs,
        rsub,
    )
    p.add_argument("--since", default=None, help="ISO date/datetime (UTC), 'today', or a span ago like 24h, 7d")
    p.add_argument("--until", default=None, help="end of the window, exclusive; same forms as --since")
    p.add_argument("--by", choices=("tier", "key", "day", "model", "deployment", "task"), default="tier")
    p.add_argument("--format", choices=("table", "csv", "html"), default="table")
    p.add_argument("--ledger", default=None, help="ledger file or postgresql:// URL (default: the config's ledger)")
    p.add_argument("--output", "-o", default=None, help="write csv/html here instead of stdout")
    q = add(
        "quality",
        "per tier, task and threshold: acceptance, shadow agreement and the accuracy clients' labels give "
        "(POST /v1/feedback), each with its Wilson interval and counts, and drift alarms",
        cmd_report_quality,
        rsub,
    )
    q.add_argument("--since", default=None, help="ISO date/datetime (UTC), 'today', or a span ago like 24h, 7d")
    q.add_argument("--until", default=None, help="end of the window, exclusive; same forms as --since")
    q.add_argument("--csv", action="store_true", help="print CSV instead of the table")
    q.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML page with plots")
    q.add_argument("--ledger", default=None, help="ledger file or postgresql:// URL (default: the config's ledger)")
