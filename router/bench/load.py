"""The load generators: closed loops at a concurrency, open loops on a schedule, and the timed request.

Every request is timed on the client: TTFT is the first chunk that carries text, latency the end
of the stream, output tokens the server's usage when it reports it (`stream_options.include_usage`)
and the number of text chunks when it does not (llama-cpp-python's server sends one token per
chunk). An open loop sends on schedule whether or not earlier requests have ended, so a slow
server cannot slow its own arrivals; how late the client itself was is reported beside.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from router.bench.outcome import Outcome
from router.bench.stats import distribution_ms
from router.bench.workload import Target, Workload

if TYPE_CHECKING:
    import openai


Send = Callable[[int, float], Coroutine[Any, Any, Outcome]]


def arrivals(rate: float, n: int, *, kind: str = "poisson", seed: int = 0) -> list[float]:
    """Send times, in seconds from the start, of n requests at `rate` per second: exponential gaps
    from a seeded generator (Poisson arrivals), or even gaps ("uniform")."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    if kind == "uniform":
        return [i / rate for i in range(n)]
    if kind != "poisson":
        raise ValueError(f"arrivals must be 'poisson' or 'uniform', not {kind!r}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def closed_loop(
    send: Send, concurrency: int, *, requests: int | None = None, duration_s: float | None = None
) -> tuple[list[Outcome], float]:
    """`concurrency` clients, each sending its next request as soon as its last one ends, until
    `requests` have been sent or `duration_s` has passed. Returns the outcomes and the wall time."""
    if (requests is None) == (duration_s is None):
        raise ValueError("give exactly one of requests and duration_s")
    start = time.perf_counter()
    sent = 0
    outcomes: list[Outcome] = []

    async def client() -> None:
        nonlocal sent
        while True:
            if requests is not None and sent >= requests:
                return
            if duration_s is not None and time.perf_counter() - start >= duration_s:
                return
            index, sent = sent, sent + 1
            outcomes.append(await send(index, start))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    outcomes.sort(key=lambda o: o.index)
    return outcomes, time.perf_counter() - start


async def open_loop(send: Send, schedule: Sequence[float]) -> tuple[list[Outcome], float]:
    """Send request i at schedule[i] seconds from the start whether or not earlier ones have ended
    (an open loop: a slow server does not slow the arrivals)."""
    start = time.perf_counter()
    tasks: list[asyncio.Task[Outcome]] = []
    for index, at in enumerate(schedule):
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(index, start)))
    outcomes = list(await asyncio.gather(*tasks))
    return outcomes, time.perf_counter() - start


def schedule_lag(outcomes: Sequence[Outcome], schedule: Sequence[float]) -> dict[str, Any]:
    """How late the client sent each request against its schedule: near zero, or the client itself
    was the bottleneck."""
    return distribution_ms([max(0.0, o.sent_s - schedule[o.index]) for o in outcomes])


def openai_client(target: Target, workload: Workload) -> openai.AsyncOpenAI:
    import openai

    return openai.AsyncOpenAI(base_url=target.url, api_key=target.api_key, max_retries=0, timeout=workload.timeout_s)


def streamed_request(client: openai.AsyncOpenAI, target: Target, workload: Workload) -> Send:
    """One streamed completion, timed from the client."""
    import openai

    async def send(index: int, level_start: float) -> Outcome:
        t0 = time.perf_counter()
        out = Outcome(index=index, sent_s=t0 - level_start)
        chunks = 0
        common: dict[str, Any] = {
            "model": target.model,
            "max_tokens": workload.max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if workload.response_format is not None:
            if workload.api == "chat":
                common["response_format"] = workload.response_format
            else:  # not the SDK's completions parameter; tierroute, vLLM and llama.cpp take it
                common["extra_body"] = {"response_format": workload.response_format}
        stream: Any = None
        try:
            if workload.api == "chat":
                stream = await client.chat.completions.create(
                    messages=[{"role": "user", "content": workload.prompt(index)}], **common
                )
            else:
                stream = await client.completions.create(prompt=workload.prompt(index), **common)
            async for chunk in stream:
                if chunk.choices:
                    choice = chunk.choices[0]
                    text = choice.delta.content if workload.api == "chat" else choice.text
                    if text:
                        chunks += 1
                        if out.ttft_s is None:
                            out.ttft_s = time.perf_counter() - t0
                    if choice.finish_reason:
                        out.finish_reason = choice.finish_reason
                usage = getattr(chunk, "usage", None)
                if usage is not None and usage.completion_tokens is not None:
                    out.output_tokens = usage.completion_tokens
                    out.usage_reported = True
        except openai.APIStatusError as exc:
            out.error = str(exc.status_code)
        except openai.APITimeoutError:
            out.error = "timeout"
        except openai.APIConnectionError:
            out.error = "connection"
        except openai.APIError:
            out.error = "stream_error"
        else:
            if out.finish_reason is None:
                out.error = "incomplete"
        finally:
            if stream is not None:
                await stream.close()  # a stream left mid-way would hold its connection
        out.latency_s = time.perf_counter() - t0
        if not out.usage_reported:
            out.output_tokens = chunks
        return out

    return send


async def warm_up(send: Send, n: int) -> None:
    start = time.perf_counter()
    for index in range(n):
        await send(index, start)
