"""`tierroute bench`: load against any OpenAI-compatible server, and the router's own overhead.

Three modes, each printing a table and writing every number to JSON (`--json PATH`):

- `sweep`: a closed-loop concurrency sweep (or Poisson arrivals at given rates) of streamed
  requests with fixed prompts and output lengths, against one or more servers in one run, one
  after another. Per level: aggregate output tok/s, time to first token and latency p50/p95/p99,
  requests answered, refused (503) and failed, and the server's peak resident memory.
- `burst`: N requests at high concurrency, in rounds: answered / refused with 503 / other
  errors, whether the server still answers afterwards, and its memory before, after, and after
  settling, round by round, to show whether memory stays flat.
- `overhead`: the service itself, with every tier served by an instant backend in a child
  process, driven open-loop at a fixed rate; what the client sees is what the router adds.

Servers are named with `--url` (the base URL, including /v1). A server can be started by the
bench itself (`--launch CMD`): it is started before its turn, measured alone, and stopped after,
and its memory is sampled without a `--pid`.

Every request is timed on the client: TTFT is the first chunk that carries text, latency the end
of the stream, output tokens the server's usage when it reports it (`stream_options.include_usage`)
and the number of text chunks when it does not (llama-cpp-python's server sends one token per
chunk); each level says which it used. Aggregate tok/s is the answered requests' output tokens
over the level's wall time. Percentiles interpolate linearly between closest ranks, as numpy does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import platform
import random
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.errors import TierrouteError

if TYPE_CHECKING:
    import httpx
    import openai
    from multiprocessing.connection import Connection

    from router.config import Settings

# Fixed and varied: code, arithmetic, facts, writing, short and long answers. Request k of every
# level asks PROMPTS[k % 16], so every server and every level sees the same sequence.
PROMPTS: tuple[str, ...] = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain the difference between a process and a thread in three sentences.",
    "What is 17 * 23? Show your working.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Write a SQL query that returns the ten most recent rows of a table named orders.",
    "List five common uses of a hash map.",
    "Translate 'Where is the train station?' into French and German.",
    "Write a haiku about autumn rain.",
    "How does binary search work? Give its time complexity.",
    "Write a bash one-liner that counts the lines of every .py file under the current directory.",
    "What causes the seasons on Earth?",
    "Rewrite with a list comprehension:\nresult = []\nfor x in range(10):\n    if x % 2 == 0:\n"
    "        result.append(x * x)",
    "Give three tips for writing clear commit messages.",
    "A train travels 120 km in 1.5 hours. What is its average speed in km/h?",
    "Write a JavaScript function that debounces another function.",
    "Explain what a REST API is to a beginner.",
)


class BenchError(TierrouteError):
    """The benchmark cannot run as asked (bad options, a server that will not start)."""


# ---- statistics ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (q in [0, 100]) by linear interpolation between closest ranks, numpy's
    default method; None when there are no values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside [0, 100]")
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def distribution_ms(seconds: Sequence[float]) -> dict[str, float | int | None]:
    ms = [s * 1000.0 for s in seconds]
    return {
        "n": len(ms),
        "p50": _r(percentile(ms, 50)),
        "p95": _r(percentile(ms, 95)),
        "p99": _r(percentile(ms, 99)),
        "mean": _r(math.fsum(ms) / len(ms)) if ms else None,
        "max": _r(max(ms)) if ms else None,
    }


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


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


# ---- memory -------------------------------------------------------------------------------------


def read_memory(pid: int | None) -> dict[str, float] | None:
    """Resident memory of a process on this machine, in MiB: now (VmRSS) and its peak since it
    started (VmHWM). None when there is no such process."""
    if pid is None:
        return None
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found: dict[str, float] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found["rss_mib" if key == "VmRSS" else "hwm_mib"] = round(int(rest.split()[0]) / 1024, 1)
    return found or None


class MemoryWatch:
    """The peak of a process's resident memory over a stretch of time, sampled from /proc."""

    def __init__(self, pid: int | None, interval_s: float = 0.1) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_mib: float | None = None
        self.end: dict[str, float] | None = None
        self._task: asyncio.Task[None] | None = None

    def _sample(self) -> dict[str, float] | None:
        now = read_memory(self.pid)
        if now is not None:
            self.peak_mib = max(self.peak_mib or 0.0, now["rss_mib"])
        return now

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self._sample()

    async def __aenter__(self) -> MemoryWatch:
        if self._sample() is not None:
            self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.end = self._sample()

    def result(self) -> dict[str, float | None] | None:
        if self.end is None and self.peak_mib is None:
            return None
        return {
            "peak_rss_mib": self.peak_mib,
            "rss_end_mib": self.end["rss_mib"] if self.end else None,
            "hwm_mib": self.end.get("hwm_mib") if self.end else None,
        }


