"""What a bench run prints and writes: the JSON report's header, the tables, progress lines.

Tables go to stdout and progress to stderr, so `> table.txt` keeps only the tables; the JSON
holds every number, the tables only the ones a reader compares.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from router.bench.workload import Level, Workload


def report_header(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    options = {k: v_ for k, v_ in vars(args).items() if k not in ("handler", "targets")}
    return {
        "tool": f"tierroute bench {mode}",
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "options": options,
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "tierroute": v("tierroute"),
            "openai": v("openai"),
            "llama_cpp_python": v("llama_cpp_python"),
        },
    }


def print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def write_json(path: str | None, report: dict[str, Any], *, quiet: bool = False) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2) + "\n")
        if not quiet:
            print_progress(f"wrote {path}")


def make_console() -> Any:
    from rich.console import Console

    console = Console(highlight=False)
    # redirected to a file, the tables keep one line per row instead of rich's default 80 columns
    return console if console.is_terminal else Console(highlight=False, width=160)


def fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def triple(d: dict[str, Any]) -> str:
    return " / ".join(fmt(d[k], 0) for k in ("p50", "p95", "p99"))


def print_sweep(report: dict[str, Any], workload: Workload) -> None:
    """Every target's levels, then the first target against the others."""
    from rich.table import Table

    table = Table(
        "target",
        "level",
        "ok",
        "503",
        "err",
        "out tok/s",
        "req/s",
        "TTFT ms p50/p95/p99",
        "latency ms p50/p95/p99",
        "peak RSS MiB",
        title=f"tierroute bench sweep: {workload.api}, max_tokens {workload.max_tokens}"
        + (f", response_format {workload.response_format['type']}" if workload.response_format else ""),
    )
    for t in report["targets"]:
        for row in t.get("levels", []):
            level = Level("concurrency" if "concurrency" in row else "rate", row.get("concurrency", row.get("rate")))
            memory = row["memory"] or {}
            table.add_row(
                t["label"],
                level.name,
                str(row["ok"]),
                str(row["refused_503"]),
                str(sum(row["errors"].values())),
                fmt(row["output_tok_s"]),
                fmt(row["requests_s"], 2),
                triple(row["ttft_ms"]),
                triple(row["latency_ms"]),
                fmt(memory.get("peak_rss_mib")),
            )
    console = make_console()
    console.print(table)
    if report["comparison"]:
        ratios = Table("level", "of / to", "tok/s ratio", "TTFT p95 ratio", "latency p95 ratio", title="relative")
        for c in report["comparison"]:
            key = "concurrency" if "concurrency" in c else "rate"
            ratios.add_row(
                Level(key, c[key]).name,
                f"{c['of']} / {c['to']}",
                fmt(c["output_tok_s_ratio"], 2),
                fmt(c["ttft_p95_ratio"], 2),
                fmt(c["latency_p95_ratio"], 2),
            )
        console.print(ratios)


def print_burst(result: dict[str, Any], *, title: str) -> None:
    """Round by round, then the verdict."""
    from rich.table import Table

    table = Table(
        "round",
        "requests",
        "answered",
        "refused 503",
        "other errors",
        "latency ms p50/p95/p99",
        "RSS MiB before",
        "after",
        "settled",
        title=title,
    )
    for row in result["rounds"]:
        table.add_row(
            str(row["round"]),
            str(row["requests"]),
            str(row["ok"]),
            str(row["refused_503"]),
            ", ".join(f"{k}: {v}" for k, v in row["errors"].items()) or "0",
            triple(row["latency_ms"]),
            fmt(row["rss_before_mib"]),
            fmt(row["rss_after_mib"]),
            fmt(row["rss_settled_mib"]),
        )
    console = make_console()
    console.print(table)
    verdict = result["verdict"]
    console.print(
        f"still answering: {'yes' if verdict['alive_after'] else 'NO'}; every request answered or 503: "
        f"{'yes' if verdict['every_request_answered_or_503'] else 'NO'}; RSS growth first -> last round: "
        f"{fmt(verdict['rss_growth_first_to_last_round_mib'])} MiB"
    )


def print_overhead(result: dict[str, Any], *, title: str) -> None:
    """The client's latency, the app's own time and the client's lag, beside the HTTP floor."""
    from rich.table import Table

    table = Table(
        "measure",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        title=title,
    )
    rows = [
        ("client latency", result["client_ms"]),
        ("app time (Server-Timing)", result["server_ms"]),
        ("client send lag", result["schedule_lag_ms"]),
    ]
    if result["floor"] is not None:
        rows.append(("floor: GET /healthz, client", result["floor"]["client_ms"]))
    for name, d in rows:
        table.add_row(name, fmt(d["p50"], 2), fmt(d["p95"], 2), fmt(d["p99"], 2), fmt(d["max"], 2))
    console = make_console()
    console.print(table)
    memory = result["memory"] or {}
    console.print(
        f"ok {result['ok']}/{result['requests']}, errors {result['errors'] or 0}, answered by {result['tiers']}, "
        f"verifiers {result['verifiers']}, peak RSS {fmt(memory.get('peak_rss_mib'))} MiB, "
        f"server CPU {fmt(result.get('server_cpu_ms_per_request'), 2)} ms/request"
        + (f", cache {result['cache']}" if result.get("cache") else "")
    )


def print_spec(report: dict[str, Any], workload: Workload) -> None:
    """Every variant's levels with its draft acceptance, the skipped ones and why, then the ratios."""
    from rich.table import Table

    pair = report["pair"]
    table = Table(
        "variant",
        "level",
        "ok",
        "err",
        "out tok/s",
        "TTFT ms p50/p95/p99",
        "latency ms p50/p95/p99",
        "drafted",
        "accepted",
        title=f"tierroute bench spec: {workload.api}, max_tokens {workload.max_tokens}, tier {pair['tier']}, "
        f"draft_max {pair['draft_max']}, {pair['n_threads']} threads",
    )
    skipped: list[str] = []
    for t in report["targets"]:
        if "skipped" in t:
            skipped.append(f"{t['label']}: skipped, {t['skipped']}")
            continue
        if "error" in t:
            skipped.append(f"{t['label']}: failed, {t['error']}")
            continue
        for row in t["levels"]:
            total = (row.get("drafts") or {}).get("total")
            table.add_row(
                t["label"],
                Level("concurrency", row["concurrency"]).name,
                str(row["ok"]),
                str(sum(row["errors"].values())),
                fmt(row["output_tok_s"]),
                triple(row["ttft_ms"]),
                triple(row["latency_ms"]),
                "-" if total is None else str(total["drafted"]),
                "-" if total is None or total["acceptance"] is None else f"{total['acceptance']:.1%}",
            )
    console = make_console()
    console.print(table)
    for line in skipped:
        console.print(line)
    if report["comparison"]:
        ratios = Table("level", "of / to", "tok/s ratio", "latency p50 ratio", title="relative")
        for c in report["comparison"]:
            ratios.add_row(
                Level("concurrency", c["concurrency"]).name,
                f"{c['of']} / {c['to']}",
                fmt(c["output_tok_s_ratio"], 2),
                fmt(c["latency_p50_ratio"], 2),
            )
        console.print(ratios)
