"""A shadow service over scripted tiers, without HTTP: for the drift and live-estimate tests,
which need thousands of requests on fixed seeds.

The small tier answers maths questions, right ("42") or wrong ("41") by its own seeded script;
its format verifier passes both, so a wrong answer is accepted at the same confidence as a right
one. The large tier, the shadow target, is always right.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path

from router.cascade import Cascade, Tier
from router.config import CascadeSettings, Settings, load_settings
from router.generation import GenerationRequest, Message
from router.ledger.entries import LedgerEntry
from router.ledger.writer import Ledger
from router.metrics import Metrics
from router.quality.shadow import ShadowService
from router.verification import VerifierContext, VerifierSet, WeightedVerifier
from tests.support.config import keyless, tier, write_config
from tests.support.model import SMOL
from tests.support.scripted import ScriptedBackend
from verifiers.format import make_format

QUESTION = GenerationRequest(messages=(Message("user", "What is 6*7? Answer with a number."),), max_tokens=16)


def settings(tmp: Path, *, rate: float, shadow_extra: str = "", max_queue: int = 100_000) -> Settings:
    shadow = {"rate": rate, "usd_per_day": 1000.0, "max_concurrency": 4, "max_queue": max_queue}
    small = tier(
        "small",
        threshold=0.5,
        engine={"model": SMOL},
        price={"usd_per_hour": 0.1},
        tables={"shadow": shadow},
        extra=shadow_extra,  # more keys of [tiers.shadow]
    )
    large = tier(
        "large", engine={"model": SMOL}, price={"usd_per_1m_input_tokens": 0.6, "usd_per_1m_output_tokens": 2.4}
    )
    body = keyless({"enabled": False}) + small + large
    return load_settings(write_config(tmp / "config.toml", body))


def service(
    s: Settings, right: Callable[[int], bool], seed: int, *, ledger: Ledger | None = None, clock: Clock | None = None
) -> ShadowService:
    """`right(i)`: whether the small tier's i-th answer is right."""
    count = iter(range(10**9))
    small = ScriptedBackend("small", lambda r: "42" if right(next(count)) else "41", busy_s=0.001)
    large = ScriptedBackend("large", lambda r: "42")
    fmt = WeightedVerifier(make_format({"regex": r"\d+"}, VerifierContext(tier="small")), 1.0)
    tiers = [
        Tier(s.tier("small"), small, VerifierSet([fmt])),
        Tier(s.tier("large"), large, VerifierSet([])),
    ]
    cascade = Cascade(tiers, CascadeSettings(task_classifier=False))
    return ShadowService(s, cascade, ledger, Metrics(lambda: {}), rng=random.Random(seed), clock=clock or Clock())


async def drain(service: ShadowService, timeout_s: float = 30.0) -> None:
    """Wait until every lane is empty and idle, so the test reads settled figures."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(lane.queue.empty() and lane.idle == len(lane.workers) for lane in service.lanes.values()):
            return
        await asyncio.sleep(0.001)
    raise TimeoutError("shadow work still running")


class Clock:
    """Unix time that moves only when told: one request a minute, so a report has periods."""

    def __init__(self, start: float = 1_790_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


async def serve(svc: ShadowService, n: int, *, start: int = 0, each: Callable[[int], None] | None = None) -> None:
    """Answer n requests as the API would, offering each to the shadow sampler, then wait for the
    shadow work; `each(i)` runs after request i's shadow work settled (slower: one at a time)."""
    for i in range(start, start + n):
        result = await svc.cascade.run(QUESTION)
        if isinstance(svc.clock, Clock):
            svc.clock.now += 60.0
        if svc.ledger is not None:  # what the API's accounting writes for the client's request
            await svc.ledger.record(LedgerEntry.from_result(f"r{i}", "alice", result, latency_s=0.01, ts=svc.clock()))
        svc.offer(f"r{i}", QUESTION, result)
        if each is not None:
            await drain(svc)
            each(i)
    await drain(svc)
