"""A real vLLM server for the tests, started through the same script a user runs (scripts/vllm/env.sh).

One process serves a whole session (tests/scripts/vllm/conftest.py): on this 2-core machine
it takes 1-4 minutes to start (loading, then torch.compile's warm-up, cached between runs in
~/.cache/vllm). A test that kills it (failover) asks for it again afterwards and gets a new one
(`ensure_up`). It runs in its own process group, so a kill reaches vLLM's engine and worker
processes too, not only the API server.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.backends.openai import OpenAIBackend
from router.config import OpenAIBackendSettings
from tests.support.markers import FastLoop
from tests.support.servers import free_port

REPO = Path(__file__).resolve().parents[2]
ENV_SH = REPO / "scripts" / "vllm" / "env.sh"
MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"
START_TIMEOUT_S = 900.0
KEY_ENV = "TIERROUTE_TEST_VLLM_KEY_VALUE"  # the variable a tier's api_key_env names: the session's key


def _script(command: str) -> str:
    return subprocess.run([str(ENV_SH), command], check=True, capture_output=True, text=True).stdout.strip()


def cannot_run_here() -> str | None:
    """Why vLLM's CPU build cannot run on this machine, or None (`env.sh machine`, which
    `make vllm-test` asks before it builds anything). Only the machine is a reason: a missing
    environment or checkpoint is an error (`make vllm-test` builds both)."""
    return _script("machine") or None


def missing_setup() -> str | None:
    python = Path(_script("python"))
    if not (python.parent.parent / ".installed").is_file():
        return f"vLLM's environment is not built ({python.parent.parent}): run `make vllm-test`"
    if not (Path(_script("checkpoint")) / "SHA256SUMS").is_file():
        return "vLLM's checkpoint is not prepared: run `make vllm-test`"
    return None


class VllmServer:
    """`scripts/vllm/env.sh serve-only` on a free loopback port with a fresh key."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.key = secrets.token_urlsafe(16)
        os.environ[KEY_ENV] = self.key  # read by backends and by `tierroute serve` children
        self.model = MODEL
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.starts: list[float] = []  # seconds each start took, for the record

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"vllm-{len(self.starts)}.log"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure_up(self) -> VllmServer:
        if not self.alive():
            self.start()
        return self

    def start(self) -> None:
        FastLoop.check("starts a vLLM server")
        self.port = free_port()
        env = {**os.environ, "VLLM_PORT": str(self.port), "VLLM_API_KEY": self.key}
        started = time.monotonic()
        log_path = self.log_path
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(ENV_SH), "serve-only"], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = started + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited {self.proc.returncode} while starting: {_tail(log_path)}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vLLM did not come up within {START_TIMEOUT_S:.0f} s: {_tail(log_path)}")
            time.sleep(0.5)
        self.starts.append(time.monotonic() - started)

    def kill(self) -> None:
        """SIGKILL to the whole process group: what a crash or an OOM kill looks like."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class ExternalVllm(VllmServer):
    """A server already running (TIERROUTE_TEST_VLLM_URL), used as it is and never killed."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key, self.model, self.starts = url, key, MODEL, []
        os.environ[KEY_ENV] = key

    @property
    def base_url(self) -> str:
        return self.url

    def alive(self) -> bool:
        return True

    def kill(self) -> None:
        pytest.skip("the server is TIERROUTE_TEST_VLLM_URL's, not this test's to kill")


def settings(server: VllmServer, **config: Any) -> OpenAIBackendSettings:
    """An `openai` tier's settings for the server: its model, its key, vLLM's scoring, quick
    backoffs; `config` overrides or adds (deployments, breaker sizes)."""
    values: dict[str, Any] = {
        "base_url": server.base_url,
        "model": server.model,
        "api_key_env": KEY_ENV,
        "prompt_logprobs": "vllm",
        "max_attempts": 2,
        "backoff_initial_s": 0.1,
        "backoff_max_s": 0.5,
        "hosted_prompt_tokens": 256,  # Qwen's template adds its own system prompt and tool preamble
        **config,
    }
    if "deployments" in values:
        values.pop("base_url")
    return OpenAIBackendSettings(**values)


@contextlib.asynccontextmanager
async def backend(server: VllmServer, *, timeout_s: float = 120.0, **config: Any) -> AsyncIterator[OpenAIBackend]:
    """A started `openai` backend on the server (`settings`), closed on the way out."""
    b = OpenAIBackend("large", settings(server, **config), timeout_s=timeout_s)
    await b.start()
    try:
        yield b
    finally:
        await b.close()


def _tail(path: Path, chars: int = 3000) -> str:
    text = path.read_text(errors="replace")
    lines = [line for line in text.splitlines() if "Attempted to load weight" not in line]
    return "\n".join(lines)[-chars:]