# ---- what is measured -----------------------------------------------------------------------------


@dataclass
class Outcome:
    """One request as the client saw it. `error` is None when answered, else the HTTP status
    ("503", "500", ...), "timeout", "connection", "stream_error" (an error reported after output
    began), or "incomplete" (the stream ended without a finish reason: cut short, as
    llama-cpp-python's server does to a running stream when another request arrives, unless it is
    started with `--interrupt_requests False`)."""

    index: int
    sent_s: float  # since the level began
    latency_s: float = 0.0
    ttft_s: float | None = None
    output_tokens: int = 0
    usage_reported: bool = False
    finish_reason: str | None = None
    error: str | None = None
    server_ms: float | None = None  # overhead mode: the app's own time, from Server-Timing
    tier: str | None = None  # overhead mode: the tier that answered

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "i": self.index,
            "sent_s": _r(self.sent_s, 6),
            "latency_ms": _r(self.latency_s * 1000),
            "ttft_ms": _r(None if self.ttft_s is None else self.ttft_s * 1000),
            "output_tokens": self.output_tokens,
            "finish_reason": self.finish_reason,
            "error": self.error,
        }
        if self.server_ms is not None:
            row["server_ms"] = _r(self.server_ms)
        if self.tier is not None:
            row["tier"] = self.tier
        return row


@dataclass(frozen=True)
class Workload:
    api: str = "chat"  # or "completions"
    max_tokens: int = 128
    timeout_s: float = 600.0
    prompts: tuple[str, ...] = PROMPTS

    def prompt(self, index: int) -> str:
        return self.prompts[index % len(self.prompts)]

    def describe(self) -> dict[str, Any]:
        digest = hashlib.sha256("\x00".join(self.prompts).encode()).hexdigest()[:16]
        return {
            "api": self.api,
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "timeout_s": self.timeout_s,
            "prompts": len(self.prompts),
            "prompts_sha256": digest,
            "prompt_set": "builtin" if self.prompts == PROMPTS else "file",
        }


@dataclass(frozen=True)
class Target:
    url: str
    label: str
    model: str = "auto"
    pid: int | None = None
    launch: str | None = None
    api_key: str = "not-needed"  # the SDK insists on a key; servers without auth ignore it

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "url": self.url, "model": self.model, "pid": self.pid, "launch": self.launch}


def summarize(outcomes: Sequence[Outcome], wall_s: float) -> dict[str, Any]:
    """One level's figures. Tokens and times are of the answered requests only."""
    ok = [o for o in outcomes if o.ok]
    refused = sum(1 for o in outcomes if o.error == "503")
    errors = Counter(o.error for o in outcomes if o.error is not None and o.error != "503")
    tokens = sum(o.output_tokens for o in ok)
    with_usage = sum(1 for o in ok if o.usage_reported)
    source = None if not ok else "usage" if with_usage == len(ok) else "chunks" if with_usage == 0 else "mixed"
    per_token = [
        (o.latency_s - o.ttft_s) / (o.output_tokens - 1) for o in ok if o.ttft_s is not None and o.output_tokens > 1
    ]
    return {
        "requests": len(outcomes),
        "ok": len(ok),
        "refused_503": refused,
        "errors": dict(sorted(errors.items())),
        "wall_s": _r(wall_s),
        "output_tokens": tokens,
        "output_tok_s": _r(tokens / wall_s if wall_s > 0 else 0.0),
        "requests_s": _r(len(ok) / wall_s if wall_s > 0 else 0.0),
        "finish_reasons": dict(sorted(Counter(o.finish_reason or "none" for o in ok).items())),
        "tokens_source": source,
        "ttft_ms": distribution_ms([o.ttft_s for o in ok if o.ttft_s is not None]),
        "latency_ms": distribution_ms([o.latency_s for o in ok]),
        "decode_ms_per_token": distribution_ms(per_token),
    }


