"""Servers the bench starts itself (`--launch CMD`): started before their turn, stopped after.

A launched server is measured alone, and its memory is watched by its own pid. Something already
answering at the URL is refused rather than measured in its place.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from router.bench.workload import BenchError, Target


def free_port() -> int:
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
    restore = _stop_on_sigterm()
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
        restore()


def _stop_on_sigterm() -> Callable[[], None]:
    """While a launched server runs, a SIGTERM to the bench unwinds it like Ctrl-C, so the server
    (in its own session, out of reach of the signal) is stopped rather than left running. Returns
    what puts the previous handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore
