"""Where the test suite's time goes: a pytest plugin that writes each test's start, end, worker and
CPU, and a summary of those records (docs/testing.md quotes one).

    SUITE_TIMELINE=/tmp/timeline .venv/bin/python -m pytest -q -p no:cacheprovider -p scripts.suite_timeline \
        -n 2 --dist loadgroup
    .venv/bin/python scripts/suite_timeline.py /tmp/timeline

Each process (each xdist worker) appends JSON lines to its own file in $SUITE_TIMELINE; without
the variable the plugin records nothing. CPU is the test process's own (its threads, llama.cpp's
included); children (servers, sandboxes, PostgreSQL) are in the run's total, not here.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _cpu(who: int = resource.RUSAGE_SELF) -> float:
    used = resource.getrusage(who)
    return used.ru_utime + used.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    folder = os.environ.get("SUITE_TIMELINE")
    if not folder:
        yield
        return
    started, cpu, children = time.time(), _cpu(), _cpu(resource.RUSAGE_CHILDREN)
    yield
    row = {
        "id": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "start": started,
        "end": time.time(),
        "cpu": _cpu() - cpu,
        # the processes it started and waited for (servers, sandboxes, PostgreSQL): a module's
        # server stopped at its last test's teardown counts there, so read it by file
        "children_cpu": _cpu(resource.RUSAGE_CHILDREN) - children,
    }
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def summary(rows: list[dict[str, Any]], top: int = 15) -> str:
    """Per worker: tests, busy and CPU seconds, gaps over 2 s; then the files taking the most time."""
    first, last = min(r["start"] for r in rows), max(r["end"] for r in rows)
    lines = [f"{len(rows)} tests over {last - first:.0f} s"]
    by_worker: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        by_worker[r["worker"]].append(r)
    for worker, own in sorted(by_worker.items()):
        own.sort(key=lambda r: r["start"])
        gaps = [
            round(b["start"] - a["end"], 1) for a, b in zip(own, own[1:], strict=False) if b["start"] - a["end"] > 2
        ]
        busy = sum(r["end"] - r["start"] for r in own)
        cpu = sum(r["cpu"] for r in own)
        lines.append(
            f"{worker}: {len(own)} tests, {own[0]['start'] - first:.0f}-{own[-1]['end'] - first:.0f} s, "
            f"busy {busy:.0f} s, CPU {cpu:.0f} s, gaps over 2 s: {gaps or 'none'}"
        )
    wall: collections.Counter[str] = collections.Counter()
    cpu_of: collections.Counter[str] = collections.Counter()
    children_of: collections.Counter[str] = collections.Counter()
    for r in rows:
        name = r["id"].split("::")[0]
        wall[name] += r["end"] - r["start"]
        cpu_of[name] += r["cpu"]
        children_of[name] += r.get("children_cpu", 0.0)  # records before it was kept have none
    lines.append(
        f"busy {sum(wall.values()):.0f} s, CPU in the test processes {sum(cpu_of.values()):.0f} s, "
        f"in their children {sum(children_of.values()):.0f} s; by file:"
    )
    lines += [
        f"  {seconds:6.1f} s busy {cpu_of[name]:6.1f} s CPU {children_of[name]:6.1f} s children  {name}"
        for name, seconds in wall.most_common(top)
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="the $SUITE_TIMELINE folder of a run")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args()
    rows = [json.loads(line) for f in sorted(args.folder.glob("*.jsonl")) for line in f.read_text().splitlines()]
    if not rows:
        raise SystemExit(f"no records in {args.folder}")
    print(summary(rows, args.top))


if __name__ == "__main__":
    main()