# ---- the load generators ----------------------------------------------------------------------------

Send = Callable[[int, float], Awaitable[Outcome]]


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


def _schedule_lag(outcomes: Sequence[Outcome], schedule: Sequence[float]) -> dict[str, Any]:
    """How late the client sent each request against its schedule: near zero, or the client itself
    was the bottleneck."""
    return distribution_ms([max(0.0, o.sent_s - schedule[o.index]) for o in outcomes])


def _openai_client(target: Target, workload: Workload) -> openai.AsyncOpenAI:
    import openai

    return openai.AsyncOpenAI(
        base_url=target.url, api_key=target.api_key, max_retries=0, timeout=workload.timeout_s
    )


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


async def _warm_up(send: Send, n: int) -> None:
    start = time.perf_counter()
    for index in range(n):
        await send(index, start)


# ---- sweep ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Level:
    kind: str  # "concurrency" or "rate"
    value: float

    @property
    def name(self) -> str:
        return f"c={self.value:g}" if self.kind == "concurrency" else f"{self.value:g} req/s"


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
) -> dict[str, Any]:
    client = _openai_client(target, workload)
    send = streamed_request(client, target, workload)
    result: dict[str, Any] = {**target.describe(), "memory_start": read_memory(target.pid), "levels": []}
    try:
        await _warm_up(send, warmup)
        for level in levels:
            async with MemoryWatch(target.pid) as memory:
                if level.kind == "concurrency":
                    outcomes, wall = await closed_loop(
                        send, int(level.value), requests=requests, duration_s=duration_s
                    )
                    extra: dict[str, Any] = {}
                else:
                    n = requests if requests is not None else max(1, round(level.value * (duration_s or 0)))
                    schedule = arrivals(level.value, n, seed=seed)
                    outcomes, wall = await open_loop(send, schedule)
                    extra = {"arrivals": "poisson", "seed": seed}
                    extra["schedule_lag_ms"] = _schedule_lag(outcomes, schedule)
            row: dict[str, Any] = {level.kind: level.value, **summarize(outcomes, wall), **extra}
            row["memory"] = memory.result()
            row["per_request"] = [o.to_dict() for o in outcomes]
            result["levels"].append(row)
            if progress is not None:
                progress(
                    f"[{target.label}] {level.name}: {row['ok']}/{row['requests']} ok, "
                    f"{row['refused_503']} refused, {row['output_tok_s']:.1f} tok/s, "
                    f"TTFT p95 {_fmt(row['ttft_ms']['p95'], 0)} ms"
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


# ---- burst ------------------------------------------------------------------------------------------


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
    client = _openai_client(target, workload)
    send = streamed_request(client, target, workload)
    try:
        await _warm_up(send, warmup)
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
                    f"{sum(row['errors'].values())} other errors; RSS {_fmt(row['rss_before_mib'])} -> "
                    f"{_fmt(row['rss_after_mib'])} -> {_fmt(row['rss_settled_mib'])} MiB after {settle_s:g} s"
                )
        alive = await _answers(client)
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


async def _answers(client: openai.AsyncOpenAI) -> bool:
    import openai

    try:
        await client.models.list()
    except openai.APIError:
        return False
    return True


