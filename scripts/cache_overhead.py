"""The response cache's overhead benchmark (docs/benchmarks.md, issue 29): cache hits against the
same config without the cache, in alternating pairs, on the SQLite ledger or on PostgreSQL.

    PYTHONPATH=. .venv/bin/python scripts/cache_overhead.py --out docs/bench/cache-quiet
    PYTHONPATH=. .venv/bin/python scripts/cache_overhead.py --ledger postgresql --out docs/bench/cache-pg

Each pair runs `tierroute bench overhead` (instant backends, open loop) twice, with the cache
(`bench/cache-overhead.toml`: its warm-up stores every prompt's answer, so every timed request is a
hit) and then without it (`bench/no-shadow-overhead.toml`, the same config less `[cache]`), so the
machine's load falls on both alike. Written to `--out`: `ov-cache-<i>.json` and
`ov-nocache-<i>.json` (every number), the printed tables beside them as `.txt`, and `load.txt`,
the load average as each pair began (`pair <i> load <1 min> <5 min> <15 min>`). These are the
commands that made `docs/bench/cache-quiet/` (SQLite, four pairs).

With `--ledger postgresql` a throwaway PostgreSQL server is started (the test suite's: Debian's
binaries, `initdb` in a temporary directory, fsync off, on loopback) and each run gets a fresh
database, passed to `bench overhead --ledger-url`: the ledger and the cache are then where replicas
would share them. Prints each run's app time p50 and hits as it goes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {"cache": "bench/cache-overhead.toml", "nocache": "bench/no-shadow-overhead.toml"}


@contextlib.contextmanager
def databases(ledger: str) -> Iterator[Callable[[], str | None]]:
    """A function giving each run its ledger URL (None: the bench's scratch SQLite file)."""
    if ledger == "sqlite":
        yield lambda: None
        return
    from tests.support.pg import PostgresServer

    server = PostgresServer()
    try:
        yield server.create_database
    finally:
        server.stop()


def run(kind: str, i: int, args: argparse.Namespace, ledger_url: str | None) -> dict[str, Any]:
    out = Path(args.out)
    tierroute = Path(sys.executable).with_name("tierroute")
    command = [str(tierroute), "bench", "overhead", "--config", CONFIGS[kind], "--rate", f"{args.rate:g}"]
    command += ["--seconds", f"{args.seconds:g}", "--json", str(out / f"ov-{kind}-{i}.json")]
    if ledger_url:
        command += ["--ledger-url", ledger_url]
    with (out / f"ov-{kind}-{i}.txt").open("w") as printed:
        subprocess.run(command, cwd=ROOT, stdout=printed, stderr=subprocess.STDOUT, check=True)
    report: dict[str, Any] = json.loads((out / f"ov-{kind}-{i}.json").read_text())
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--ledger", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--out", required=True, help="folder for the results (created)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with databases(args.ledger) as fresh, (out / "load.txt").open("w") as loads:  # this run's pairs only
        for i in range(1, args.pairs + 1):
            one, five, fifteen = os.getloadavg()
            loads.write(f"pair {i} load {one:.2f} {five:.2f} {fifteen:.2f}\n")
            loads.flush()
            for kind in CONFIGS:
                report = run(kind, i, args, fresh())
                app = report["server_ms"]["p50"]
                print(f"pair {i} {kind:8} app time p50 {app} ms  cache {report.get('cache')}  {report['ledger']}")


if __name__ == "__main__":
    main()
