"""The deployment fault matrix and the balancing runs at full size: the figures of docs/deployments.md.

    PYTHONPATH=. .venv/bin/python scripts/deployment_faults.py [--requests 200] [--json docs/bench/deployments.json]

Fault matrix (`tests.support.deployment_load.fault_matrix`): `tierroute serve` with one large tier
per fault, `large-<fault>`, of two deployments (least outstanding; tier deadline 6 s, a try's share
2 s while the other deployment is untried; 2 tries per deployment; breaker after 3 failures, 1 s
cool-down): its own `a` and a `b` the tiers share, each a fault-injecting upstream process
(`tests.support.fault_process`). 16 requests per tier with both healthy, then every `a` switches to
its fault (500s, a hang, a TCP reset, 429 with `Retry-After: 1`, a stream cut before its first
token), then, one fault after another, `--requests` client requests, every other one streamed,
eight at a time, through the official `openai` client with its retries off. Per fault: how many
were answered 200 with the whole text, the slowest, p50 and p95, the share `b` answered, and how
many tries failed at `a` (from the router's /metrics: the fault was met, then its breaker kept it
away). The test suite runs the same faults side by side (`test_openai_deployment_faults.py`).

Balancing: one `openai` backend with a fast deployment (answers after 50 ms) and a slow one (the
upstream's `slow` mode, 1 s), `--requests` requests from eight closed loops under least
outstanding and under weighted random (equal weights), and the fast deployment alone (ordered
failover, which never needs the second), in four turns of a quarter each so that the machine's
load falls on all three alike: the share the fast one answered, p50 and p95. Then weighted random
with weights 1:3 over two healthy upstreams, `--weighted` requests (1,000) from eight closed
loops: the share the weight-3 one answered (75% by its weight).

Run from the repository root (it starts `tests.support.fault_process`). Prints a table and writes
the raw figures as JSON, with the machine's load average beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.deployment_load import (  # noqa: E402 - after the path is set
    ATTEMPT_TIMEOUT_S,
    DEADLINE_S,
    FAULTS,
    TEXT,
    WEIGHTS,
    closed_loops,
    fault_matrix,
    two_deployments,
    weighted_run,
)
from tests.support.fault_process import fault_process  # noqa: E402
from tests.support.servers import free_port  # noqa: E402


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def matrix(n: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp, fault_matrix(Path(tmp), n, side_by_side=False) as done:
        for fault in FAULTS:
            run = done.runs[fault]
            seconds = [o.seconds for o in run.outcomes]
            rows.append(
                {
                    "fault": fault,
                    "requests": len(run.outcomes),
                    "streamed": sum(o.streamed for o in run.outcomes),
                    "ok_200_whole_text": sum(o.status == 200 and o.text == TEXT for o in run.outcomes),
                    "statuses": sorted({o.status for o in run.outcomes}),
                    "p50_s": round(statistics.median(seconds), 3),
                    "p95_s": round(_q(seconds, 0.95), 3),
                    "max_s": round(max(seconds), 3),
                    "answered_by_b": round(sum(o.deployment == "b" for o in run.outcomes) / len(run.outcomes), 3),
                    "failed_tries_at_a": run.failed_at_a,
                    "run_s": round(run.run_s, 1),
                    "before_it_both_healthy_answered_by_b": round(
                        sum(o.deployment == "b" for o in run.healthy) / len(run.healthy), 3
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


def weighted(n: int) -> dict[str, object]:
    done = weighted_run(n)
    seconds = [s for s, _ in done]
    row: dict[str, object] = {
        "strategy": "weighted_random 1:3 (both healthy)",
        "requests": len(done),
        "weights": list(WEIGHTS),
        "heavy_share": round(sum(d == "heavy" for _, d in done) / len(done), 3),
        "expected_heavy_share": WEIGHTS[1] / sum(WEIGHTS),
        "p50_s": round(statistics.median(seconds), 3),
        "p95_s": round(_q(seconds, 0.95), 3),
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="client requests per fault and per strategy")
    parser.add_argument("--weighted", type=int, default=1000, help="requests of the weighted random 1:3 run")
    parser.add_argument("--json", default="docs/bench/deployments.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    report = {
        "command": "PYTHONPATH=. .venv/bin/python scripts/deployment_faults.py "
        f"--requests {args.requests} --weighted {args.weighted}",
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "tier_deadline_s": DEADLINE_S,
        "attempt_timeout_s": ATTEMPT_TIMEOUT_S,
        "concurrency": 8,
        "faults": matrix(args.requests),
        "balancing": balancing(args.requests),
        "weighted": weighted(args.weighted),
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written: {args.json}")


if __name__ == "__main__":
    main()