# ---- overhead -----------------------------------------------------------------------------------------


class ServerTiming:
    """ASGI wrapper that reports the app's own time per request in a `Server-Timing` header: from
    the request reaching the app to the response starting (the whole body, for a JSON answer)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()

        async def timed(message: Any) -> None:
            if message["type"] == "http.response.start":
                dur = (time.perf_counter() - t0) * 1000.0
                headers = [*message.get("headers", []), (b"server-timing", f"app;dur={dur:.4f}".encode())]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, timed)


def instant_settings(settings: Settings, *, verifiers: str, ledger_path: Path) -> Settings:
    """The config as the overhead mode serves it: on loopback without keys, with a scratch ledger,
    and with the tiers' verifiers as configured or removed."""
    tiers = [t.model_copy(update={"verifiers": []}) if verifiers == "none" else t for t in settings.tiers]
    server = settings.server.model_copy(
        update={"host": "127.0.0.1", "allow_unauthenticated": True, "api_keys": []}
    )
    ledger = settings.ledger.model_copy(update={"path": ledger_path})
    return settings.model_copy(update={"tiers": tiers, "server": server, "ledger": ledger})


def _serve_instant(config: str | None, port: int, verifiers: str, scratch: str, errors: Connection) -> None:
    """Child process: the app with an instant backend behind every tier, under uvicorn."""
    try:
        import uvicorn

        from router.api.app import create_app
        from router.backends.instant import InstantBackend
        from router.config import load_settings
        from verifiers.base import Registry

        settings = instant_settings(
            load_settings(config), verifiers=verifiers, ledger_path=Path(scratch) / "ledger.sqlite3"
        )
        extra: dict[str, Any] = {"registry": Registry()} if verifiers == "none" else {}
        app = create_app(settings, backends={t.name: InstantBackend(t.name) for t in settings.tiers}, **extra)
        server = uvicorn.Server(
            uvicorn.Config(ServerTiming(app), host="127.0.0.1", port=port, log_level="warning", access_log=False)
        )
    except Exception as exc:  # the parent prints it; a traceback from a child helps nobody
        errors.send(f"{type(exc).__name__}: {exc}")
        return
    server.run()


@contextlib.contextmanager
def instant_service(
    config: str | os.PathLike[str] | None, *, verifiers: str = "config", start_timeout_s: float = 60.0
) -> Iterator[tuple[str, int]]:
    """Run the service with instant backends in a child process (its own interpreter, so the load
    generator does not share its GIL); yield its base URL and pid."""
    import multiprocessing

    import httpx

    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    receive, send = ctx.Pipe(duplex=False)
    with tempfile.TemporaryDirectory(prefix="tierroute-bench-") as scratch:
        proc = ctx.Process(
            target=_serve_instant,
            args=(None if config is None else str(config), port, verifiers, scratch, send),
            name="tierroute-bench-instant",
        )
        proc.start()
        send.close()
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + start_timeout_s
            while True:
                if not proc.is_alive():
                    why = f"exit code {proc.exitcode}"
                    with contextlib.suppress(EOFError, OSError):
                        if receive.poll(1):
                            why = receive.recv()
                    raise BenchError(f"the instant-backend service did not start: {why}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise BenchError(f"the instant-backend service did not answer within {start_timeout_s:g} s")
                time.sleep(0.1)
            assert proc.pid is not None
            yield url, proc.pid
        finally:
            proc.terminate()
            proc.join(15)
            if proc.is_alive():
                proc.kill()
                proc.join()
            receive.close()


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
                out.latency_s = out.ttft_s = time.perf_counter() - t0
                return out

            return send

        schedule = arrivals(rate, max(1, round(rate * seconds)), kind=kind, seed=seed)
        send = sender(chat=True)
        await _warm_up(send, warmup)
        async with MemoryWatch(pid) as memory:
            outcomes, wall = await open_loop(send, schedule)
        floor_outcomes: list[Outcome] = []
        if floor:
            await _warm_up(sender(chat=False), warmup)
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
        "offered_rate": _r((len(schedule) - 1) / span if span > 0 else None),
        "wall_s": _r(wall),
        "client_ms": distribution_ms([o.latency_s for o in ok]),
        "server_ms": distribution_ms([o.server_ms / 1000.0 for o in ok if o.server_ms is not None]),
        "schedule_lag_ms": _schedule_lag(outcomes, schedule),
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
) -> dict[str, Any]:
    from router.config import load_settings

    settings = load_settings(config)
    with instant_service(config, verifiers=verifiers) as (url, pid):
        result = asyncio.run(
            drive_overhead(
                url, rate=rate, seconds=seconds, kind=kind, model=model, max_tokens=max_tokens,
                seed=seed, warmup=warmup, floor=floor, pid=pid,
            )
        )
    result["verifiers"] = {
        t.name: [] if verifiers == "none" else [v.name for v in t.verifiers] for t in settings.tiers
    }
    result["verifiers_mode"] = verifiers
    result["config"] = str(config) if config is not None else "(bundled config.toml)"
    return result


