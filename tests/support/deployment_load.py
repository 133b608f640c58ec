"""Load against a tier with several deployments, as its clients see it: the deployment fault matrix
(a served router, the official `openai` client, plain and streamed requests at a concurrency) and
the balancing runs (one `openai` backend, closed loops). `scripts/deployment_faults.py` runs the
same code for the committed figures.

The matrix (`fault_matrix`) gives each fault its own tier, `large-<fault>`, of two deployments: its
own `a`, which answers while the tiers warm up and then has that fault, and `b`, one healthy process
every tier shares. So the faults can run side by side against one router (they mostly wait: on a
hang's attempt timeout, a breaker's cool-down), each meeting an `a` that was in use."""

from __future__ import annotations

import asyncio
import contextlib
import re
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from router.backends.openai import OpenAIBackend
from router.config import DeploymentSettings, OpenAIBackendSettings
from router.generation import GenerationRequest, Message
from tests.support.config import TOKEN_PRICE, keyless, small_tier, tier, write_config
from tests.support.fault_process import fault_processes
from tests.support.fault_upstream import TOKENS
from tests.support.servers import free_port, serve_process

TEXT = "".join(TOKENS)
ASK = [{"role": "user", "content": "Say hello."}]
FAULTS = ("500", "hang", "reset", "429", "cut")
DEADLINE_S = 6.0  # the large tiers' deadline (timeout_s): no client waits longer
ATTEMPT_TIMEOUT_S = 2.0  # a try's share while the other deployment is untried: a hang costs this, then `b`
CONCURRENCY = 8  # per fault
WARM = 16  # requests per tier with both deployments healthy, before the fault


@dataclass(frozen=True)
class Outcome:
    """One client request: its status (200, or the error's), seconds, the text, who answered."""

    status: int
    seconds: float
    text: str
    deployment: str | None
    streamed: bool


def large_tier(name: str, a: str, b: str) -> str:
    """A large tier of two deployments `a` and `b` (least outstanding, quick breakers)."""
    engine = {
        "model": "fake-large",
        "max_attempts": 2,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.2,
        "breaker_failures": 3,
        "breaker_cooldown_s": 1.0,
        "attempt_timeout_s": ATTEMPT_TIMEOUT_S,
        "hosted_prompt_tokens": 0,
    }
    deployments = "".join(
        f'[[tiers.openai.deployments]]\nname = "{name}"\nbase_url = "{url}"\n' for name, url in (("a", a), ("b", b))
    )
    # the deployments follow the tier's own sub-tables: TOML keys after [tiers.price] belong to it
    return tier(
        name, backend="openai", max_tokens=16, timeout_s=DEADLINE_S, engine=engine, price=TOKEN_PRICE, extra=deployments
    )


def matrix_config(path: Path, ledger: Path, a: str, b: str) -> Path:
    """A served router: the small test tier, then a large tier of two deployments `a` and `b`,
    `on_unavailable = "best_effort"`."""
    body = keyless({"path": ledger}) + '[cascade]\non_unavailable = "best_effort"\n'
    verifiers = '[[tiers.verifiers]]\nname = "confidence"\n'
    return write_config(path, body + small_tier(1.0, verifiers) + large_tier("large", a, b))


def faults_config(path: Path, ledger: Path, a: dict[str, str], b: str) -> Path:
    """A served router of large tiers only, `large-<fault>` for each fault, each with its own `a`
    and the shared `b` (no local model: it starts in a second)."""
    tiers = "".join(large_tier(f"large-{fault}", url, b) for fault, url in a.items())
    return write_config(path, keyless({"path": ledger}) + tiers)


@dataclass
class FaultRun:
    """One fault's run: the warm-up with both healthy, the run with `a` faulty, the tries that
    failed at `a` meanwhile (from /metrics), and the run's seconds."""

    healthy: list[Outcome]
    outcomes: list[Outcome] = field(default_factory=list)
    failed_at_a: int = 0
    run_s: float = 0.0


@dataclass
class Matrix:
    """The served router of the matrix (its URL and ledger) and each fault's run."""

    url: str
    ledger: Path
    runs: dict[str, FaultRun]


