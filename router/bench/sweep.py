"""`bench sweep`: one server at rising concurrency (or Poisson rates), and the first server against the rest.

Per level: aggregate output tok/s over the level's wall time, TTFT and latency p50/p95/p99,
requests answered, refused (503) and failed, and the server's peak resident memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from router.bench.drafts import DraftProbe
from router.bench.load import arrivals, closed_loop, open_loop, openai_client, schedule_lag, streamed_request, warm_up
from router.bench.memory import MemoryWatch, read_memory
from router.bench.outcome import summarize
from router.bench.output import fmt
from router.bench.workload import Level, Target, Workload


async def sweep_target(
    target: Target,
    workload: Workload,
    levels: Sequence[Level],
    *,
    requests: int | None,
    duration_s: float | None,
    warmup: int = 2,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    drafts: bool = False,
) -> dict[str, Any]:
    """`drafts`: also read the server's speculative-decoding counters around each level
    (router.bench.drafts), for the level's draft acceptance rate."""
    client = openai_client(target, workload)
    send = streamed_request(client, target, workload)
    result: dict[str, Any] = {**target.describe(), "memory_start": read_memory(target.pid), "levels": []}
    try:
        await warm_up(send, warmup)
        for level in levels:
            probe = DraftProbe(target) if drafts else None
            if probe is not None:
                await probe.start()
            async with MemoryWatch(target.pid) as memory:
                if level.kind == "concurrency":
                    outcomes, wall = await closed_loop(send, int(level.value), requests=requests, duration_s=duration_s)
                    extra: dict[str, Any] = {}
                else:
                    n = requests if requests is not None else max(1, round(level.value * (duration_s or 0)))
                    schedule = arrivals(level.value, n, seed=seed)
                    outcomes, wall = await open_loop(send, schedule)
                    extra = {"arrivals": "poisson", "seed": seed}
                    extra["schedule_lag_ms"] = schedule_lag(outcomes, schedule)
            row: dict[str, Any] = {level.kind: level.value, **summarize(outcomes, wall), **extra}
            row["memory"] = memory.result()
            if probe is not None:
                row["drafts"] = await probe.result()
            row["per_request"] = [o.to_dict() for o in outcomes]
            result["levels"].append(row)
            if progress is not None:
                progress(
                    f"[{target.label}] {level.name}: {row['ok']}/{row['requests']} ok, "
                    f"{row['refused_503']} refused, {row['output_tok_s']:.1f} tok/s, "
                    f"TTFT p95 {fmt(row['ttft_ms']['p95'], 0)} ms"
                )
    finally:
        await client.close()
    return result


def compare(targets: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first target against each other one, level by level: ratios of throughput (higher is
    better for the first) and of tail times (lower is better for the first)."""
    rows: list[dict[str, Any]] = []
    if len(targets) < 2 or "levels" not in targets[0]:
        return rows
    first = targets[0]
    for other in targets[1:]:
        if "levels" not in other:
            continue
        for a in first["levels"]:
            key = "concurrency" if "concurrency" in a else "rate"
            b = next((lv for lv in other["levels"] if lv.get(key) == a[key]), None)
            if b is None:
                continue
            rows.append(
                {
                    key: a[key],
                    "of": first["label"],
                    "to": other["label"],
                    "output_tok_s_ratio": _ratio(a["output_tok_s"], b["output_tok_s"]),
                    "ttft_p95_ratio": _ratio(a["ttft_ms"]["p95"], b["ttft_ms"]["p95"]),
                    "latency_p95_ratio": _ratio(a["latency_ms"]["p95"], b["latency_ms"]["p95"]),
                }
            )
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)
