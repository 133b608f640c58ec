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
With `--then MODE`, SIGUSR1 switches it to that mode (a deployment in use, then faulty, without a
new process on its port: `fault_processes` starts several at once and `Running.switch` flips one).
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
from dataclasses import dataclass
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
    parser.add_argument("--then", choices=MODES, help="the mode SIGUSR1 switches to (acknowledged on stdout)")
    args = parser.parse_args(argv)
    stop = {signal.SIGTERM, signal.SIGINT}
    signals = {*stop, signal.SIGUSR1}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # before the server's thread starts: it inherits the mask
    # its mode is the server's state: the tier's outage probe meets it as every request does
    with FaultUpstream(default=action(args.mode, args.delay), bind_port=args.port, outage_probe=None) as upstream:
        while signal.sigwait(signals) not in stop:
            if args.then:
                upstream.default = action(args.then, args.delay)
                print(f"switched {args.then}", flush=True)


@dataclass
class Running:
    """A started fault upstream process: its base URL, and `switch()` to its `then` mode."""

    url: str
    mode: str
    proc: subprocess.Popen[bytes]

    def switch(self) -> None:
        """Into the `then` mode it was started with; returns once the process says every later
        request meets it (a request already in flight finishes in the mode it began in)."""
        assert self.proc.stdout is not None
        self.proc.send_signal(signal.SIGUSR1)
        said = self.proc.stdout.readline().decode()
        if not said.startswith("switched"):
            raise RuntimeError(f"fault upstream ({self.mode}) did not switch: {said!r}")


def _start(mode: str, port: int, delay: float, then: str | None) -> Running:
    command = [sys.executable, "-m", "tests.support.fault_process", "--port", str(port), "--mode", mode]
    proc = subprocess.Popen(
        [*command, "--delay", str(delay), *(["--then", then] if then else [])],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return Running(f"http://127.0.0.1:{port}/v1", mode, proc)


def _listening(running: Running, port: int) -> None:
    proc = running.proc
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"fault upstream exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"fault upstream ({running.mode}) did not listen on {port}")
        time.sleep(0.05)


def _stop(started: list[Running]) -> None:
    for running in started:
        running.proc.terminate()
    for running in started:
        try:
            running.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            running.proc.kill()
            running.proc.wait()


@contextlib.contextmanager
def fault_processes(*specs: tuple[str, int, float, str | None]) -> Iterator[list[Running]]:
    """Several upstreams, each `(mode, port, delay, then)`, started side by side (each process's
    start is mostly its interpreter's imports: one after another they cost their sum) and stopped
    together when the block ends."""
    started: list[Running] = []
    try:
        for mode, port, delay, then in specs:
            started.append(_start(mode, port, delay, then))
        for running, (_, port, _, _) in zip(started, specs, strict=True):
            _listening(running, port)
        yield started
    finally:
        _stop(started)


@contextlib.contextmanager
def fault_process(mode: str, *, port: int, delay: float = 0.0) -> Iterator[str]:
    """The upstream in `mode` as a child process on `port`, until the block ends; yields its base URL."""
    with fault_processes((mode, port, delay, None)) as [running]:
        yield running.url


if __name__ == "__main__":
    main()
