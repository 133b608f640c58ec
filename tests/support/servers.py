"""Servers on loopback for the tests: uvicorn in a thread, `tierroute serve` and
llama-cpp-python's server as child processes, each on a free port (so parallel workers never collide)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from tests.support.markers import FastLoop


def free_port() -> int:
    """A loopback port free now, for a child process to listen on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_held: list[socket.socket] = []


def dead_port() -> int:
    """A loopback port where a connection is refused for as long as this process lives: bound and
    never listening, so a server another test (or another xdist worker) starts cannot take it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _held.append(s)
    return int(s.getsockname()[1])


class UvicornThread:
    """A real uvicorn server on 127.0.0.1 in a background thread."""

    def __init__(self, app: object) -> None:
        import uvicorn

        # bound here and handed to uvicorn: no window between choosing the port and taking it
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port = int(self.socket.getsockname()[1])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> UvicornThread:
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()


def wait_until_up(proc: subprocess.Popen[bytes], url: str, *, timeout: float, why_exited: Callable[[], str]) -> None:
    """Poll url until it answers 200; fail at once, with why_exited(), if the process dies."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {why_exited()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up within {timeout:.0f} s")
        time.sleep(0.2)


TIERROUTE = str(Path(sys.executable).parent / "tierroute")


# a child's port is chosen before it starts and taken only once its start-up is done (seconds; tens
# on a loaded machine), and anything else on the machine that binds a free port meanwhile may take
# it: uvicorn then exits 3, "address already in use". The child is started again on another port.
PORT_TRIES = 3
PORT_TAKEN = "address already in use"


@contextlib.contextmanager
def serve_process(
    cfg: Path, *, log_path: Path | None = None, log_level: str = "info", env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str, Callable[[], str]]]:
    """`tierroute serve` in a child process on a free loopback port, ready when it is yielded with
    its URL and a function that returns its output so far; stopped gracefully (SIGTERM: drain, close
    the ledger), killed after 60 s. The output goes to `log_path`, or, without one, through a pipe
    (for tests that fail the disk, where a log file would fail too). `env` adds to its environment.
    A child whose port was taken while it started is started again on another (`PORT_TRIES`)."""
    FastLoop.check("starts `tierroute serve`")
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    for attempt in range(PORT_TRIES):
        port = free_port()
        command = [TIERROUTE, "--config", str(cfg), "serve", "--port", str(port), "--log-level", log_level]
        proc, output, reader = _spawn(command, log_path, full_env)
        taken_before = output().count(PORT_TAKEN)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_up(proc, f"{url}/readyz", timeout=180, why_exited=functools.partial(_ends_of, output))
        except RuntimeError:
            _stop(proc, reader)
            if attempt + 1 < PORT_TRIES and proc.returncode == 3 and output().count(PORT_TAKEN) > taken_before:
                continue
            raise
        break
    try:
        yield proc, url, output
    finally:
        _stop(proc, reader)


def _spawn(
    command: list[str], log_path: Path | None, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], Callable[[], str], threading.Thread | None]:
    if log_path is not None:
        with log_path.open("ab") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        return proc, lambda: log_path.read_text(errors="replace"), None
    lines: list[str] = []
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    pipe = proc.stdout
    assert pipe is not None
    reader = threading.Thread(target=lambda: lines.extend(x.decode(errors="replace") for x in pipe), daemon=True)
    reader.start()
    return proc, lambda: "".join(lines), reader


def _stop(proc: subprocess.Popen[bytes], reader: threading.Thread | None) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if reader is not None:
        reader.join(5)


@contextlib.contextmanager
def llama_cpp_server(model: Path, *, n_threads: int = 1) -> Iterator[str]:
    """llama-cpp-python's own OpenAI-compatible server, as a real process on loopback."""
    FastLoop.check("starts llama-cpp-python's server")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model),
            "--model_alias",
            "smol",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "2048",
            "--n_threads",
            str(n_threads),
            "--verbose",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_up(
            proc,
            f"{base}/models",
            timeout=120,
            why_exited=lambda: proc.stderr.read().decode()[-2000:],  # type: ignore[union-attr]
        )
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ends_of(output: Callable[[], str]) -> str:
    return _ends(output())


def _ends(text: str, each: int = 2000) -> str:
    """A dead server's output for the failure message: its head too, where the first error of a
    chained traceback is (a lifespan failure's tail is only the chain's re-raises)."""
    if len(text) <= 2 * each:
        return text
    return f"{text[:each]}\n[... {len(text) - 2 * each} characters ...]\n{text[-each:]}"