# ---- launching servers ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers_now(target: Target) -> bool:
    import httpx

    try:
        response = httpx.get(
            f"{target.url.rstrip('/')}/models", headers={"authorization": f"Bearer {target.api_key}"}, timeout=2
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 200


@contextlib.contextmanager
def serving(target: Target, *, start_timeout_s: float = 300.0) -> Iterator[Target]:
    """The target, started by its `launch` command when it has one (and stopped afterwards), with
    the pid to watch."""
    if target.launch is None:
        yield target
        return
    if _answers_now(target):
        raise BenchError(f"{target.label}: something already answers at {target.url}; it would be measured instead")
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        shlex.split(target.launch),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a Ctrl-C reaches the bench, which stops the server itself
    )
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _answers_now(target):
            if proc.poll() is not None:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-2000:]
                raise BenchError(f"{target.label}: launched server exited with {proc.returncode}:\n{tail}")
            if time.monotonic() > deadline:
                raise BenchError(f"{target.label}: launched server did not answer within {start_timeout_s:g} s")
            time.sleep(0.3)
        yield replace(target, pid=target.pid or proc.pid)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


# ---- the command line -------------------------------------------------------------------------------


class _TargetOption(argparse.Action):
    """`--url` opens a target; the target options after it belong to that target. Given before any
    `--url`, a target option applies to every target."""

    def __init__(self, option_strings: list[str], dest: str, field: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.field = field

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        spec = getattr(namespace, self.dest, None)
        if spec is None:
            spec = {"defaults": {}, "targets": []}
            setattr(namespace, self.dest, spec)
        if self.field == "url":
            spec["targets"].append({"url": values})
            return
        into = spec["targets"][-1] if spec["targets"] else spec["defaults"]
        if self.field in into:
            parser.error(f"{option_string} given twice for the same target")
        into[self.field] = values


def _targets(args: argparse.Namespace) -> list[Target]:
    spec = args.targets or {"defaults": {}, "targets": []}
    if not spec["targets"]:
        raise BenchError("name at least one server with --url (its base URL, e.g. http://127.0.0.1:8000/v1)")
    out: list[Target] = []
    for i, given in enumerate(spec["targets"]):
        merged = {**spec["defaults"], **given}
        key_env = merged.pop("api_key_env", None)
        api_key = "not-needed"
        if key_env is not None:
            api_key = os.environ.get(key_env, "")
            if not api_key:
                raise BenchError(f"--api-key-env names {key_env}, which is not set")
        label = merged.pop("label", None) or f"target{i + 1}"
        out.append(Target(label=label, api_key=api_key, **merged))
    labels = [t.label for t in out]
    if len(set(labels)) != len(labels):
        raise BenchError(f"two targets share a label: {labels}")
    return out


def _workload(args: argparse.Namespace) -> Workload:
    prompts = PROMPTS
    if args.prompts:
        lines = [line for line in Path(args.prompts).read_text().splitlines() if line.strip()]
        if not lines:
            raise BenchError(f"{args.prompts}: no prompts (one per line)")
        prompts = tuple(lines)
    return Workload(api=args.api, max_tokens=args.max_tokens, timeout_s=args.timeout, prompts=prompts)


def _header(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    options = {k: v_ for k, v_ in vars(args).items() if k not in ("handler", "targets")}
    return {
        "tool": f"tierroute bench {mode}",
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "options": options,
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "tierroute": v("tierroute"),
            "openai": v("openai"),
            "llama_cpp_python": v("llama_cpp_python"),
        },
    }


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _write_json(path: str | None, report: dict[str, Any], *, quiet: bool = False) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2) + "\n")
        if not quiet:
            _progress(f"wrote {path}")


