"""A lean open-loop HTTP/1.1 load generator: what `bench gateway` drives every server with.

At 1,000 requests a second on two cores the load generator shares the CPU with the server it
measures, and an SDK client (openai over httpx) spends about as long on a request as the gateway
does. This one writes a prepared request on a kept-alive connection (a new one when none is idle)
and reads the status line, the headers it needs and the body by Content-Length: tens of
microseconds a request. Nothing is retried: a connection that closes or a reply that does not come
within the timeout is counted as lost, which is what the benchmark exists to catch.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Reply:
    """One request as the client saw it."""

    index: int
    sent_s: float  # from the level's start
    latency_s: float = 0.0
    status: int = 0  # 0: no reply (see `error`)
    retry_after: str | None = None
    error: str | None = None  # "timeout", "connection": lost


def request_bytes(host: str, port: int, path: str, body: bytes, api_key: str | None) -> bytes:
    auth = f"authorization: Bearer {api_key}\r\n" if api_key else ""
    return (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"{auth}content-length: {len(body)}\r\n\r\n"
    ).encode() + body


class Connections:
    """Kept-alive connections to one server, each used by one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened = 0

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opened += 1
        return reader, writer

    async def send(self, data: bytes, out: Reply, timeout_s: float) -> None:
        conn = self.idle.pop() if self.idle else None
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                if conn is None:
                    conn = await self._connect()
                reader, writer = conn
                writer.write(data)
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                out.status = int(lines[0].split(b" ", 2)[1])
                length, close = 0, False
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"retry-after":
                        out.retry_after = value.strip().decode()
                    elif name == b"connection" and value.strip().lower() == b"close":
                        close = True
                if length:
                    await reader.readexactly(length)
        except TimeoutError:
            out.error = "timeout"
            close = True
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError):
            out.error = "connection"
            close = True
        out.latency_s = time.perf_counter() - t0
        if conn is None:
            return
        if close:
            conn[1].close()
        else:
            self.idle.append(conn)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def open_loop(
    conns: Connections, data: bytes, schedule: Sequence[float], *, timeout_s: float = 30.0
) -> tuple[list[Reply], float]:
    """Send request i at schedule[i] seconds from the start, whether or not earlier ones ended."""
    start = time.perf_counter()
    replies: list[Reply] = []
    tasks: list[asyncio.Task[None]] = []
    for index, at in enumerate(schedule):
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        reply = Reply(index=index, sent_s=time.perf_counter() - start)
        replies.append(reply)
        tasks.append(asyncio.create_task(conns.send(data, reply, timeout_s)))
    await asyncio.gather(*tasks)
    return replies, time.perf_counter() - start


async def warm(conns: Connections, data: bytes, n: int, concurrency: int = 8) -> None:
    """A few requests first, so connections and the server's caches are warm before timing."""
    for _ in range(max(1, n // concurrency)):
        await asyncio.gather(*(conns.send(data, Reply(0, 0.0), 10.0) for _ in range(concurrency)))
