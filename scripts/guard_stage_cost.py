"""The guards' own time per request, in process: the three built-in guards of
bench/guards-overhead.toml (pii keep_local, secrets block, prompt_injection log_only) run `before`
on the bench's fixed prompts (router.bench.workload.PROMPTS), as chat requests, N times each;
p50 and p99 of the three together. The figure docs/guardrails.md gives beside `bench overhead`,
whose end-to-end percentiles move with the machine's load far more than the guards do.

    nice -n -10 .venv/bin/python scripts/guard_stage_cost.py --n 2000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from router.admission.auth import Principal  # noqa: E402
from router.bench.workload import PROMPTS  # noqa: E402
from router.generation import GenerationRequest, Message  # noqa: E402
from router.guards.stage import InjectionGuard, PiiGuard, SecretsGuard  # noqa: E402
from router.pipeline.stages import StageContext  # noqa: E402


async def run(n: int) -> list[float]:
    guards = [PiiGuard({"action": "keep_local"}), SecretsGuard({"action": "block"}), InjectionGuard({})]
    for g, name in zip(guards, ("pii", "secrets", "prompt_injection"), strict=True):
        g.name = name
    principal = Principal(key_id="anonymous", entry=None)
    out = []
    for i in range(n):
        request = GenerationRequest(messages=(Message("user", PROMPTS[i % len(PROMPTS)]),), max_tokens=16)
        ctx = StageContext(surface="chat.completions", principal=principal, model="auto", request=request, plan=())
        t0 = time.perf_counter()
        for g in guards:
            await g.before(ctx)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ms = asyncio.run(run(ap.parse_args().n))[100:]  # the first hundred warm caches up
    q = statistics.quantiles(ms, n=100)
    print(f"three guards, before(): p50 {q[49]:.3f} ms, p99 {q[98]:.3f} ms over {len(ms)} requests")


if __name__ == "__main__":
    main()