def _console() -> Any:
    from rich.console import Console

    console = Console(highlight=False)
    # redirected to a file, the tables keep one line per row instead of rich's default 80 columns
    return console if console.is_terminal else Console(highlight=False, width=160)


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _triple(d: dict[str, Any]) -> str:
    return " / ".join(_fmt(d[k], 0) for k in ("p50", "p95", "p99"))


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.table import Table

    targets = _targets(args)
    workload = _workload(args)
    if args.poisson:
        levels = [Level("rate", r) for r in args.poisson]
    else:
        levels = [Level("concurrency", c) for c in args.concurrency]
    requests = None if args.duration is not None else args.requests
    report: dict[str, Any] = {**_header(args, "sweep"), "workload": workload.describe(), "targets": []}
    failed = False
    for target in targets:
        try:
            with serving(target, start_timeout_s=args.launch_timeout) as live:
                _progress(f"[{live.label}] {live.url} (pid {live.pid or 'unknown'})")
                result = asyncio.run(
                    sweep_target(
                        live, workload, levels, requests=requests, duration_s=args.duration,
                        warmup=args.warmup, seed=args.seed, progress=_progress,
                    )
                )
        except BenchError as exc:
            _progress(f"error: {exc}")
            result, failed = {**target.describe(), "error": str(exc)}, True
        report["targets"].append(result)
        _write_json(args.json, report, quiet=True)  # a long run cut short keeps what it measured
    report["comparison"] = compare(report["targets"])

    table = Table(
        "target", "level", "ok", "503", "err", "out tok/s", "req/s",
        "TTFT ms p50/p95/p99", "latency ms p50/p95/p99", "peak RSS MiB",
        title=f"tierroute bench sweep: {workload.api}, max_tokens {workload.max_tokens}",
    )
    for t in report["targets"]:
        for row in t.get("levels", []):
            level = Level("concurrency" if "concurrency" in row else "rate", row.get("concurrency", row.get("rate")))
            memory = row["memory"] or {}
            table.add_row(
                t["label"], level.name, str(row["ok"]), str(row["refused_503"]), str(sum(row["errors"].values())),
                _fmt(row["output_tok_s"]), _fmt(row["requests_s"], 2), _triple(row["ttft_ms"]),
                _triple(row["latency_ms"]), _fmt(memory.get("peak_rss_mib")),
            )
    console = _console()
    console.print(table)
    if report["comparison"]:
        ratios = Table("level", "of / to", "tok/s ratio", "TTFT p95 ratio", "latency p95 ratio", title="relative")
        for c in report["comparison"]:
            key = "concurrency" if "concurrency" in c else "rate"
            ratios.add_row(
                Level(key, c[key]).name, f"{c['of']} / {c['to']}", _fmt(c["output_tok_s_ratio"], 2),
                _fmt(c["ttft_p95_ratio"], 2), _fmt(c["latency_p95_ratio"], 2),
            )
        console.print(ratios)
    _write_json(args.json, report)
    unanswered = any(level["ok"] == 0 for t in report["targets"] for level in t.get("levels", []))
    return 1 if failed or unanswered else 0


