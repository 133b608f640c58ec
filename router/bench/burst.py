"""`bench burst`: many requests at once, in rounds; whether the server sheds load cleanly and keeps its memory.

A server under a burst should answer or refuse with 503, never fail otherwise, still answer
afterwards, and settle back to the same memory round after round (growth between rounds is a leak).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from router.bench.load import closed_loop, openai_client, streamed_request, warm_up
from router.bench.memory import MemoryWatch, read_memory
from router.bench.outcome import summarize
from router.bench.output import fmt
from router.bench.workload import Target, Workload

if TYPE_CHECKING:
    import openai


async def burst_target(
    target: Target,
    workload: Workload,
    *,
    requests: int,
    concurrency: int,
    rounds: int = 2,
    settle_s: float = 5.0,
    warmup: int = 2,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    client = openai_client(target, workload)
    send = streamed_request(client, target, workload)
    try:
        await warm_up(send, warmup)
        start = read_memory(target.pid)
        done: list[dict[str, Any]] = []
        everyone_handled = True
        for number in range(1, rounds + 1):
            before = read_memory(target.pid)
            async with MemoryWatch(target.pid) as memory:
                outcomes, wall = await closed_loop(send, concurrency, requests=requests)
            after = read_memory(target.pid)
            await asyncio.sleep(settle_s)
            settled = read_memory(target.pid)
            everyone_handled &= all(o.error in (None, "503") for o in outcomes)
            row: dict[str, Any] = {
                "round": number,
                "concurrency": concurrency,
                **summarize(outcomes, wall),
                "memory": memory.result(),
                "rss_before_mib": before["rss_mib"] if before else None,
                "rss_after_mib": after["rss_mib"] if after else None,
                "rss_settled_mib": settled["rss_mib"] if settled else None,
                "per_request": [o.to_dict() for o in outcomes],
            }
            done.append(row)
            if progress is not None:
                progress(
                    f"[{target.label}] burst round {number}: {row['ok']} answered, {row['refused_503']} refused, "
                    f"{sum(row['errors'].values())} other errors; RSS {fmt(row['rss_before_mib'])} -> "
                    f"{fmt(row['rss_after_mib'])} -> {fmt(row['rss_settled_mib'])} MiB after {settle_s:g} s"
                )
        alive = await _still_answers(client)
    finally:
        await client.close()
    first, last = done[0]["rss_settled_mib"], done[-1]["rss_settled_mib"]
    return {
        **target.describe(),
        "memory_start": start,
        "rounds": done,
        "verdict": {
            "alive_after": alive,
            "every_request_answered_or_503": everyone_handled,
            "rss_growth_first_to_last_round_mib": None if first is None or last is None else round(last - first, 1),
        },
    }


async def _still_answers(client: openai.AsyncOpenAI) -> bool:
    import openai

    try:
        await client.models.list()
    except openai.APIError:
        return False
    return True
