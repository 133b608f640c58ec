"""The fault-injecting upstream (`tests.support.fault_upstream`) as a real process with one fault
for every request it gets: what the deployment fault matrix and the balancing test run against.

    python -m tests.support.fault_process --port 8101 --mode 500

Modes: `ok` (a correct answer, after `--delay` seconds), `slow` (the same, 1 s by default), `500`,
`hang` (accept and say nothing), `reset` (a TCP reset), `429` (with `Retry-After: 1`), and `cut`
(a stream closed before its first token; a plain answer cut mid-JSON), `late` (a stream closed after
two tokens; a plain answer whole), `stall` (a stream that sends one token and then nothing; a plain
answer's headers and a few bytes, then nothing), `huge` (a 200 whose body is 64 MiB of spaces), and
`garbage` (a 200 of HTML, as a proxy's error page), `endless` (a stream of tokens that never ends). A process, not a thread,
so that the router under test and the upstream do not share an interpreter, as in production.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.fault_upstream import (
    Action,
    Endless,
    FaultUpstream,
    Received,
    _Conn,
    broken_stream,
    delayed,
    hang,
    malformed,
    ok,
    oversized,
    raw,
    reset,
    stalled_body,
    status,
)

ROOT = Path(__file__).resolve().parents[2]
MODES = ("ok", "slow", "500", "hang", "reset", "429", "cut", "late", "stall", "huge", "garbage", "endless")


def _cut(after: int = 0) -> Action:
    stream, plain = broken_stream(after, "cut"), malformed() if after == 0 else ok()

    async def act(conn: _Conn, req: Received) -> bool:
        return await (stream if req.streaming else plain)(conn, req)

    return act


def _stall() -> Action:
    stream, plain = broken_stream(1, "hang"), stalled_body(600.0)

    async def act(conn: _Conn, req: Received) -> bool:
        return await (stream if req.streaming else plain)(conn, req)

    return act


def action(mode: str, delay: float) -> Action:
    made: dict[str, Action] = {
        "ok": delayed(delay, ok()) if delay else ok(),
        "slow": delayed(delay or 1.0, ok()),
        "500": status(500, "scripted outage"),
        "hang": hang(600.0),
        "reset": reset(),
        "429": status(429, "slow down", headers={"Retry-After": "1"}),
        "cut": _cut(),
        "late": _cut(after=2),
        "stall": _stall(),
        "huge": oversized(64 * 1024 * 1024, declare=False),
        "garbage": raw(200, b"<html><body>502 Bad Gateway</body></html>", content_type="text/html"),
        "endless": Endless(),
    }
    return made[mode]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer (ok, slow)")
    args = parser.parse_args(argv)
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # before the server's thread starts: it inherits the mask
    with FaultUpstream(default=action(args.mode, args.delay), bind_port=args.port):
        signal.sigwait(stop)


@contextlib.contextmanager
def fault_process(mode: str, *, port: int, delay: float = 0.0) -> Iterator[str]:
    """The upstream in `mode` as a child process on `port`, until the block ends; yields its base URL."""
    command = [sys.executable, "-m", "tests.support.fault_process", "--port", str(port), "--mode", mode]
    proc = subprocess.Popen(
        [*command, "--delay", str(delay)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"fault upstream exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"fault upstream ({mode}) did not listen on {port}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
