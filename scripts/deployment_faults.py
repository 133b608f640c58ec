"""The deployment fault matrix and the balancing run at full size: the figures of docs/deployments.md.

    PYTHONPATH=. .venv/bin/python scripts/deployment_faults.py [--requests 200] [--json docs/bench/deployments.json]

Fault matrix: `tierroute serve` with a large tier of two deployments, `a` and `b` (least
outstanding; tier deadline 6 s; 2 tries per deployment; breaker after 3 failures, 1 s cool-down),
each a fault-injecting upstream process (`tests.support.fault_process`). For each fault (500s, a
hang, a TCP reset, 429 with `Retry-After: 1`, a stream cut before its first token) `a` is first
brought back (its breaker's cool-down passes, then 16 requests with both healthy close it), then
`a` has that fault and `b` is healthy, and `--requests` client requests, every other one streamed, go eight at
a time through the official `openai` client with its retries off. Per fault: how many were
answered 200 with the whole text, the slowest, p50 and p95, the share `b` answered, and how many
tries failed at `a` (from the router's /metrics: the fault was met, then its breaker kept it away).

Balancing: one `openai` backend with a fast deployment (answers after 50 ms) and a slow one (the
upstream's `slow` mode, 1 s), `--requests` requests from eight closed loops under least
outstanding and under weighted random (equal weights), and the fast deployment alone (ordered
failover, which never needs the second), in four turns of a quarter each so that the machine's
load falls on all three alike: the share the fast one answered, p50 and p95.

The same code as the bounded test (`tests/router/backends/test_openai_deployment_faults.py`), run
from the repository root (it starts `tests.support.fault_process`). Prints a table and writes the
raw figures as JSON, with the machine's load average beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.deployment_load import (  # noqa: E402 - after the path is set
    FAULTS,
    TEXT,
    closed_loops,
    failed_attempts,
    heal,
    http_run,
    matrix_config,
    two_deployments,
)
from tests.support.fault_process import fault_process  # noqa: E402
from tests.support.servers import free_port, serve_process  # noqa: E402

DEADLINE_S = 6.0


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def matrix(n: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        a, b = free_port(), free_port()
        cfg = matrix_config(
            Path(tmp) / "config.toml",
            Path(tmp) / "ledger.sqlite3",
            f"http://127.0.0.1:{a}/v1",
            f"http://127.0.0.1:{b}/v1",
            timeout_s=DEADLINE_S,
        )
        with serve_process(cfg, log_path=Path(tmp) / "serve.log", log_level="warning") as (_, url, _):
            for fault in FAULTS:
                with fault_process("ok", port=b):
                    healthy = heal(url, a)
                    with fault_process(fault, port=a):
                        before = failed_attempts(url, "a")
                        started = time.monotonic()
                        outcomes = asyncio.run(http_run(url, n, 8))
                        took = time.monotonic() - started
                        failed_at_a = failed_attempts(url, "a") - before
                seconds = [o.seconds for o in outcomes]
                rows.append(
                    {
                        "fault": fault,
                        "requests": len(outcomes),
                        "streamed": sum(o.streamed for o in outcomes),
                        "ok_200_whole_text": sum(o.status == 200 and o.text == TEXT for o in outcomes),
                        "statuses": sorted({o.status for o in outcomes}),
                        "p50_s": round(statistics.median(seconds), 3),
                        "p95_s": round(_q(seconds, 0.95), 3),
                        "max_s": round(max(seconds), 3),
                        "answered_by_b": round(sum(o.deployment == "b" for o in outcomes) / len(outcomes), 3),
                        "failed_tries_at_a": int(failed_at_a),
                        "run_s": round(took, 1),
                        "before_it_both_healthy_answered_by_b": round(
                            sum(o.deployment == "b" for o in healthy) / len(healthy), 3
                        ),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


async def _balance(n: int, fast: str, slow: str) -> list[dict[str, object]]:
    strategies = {
        "least_outstanding": "least_outstanding",
        "weighted_random": "weighted_random",
        "fast alone": "ordered_failover",
    }
    backends = {label: two_deployments(fast, slow, strategy=s) for label, s in strategies.items()}
    done: dict[str, list[tuple[float, str | None]]] = {label: [] for label in backends}
    for backend in backends.values():
        await backend.start()
    try:
        await closed_loops(backends["fast alone"].generate, 16, 8)  # connections made, code warm
        for _ in range(4):  # in turns, so the machine's load falls on each alike
            for label, backend in backends.items():
                done[label] += await closed_loops(backend.generate, n // 4, 8)
    finally:
        for backend in backends.values():
            await backend.close()
    rows: list[dict[str, object]] = []
    for label, runs in done.items():
        seconds = [s for s, _ in runs]
        rows.append(
            {
                "strategy": label,
                "requests": len(runs),
                "fast_share": round(sum(d == "fast" for _, d in runs) / len(runs), 3),
                "p50_s": round(statistics.median(seconds), 3),
                "p95_s": round(_q(seconds, 0.95), 3),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def balancing(n: int) -> list[dict[str, object]]:
    with (
        fault_process("ok", port=free_port(), delay=0.05) as fast,
        fault_process("slow", port=free_port()) as slow,
    ):
        return asyncio.run(_balance(n, fast, slow))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="client requests per fault and per strategy")
    parser.add_argument("--json", default="docs/bench/deployments.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    report = {
        "command": f"PYTHONPATH=. .venv/bin/python scripts/deployment_faults.py --requests {args.requests}",
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "tier_deadline_s": DEADLINE_S,
        "concurrency": 8,
        "faults": matrix(args.requests),
        "balancing": balancing(args.requests),
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written: {args.json}")


if __name__ == "__main__":
    main()
