"""Load against a tier with several deployments, as its clients see it: the deployment fault matrix
(a served router, the official `openai` client, plain and streamed requests at a concurrency) and
the balancing run (one `openai` backend, closed loops). `scripts/deployment_faults.py` runs the
same code at full size for the committed figures."""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from router.backends.openai import OpenAIBackend
from router.config import DeploymentSettings, OpenAIBackendSettings
from router.generation import GenerationRequest, Message
from tests.support.config import TOKEN_PRICE, keyless, small_tier, tier, write_config
from tests.support.fault_process import fault_process
from tests.support.fault_upstream import TOKENS

TEXT = "".join(TOKENS)
ASK = [{"role": "user", "content": "Say hello."}]
FAULTS = ("500", "hang", "reset", "429", "cut")


@dataclass(frozen=True)
class Outcome:
    """One client request: its status (200, or the error's), seconds, the text, who answered."""

    status: int
    seconds: float
    text: str
    deployment: str | None
    streamed: bool


def matrix_config(path: Path, ledger: Path, a: str, b: str, *, timeout_s: float) -> Path:
    """A served router: the small test tier, then a large tier of two deployments `a` and `b`
    (least outstanding, quick breakers), `on_unavailable = "best_effort"`."""
    engine = {
        "model": "fake-large",
        "max_attempts": 2,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.2,
        "breaker_failures": 3,
        "breaker_cooldown_s": 1.0,
        "hosted_prompt_tokens": 0,
    }
    deployments = "".join(
        f'[[tiers.openai.deployments]]\nname = "{name}"\nbase_url = "{url}"\n' for name, url in (("a", a), ("b", b))
    )
    # the deployments follow the tier's own sub-tables: TOML keys after [tiers.price] belong to it
    large = tier("large", backend="openai", max_tokens=16, timeout_s=timeout_s, engine=engine, price=TOKEN_PRICE)
    body = keyless({"path": ledger}) + '[cascade]\non_unavailable = "best_effort"\n'
    verifiers = '[[tiers.verifiers]]\nname = "confidence"\n'
    return write_config(path, body + small_tier(1.0, verifiers) + large + "\n" + deployments)


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


def heal(url: str, port: int, *, cooldown_s: float = 1.0) -> list[Outcome]:
    """Bring deployment `a` (at `port`) back before the next fault: once its breaker's cool-down has
    passed, requests with it healthy close the breaker, so each fault meets a deployment in use."""
    time.sleep(cooldown_s + 0.2)
    with fault_process("ok", port=port):
        return asyncio.run(http_run(url, 16, 8))


def two_deployments(fast: str, slow: str, strategy: str = "least_outstanding") -> OpenAIBackend:
    settings = OpenAIBackendSettings(
        model="fake-large",
        strategy=strategy,  # type: ignore[arg-type]
        deployments=[DeploymentSettings(base_url=fast, name="fast"), DeploymentSettings(base_url=slow, name="slow")],
    )
    return OpenAIBackend("large", settings, timeout_s=30)


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