def cmd_burst(args: argparse.Namespace) -> int:
    from rich.table import Table

    targets = _targets(args)
    if len(targets) != 1:
        raise BenchError("burst measures one server: give one --url")
    workload = _workload(args)
    with serving(targets[0], start_timeout_s=args.launch_timeout) as live:
        _progress(f"[{live.label}] {live.url} (pid {live.pid or 'unknown'})")
        result = asyncio.run(
            burst_target(
                live, workload, requests=args.requests, concurrency=args.concurrency, rounds=args.rounds,
                settle_s=args.settle, warmup=args.warmup, progress=_progress,
            )
        )
    report = {**_header(args, "burst"), "workload": workload.describe(), "target": result}
    table = Table(
        "round", "requests", "answered", "refused 503", "other errors", "latency ms p50/p95/p99",
        "RSS MiB before", "after", "settled",
        title=f"tierroute bench burst: {args.requests} requests at concurrency {args.concurrency}, {live.label}",
    )
    for row in result["rounds"]:
        table.add_row(
            str(row["round"]), str(row["requests"]), str(row["ok"]), str(row["refused_503"]),
            ", ".join(f"{k}: {v}" for k, v in row["errors"].items()) or "0", _triple(row["latency_ms"]),
            _fmt(row["rss_before_mib"]), _fmt(row["rss_after_mib"]), _fmt(row["rss_settled_mib"]),
        )
    console = _console()
    console.print(table)
    verdict = result["verdict"]
    console.print(
        f"still answering: {'yes' if verdict['alive_after'] else 'NO'}; every request answered or 503: "
        f"{'yes' if verdict['every_request_answered_or_503'] else 'NO'}; RSS growth first -> last round: "
        f"{_fmt(verdict['rss_growth_first_to_last_round_mib'])} MiB"
    )
    _write_json(args.json, report)
    return 0 if verdict["alive_after"] and verdict["every_request_answered_or_503"] else 1


def cmd_overhead(args: argparse.Namespace) -> int:
    from rich.table import Table

    result = run_overhead(
        args.config, rate=args.rate, seconds=args.seconds, kind=args.arrivals, verifiers=args.verifiers,
        model=args.model, max_tokens=args.max_tokens, seed=args.seed, warmup=args.warmup, floor=args.floor,
    )
    report = {**_header(args, "overhead"), **result}
    table = Table(
        "measure", "p50 ms", "p95 ms", "p99 ms", "max ms",
        title=(
            f"router overhead: {result['requests']} requests, {args.arrivals} arrivals at {args.rate:g}/s, "
            f"instant backends, verifiers: {args.verifiers}"
        ),
    )
    rows = [
        ("client latency", result["client_ms"]),
        ("app time (Server-Timing)", result["server_ms"]),
        ("client send lag", result["schedule_lag_ms"]),
    ]
    if result["floor"] is not None:
        rows.append(("floor: GET /healthz, client", result["floor"]["client_ms"]))
    for name, d in rows:
        table.add_row(name, _fmt(d["p50"], 2), _fmt(d["p95"], 2), _fmt(d["p99"], 2), _fmt(d["max"], 2))
    console = _console()
    console.print(table)
    memory = result["memory"] or {}
    console.print(
        f"ok {result['ok']}/{result['requests']}, errors {result['errors'] or 0}, answered by {result['tiers']}, "
        f"verifiers {result['verifiers']}, peak RSS {_fmt(memory.get('peak_rss_mib'))} MiB"
    )
    _write_json(args.json, report)
    return 0 if result["ok"] == result["requests"] else 1


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("expected positive integers")
    return values


def _rate_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rates separated by commas, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError("expected positive rates")
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("expected a positive whole number")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("expected a positive number")
    return value


