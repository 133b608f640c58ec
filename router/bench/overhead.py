"""`bench overhead`: the router's own latency, open-loop at a fixed rate against instant backends.

Two figures per request: the client's latency, and the app's own time from `Server-Timing`. A
second pass of the same schedule against /healthz (the floor) gives what HTTP, uvicorn and this
client cost with no router work at all. With the config's response cache on, the warm-up stores
every prompt's answer, so the timed requests are cache hits (counted under `cache`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from typing import Any

from router.bench.instant_server import instant_service
from router.bench.load import Send, arrivals, open_loop, schedule_lag, warm_up
from router.bench.memory import MemoryWatch, read_cpu_s
from router.bench.outcome import Outcome
from router.bench.stats import distribution_ms, rounded
from router.bench.workload import PROMPTS, BenchError


async def drive_overhead(
    url: str,
    *,
    rate: float,
    seconds: float,
    kind: str = "poisson",
    model: str = "auto",
    max_tokens: int = 16,
    seed: int = 0,
    warmup: int = 50,
    floor: bool = True,
    pid: int | None = None,
) -> dict[str, Any]:
    """Open-loop, non-streamed chat requests at `rate` per second for `seconds`: client-side
    latency, and the app's own time from Server-Timing. With `floor`, the same schedule again
    against /healthz: what HTTP, uvicorn and this client cost with no router work at all."""
    import httpx

    async with httpx.AsyncClient(
        base_url=url, timeout=30.0, limits=httpx.Limits(max_connections=512, max_keepalive_connections=512)
    ) as client:

        def sender(chat: bool) -> Send:
            async def send(index: int, level_start: float) -> Outcome:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}],
                    "max_tokens": max_tokens,
                    "temperature": 0.0,
                }
                t0 = time.perf_counter()
                out = Outcome(index=index, sent_s=t0 - level_start)
                try:
                    if chat:
                        response = await client.post("/v1/chat/completions", json=body)
                    else:
                        response = await client.get("/healthz")
                except httpx.TimeoutException:
                    out.error = "timeout"
                except httpx.HTTPError:
                    out.error = "connection"
                else:
                    if response.status_code != 200:
                        out.error = str(response.status_code)
                    elif chat:
                        answer = response.json()
                        out.output_tokens = int(answer.get("usage", {}).get("completion_tokens", 0))
                        out.usage_reported = True
                        out.finish_reason = answer["choices"][0].get("finish_reason")
                    out.server_ms = _server_timing(response.headers.get("server-timing"))
                    out.tier = response.headers.get("x-tierroute-tier")
                    out.cache = response.headers.get("x-tierroute-cache")
                out.latency_s = out.ttft_s = time.perf_counter() - t0
                return out

            return send

        schedule = arrivals(rate, max(1, round(rate * seconds)), kind=kind, seed=seed)
        send = sender(chat=True)
        await warm_up(send, warmup)
        cpu_before = read_cpu_s(pid)
        async with MemoryWatch(pid) as memory:
            outcomes, wall = await open_loop(send, schedule)
        cpu_after = read_cpu_s(pid)
        floor_outcomes: list[Outcome] = []
        if floor:
            await warm_up(sender(chat=False), warmup)
            floor_outcomes, _ = await open_loop(sender(chat=False), schedule)

    ok = [o for o in outcomes if o.ok]
    floor_ok = [o for o in floor_outcomes if o.ok]
    span = schedule[-1]
    return {
        "rate": rate,
        "seconds": seconds,
        "arrivals": kind,
        "seed": seed,
        "model": model,
        "max_tokens": max_tokens,
        "warmup": warmup,
        "requests": len(outcomes),
        "ok": len(ok),
        "errors": dict(sorted(Counter(o.error for o in outcomes if o.error).items())),
        "offered_rate": rounded((len(schedule) - 1) / span if span > 0 else None),
        "wall_s": rounded(wall),
        "client_ms": distribution_ms([o.latency_s for o in ok]),
        "server_ms": distribution_ms([o.server_ms / 1000.0 for o in ok if o.server_ms is not None]),
        "schedule_lag_ms": schedule_lag(outcomes, schedule),
        # the server process's CPU time per timed request (every thread: HTTP, the cascade, the
        # ledger's writer): the figure a busy machine does not inflate
        "server_cpu_ms_per_request": None
        if cpu_before is None or cpu_after is None or not outcomes
        else rounded((cpu_after - cpu_before) * 1000 / len(outcomes)),
        "floor": None
        if not floor
        else {
            "path": "/healthz",
            "requests": len(floor_outcomes),
            "ok": len(floor_ok),
            "client_ms": distribution_ms([o.latency_s for o in floor_ok]),
            "server_ms": distribution_ms([o.server_ms / 1000.0 for o in floor_ok if o.server_ms is not None]),
        },
        "tiers": dict(sorted(Counter(o.tier or "?" for o in ok).items())),
        "cache": dict(sorted(Counter(o.cache for o in ok if o.cache is not None).items())),
        "finish_reasons": dict(sorted(Counter(o.finish_reason or "none" for o in ok).items())),
        "memory": memory.result(),
        "per_request": [o.to_dict() for o in outcomes],
    }


def _server_timing(header: str | None) -> float | None:
    if not header:
        return None
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == "dur":
            try:
                return float(value)
            except ValueError:
                return None
    return None


def run_overhead(
    config: str | os.PathLike[str] | None,
    *,
    rate: float,
    seconds: float,
    kind: str = "poisson",
    verifiers: str = "config",
    model: str = "auto",
    max_tokens: int = 16,
    seed: int = 0,
    warmup: int = 50,
    floor: bool = True,
    ledger_url: str | None = None,
) -> dict[str, Any]:
    from router.config import load_settings, postgres_url_problem

    settings = load_settings(config)
    problem = None if ledger_url is None else postgres_url_problem(ledger_url)
    if problem is not None:  # checked here: the served settings are a copy, past the config's checks
        raise BenchError(f"--ledger-url: {problem}")
    with instant_service(config, verifiers=verifiers, ledger_url=ledger_url) as (url, pid):
        result = asyncio.run(
            drive_overhead(
                url,
                rate=rate,
                seconds=seconds,
                kind=kind,
                model=model,
                max_tokens=max_tokens,
                seed=seed,
                warmup=warmup,
                floor=floor,
                pid=pid,
            )
        )
    result["verifiers"] = {t.name: [] if verifiers == "none" else [v.name for v in t.verifiers] for t in settings.tiers}
    result["verifiers_mode"] = verifiers
    result["config"] = str(config) if config is not None else "(bundled config.toml)"
    result["ledger"] = "postgresql" if ledger_url else "sqlite (a scratch file)"  # never the config's url
    return result