@contextlib.contextmanager
def fault_matrix(tmp: Path, n: int, *, side_by_side: bool) -> Iterator[Matrix]:
    """Every fault's run of `n` requests (every other one streamed, CONCURRENCY at a time), each
    against its own tier: first WARM requests per tier with both deployments healthy (all tiers at
    once), then every `a` switched to its fault, then the runs, all at once (`side_by_side`, the
    test) or one after another (the script's figures, each fault's latency its own). Yields while
    the router and upstreams still run, for /metrics and the ledger."""
    ports = {fault: free_port() for fault in FAULTS}
    b_port = free_port()
    specs = [("ok", b_port, 0.0, None), *(("ok", ports[f], 0.0, f) for f in FAULTS)]
    with fault_processes(*specs) as (b, *faulty):
        ledger = tmp / "faults-ledger.sqlite3"
        cfg = faults_config(tmp / "faults.toml", ledger, {f: u.url for f, u in zip(FAULTS, faulty, strict=True)}, b.url)
        with serve_process(cfg, log_path=tmp / "faults-serve.log", log_level="warning") as (_, url, _):
            warm = asyncio.run(_each({f: http_run(url, WARM, CONCURRENCY, model=f"large-{f}") for f in FAULTS}))
            runs = {f: FaultRun(healthy=warm[f]) for f in FAULTS}
            for upstream in faulty:
                upstream.switch()
            before = {f: failed_attempts(url, "a", f"large-{f}") for f in FAULTS}

            async def timed(fault: str) -> None:
                started = time.monotonic()
                runs[fault].outcomes = await http_run(url, n, CONCURRENCY, model=f"large-{fault}")
                runs[fault].run_s = time.monotonic() - started

            if side_by_side:
                asyncio.run(_each({f: timed(f) for f in FAULTS}))
            else:
                for f in FAULTS:
                    asyncio.run(timed(f))
            for f in FAULTS:
                runs[f].failed_at_a = int(failed_attempts(url, "a", f"large-{f}") - before[f])
            yield Matrix(url, ledger, runs)


async def _each(work: dict[str, Awaitable[Any]]) -> dict[str, Any]:
    done = await asyncio.gather(*work.values())
    return dict(zip(work, done, strict=True))


async def http_run(url: str, n: int, concurrency: int, *, model: str = "large") -> list[Outcome]:
    """`n` requests, every other one streamed, `concurrency` at a time, through the official client
    with its retries off (what a client sees is what the router did)."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
    queue = iter(range(n))
    out: list[Outcome] = []

    async def one(i: int) -> Outcome:
        streamed = i % 2 == 1
        started = time.monotonic()
        try:
            if streamed:
                parts: list[str] = []
                where = None
                stream = await client.chat.completions.create(model=model, messages=ASK, max_tokens=8, stream=True)  # type: ignore[arg-type]
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        parts.append(chunk.choices[0].delta.content)
                    extra = chunk.model_extra or {}
                    if "tierroute" in extra:
                        where = extra["tierroute"].get("deployment")
                return Outcome(200, time.monotonic() - started, "".join(parts), where, True)
            r = await client.chat.completions.create(model=model, messages=ASK, max_tokens=8)  # type: ignore[arg-type]
            where = (r.model_extra or {})["tierroute"].get("deployment")
            return Outcome(200, time.monotonic() - started, r.choices[0].message.content or "", where, False)
        except openai.APIStatusError as exc:
            return Outcome(exc.status_code, time.monotonic() - started, "", None, streamed)
        except openai.APIError as exc:  # an error event mid-stream, a cut connection
            return Outcome(0, time.monotonic() - started, type(exc).__name__, None, streamed)

    async def worker() -> None:
        for i in queue:
            out.append(await one(i))

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    return out


def two_deployments(
    fast: str,
    slow: str,
    strategy: str = "least_outstanding",
    *,
    names: tuple[str, str] = ("fast", "slow"),
    weights: tuple[float, float] = (1.0, 1.0),
) -> OpenAIBackend:
    deployments = [
        DeploymentSettings(base_url=url, name=name, weight=weight)
        for url, name, weight in zip((fast, slow), names, weights, strict=True)
    ]
    settings = OpenAIBackendSettings(model="fake-large", strategy=strategy, deployments=deployments)  # type: ignore[arg-type]
    return OpenAIBackend("large", settings, timeout_s=30)


WEIGHTS = (1.0, 3.0)  # the weighted random run's weights, `light` then `heavy`


def weighted_run(n: int) -> list[tuple[float, str | None]]:
    """`n` requests from CONCURRENCY closed loops through one `openai` backend under weighted random,
    weights 1:3, over two healthy upstream processes (`light`, `heavy`): who answered each."""
    specs = [("ok", free_port(), 0.0, None), ("ok", free_port(), 0.0, None)]

    async def run(light: str, heavy: str) -> list[tuple[float, str | None]]:
        backend = two_deployments(light, heavy, "weighted_random", names=("light", "heavy"), weights=WEIGHTS)
        await backend.start()
        try:
            return await closed_loops(backend.generate, n, CONCURRENCY)
        finally:
            await backend.close()

    with fault_processes(*specs) as (light, heavy):
        return asyncio.run(run(light.url, heavy.url))


async def closed_loops(
    generate: Callable[[GenerationRequest], Awaitable[object]], n: int, concurrency: int
) -> list[tuple[float, str | None]]:
    """`n` requests from `concurrency` closed loops: each one's seconds and the deployment that answered."""
    request = GenerationRequest(messages=(Message("user", "Say hello."),), max_tokens=8)
    queue = iter(range(n))
    out: list[tuple[float, str | None]] = []

    async def worker() -> None:
        for _ in queue:
            started = time.monotonic()
            gen = await generate(request)
            out.append((time.monotonic() - started, getattr(gen, "deployment", None)))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def failed_attempts(url: str, deployment: str, tier: str = "large") -> float:
    """A served router's count of failed tries at one deployment, read from its /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(
        rf'^tierroute_deployment_failed_attempts_total{{deployment="{deployment}",tier="{tier}"}} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


def p50(values: list[float]) -> float:
    return statistics.median(values)