def _client_options(p: argparse.ArgumentParser, *, max_tokens: int) -> None:
    g = p.add_argument_group(
        "servers", "--url starts a server's options; the options after it are that server's own"
    )
    g.add_argument("--url", action=_TargetOption, field="url", dest="targets", metavar="URL",
                   help="base URL including /v1; repeat to measure several servers in one run")
    g.add_argument("--label", action=_TargetOption, field="label", dest="targets", metavar="NAME",
                   help="name in the report")
    g.add_argument("--model", action=_TargetOption, field="model", dest="targets", metavar="NAME",
                   help="model name sent (default: auto)")
    g.add_argument("--pid", action=_TargetOption, field="pid", dest="targets", type=int, metavar="PID",
                   help="server process on this machine whose resident memory is sampled")
    g.add_argument("--launch", action=_TargetOption, field="launch", dest="targets", metavar="CMD",
                   help="start the server with CMD before its turn and stop it after (its pid is watched)")
    g.add_argument("--api-key-env", action=_TargetOption, field="api_key_env", dest="targets", metavar="VAR",
                   help="environment variable holding the server's API key")
    p.add_argument("--launch-timeout", type=_positive_float, default=300.0, help="seconds a launched server may take")
    api = p.add_mutually_exclusive_group()
    api.add_argument("--chat", dest="api", action="store_const", const="chat", help="/v1/chat/completions (default)")
    api.add_argument("--completions", dest="api", action="store_const", const="completions", help="/v1/completions")
    p.set_defaults(api="chat", targets=None)
    p.add_argument("--max-tokens", type=_positive_int, default=max_tokens, help="output length asked of every request")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="one prompt per line instead of the built-in set of 16")
    p.add_argument("--timeout", type=_positive_float, default=600.0, help="seconds per request")
    p.add_argument("--warmup", type=int, default=2, help="requests sent and not counted before measuring")
    p.add_argument("--json", default=None, metavar="PATH", help="write every number here")


def register(sub: Any, add: Any) -> None:
    bench = sub.add_parser("bench", help="measure throughput, latency, memory and the router's overhead")
    bsub = bench.add_subparsers(dest="bench_command", metavar="MODE", required=True)

    p = add("sweep", "streamed load at rising concurrency (or Poisson rates) against OpenAI-compatible servers",
            cmd_sweep, bsub)
    _client_options(p, max_tokens=128)
    p.add_argument("--concurrency", type=_int_list, default=[1, 2, 4, 8, 16], metavar="1,2,4,8,16")
    p.add_argument("--poisson", type=_rate_list, default=None, metavar="RATES",
                   help="open-loop Poisson arrivals at these rates (req/s) instead of the concurrency sweep")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--requests", type=_positive_int, default=32, help="requests per level (default 32)")
    size.add_argument("--duration", type=_positive_float, default=None, help="seconds per level instead")
    p.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrival times")

    p = add("burst", "a burst of requests at high concurrency, in rounds: answered, refused, memory", cmd_burst, bsub)
    _client_options(p, max_tokens=32)
    p.add_argument("--requests", type=_positive_int, default=500, help="requests per round")
    p.add_argument("--concurrency", type=_positive_int, default=64)
    p.add_argument("--rounds", type=_positive_int, default=2, help="bursts in a row; memory is compared between them")
    p.add_argument("--settle", type=float, default=5.0, help="seconds to wait after a round before reading memory")

    p = add("overhead", "the router's own latency: every tier an instant backend, open-loop at a rate",
            cmd_overhead, bsub)
    p.add_argument("--rate", type=_positive_float, default=100.0, help="requests per second")
    p.add_argument("--seconds", type=_positive_float, default=10.0)
    p.add_argument("--arrivals", choices=("poisson", "uniform"), default="poisson")
    p.add_argument("--verifiers", choices=("config", "none"), default="config",
                   help="keep the tiers' configured verifiers (router work too), or remove them")
    p.add_argument("--model", default="auto", help="model name sent (auto runs the cascade)")
    p.add_argument("--max-tokens", type=_positive_int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=50, help="requests sent and not counted before measuring")
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="skip the second pass against /healthz (the HTTP floor, no router work)")
    p.add_argument("--json", default=None, metavar="PATH", help="write every number here")
