"""Issue 26, item 6, from outside: checking schemas never holds the event loop.

A real `tierroute serve` process on loopback (SmolLM2 as its tier) gets three requests at once,
each with nine strict tools whose parameters are new 28 KB schemas of 140 `$defs` (a quarter to
half a second of meta-schema validation each, several seconds of CPU in all, within the 256 KB a
request may carry) while `/healthz` is probed every 50 ms;
before the fix those checks ran on the event loop and one probe took 15.7 s. Then the same requests
again: their checks are remembered. And the issue's own shape, 19 tools of 27 KB each, is refused
for its size before any check runs.

Run with -s to see the probes' latencies.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.structured.grammars import MAX_REQUEST_SCHEMA_BYTES
from tests.support.config import smol_config
from tests.support.servers import serve_process


def _schema(tag: str, n: int = 140) -> dict[str, Any]:
    """A valid strict schema of `n` definitions, new for each `tag` (no check of it remembered)."""
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {"w": {"type": "integer"}, "v": {"type": "string", "description": f"{tag} {i}"}},
            "required": ["w", "v"],
            "additionalProperties": False,
        }
        for i in range(n)
    }
    return {
        "type": "object",
        "properties": {f"p{i}": {"$ref": f"#/$defs/d{i}"} for i in range(n)},
        "required": [f"p{i}" for i in range(n)],
        "additionalProperties": False,
        "$defs": defs,
    }


def _body(tag: str, tools: int, n: int = 140) -> dict[str, Any]:
    return {
        "model": "small",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "tools": [
            {"type": "function", "function": {"name": f"f{i}", "strict": True, "parameters": _schema(f"{tag}-{i}", n)}}
            for i in range(tools)
        ],
    }


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("schemas")
    with serve_process(smol_config(tmp, large="none"), log_path=tmp / "serve.log", log_level="warning") as (_, u, _):
        yield u


class Prober:
    """/healthz every 50 ms from its own thread, each probe's latency kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                began = time.monotonic()
                assert client.get(f"{self.url}/healthz").status_code == 200
                self.latencies.append(time.monotonic() - began)
                self._stop.wait(0.05)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def _post(url: str, body: dict[str, Any]) -> tuple[float, httpx.Response]:
    began = time.monotonic()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    return time.monotonic() - began, r


def _probe_alone(url: str) -> float:
    with httpx.Client(timeout=60) as client:
        samples = []
        for _ in range(10):
            began = time.monotonic()
            client.get(f"{url}/healthz")
            samples.append(time.monotonic() - began)
    return statistics.median(samples)


@pytest.mark.timeout(600)
def test_healthz_answers_while_new_schemas_are_checked(url: str) -> None:
    quiet = _probe_alone(url)
    bodies = [_body(f"new-{k}", tools=9) for k in range(3)]
    with Prober(url) as prober, ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(lambda b: _post(url, b), bodies))
    for _, r in outcomes:
        # every schema passed its checks; then the tier found 250 KB of tools too long for its context
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    worst = max(prober.latencies)
    print(
        f"/healthz alone: {quiet * 1e3:.1f} ms (median); during the checks ({max(t for t, _ in outcomes):.1f} s): "
        f"{len(prober.latencies)} probes, median {statistics.median(prober.latencies) * 1e3:.1f} ms, "
        f"max {worst * 1e3:.1f} ms"
    )
    assert len(prober.latencies) >= 5  # the probes did run while the checks did
    assert worst < 0.5  # was 15.7 s; under 0.1 s on a quiet machine, generous for two busy cores

    # the same schemas again: every check's outcome is remembered, so nothing is validated twice
    took, r = _post(url, bodies[0])
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert took < max(t for t, _ in outcomes)


def test_the_issues_shape_is_refused_for_its_size(url: str) -> None:
    body = _body("issue", tools=19, n=135)  # 19 tools of about 27 KB each
    with Prober(url) as prober:
        took, r = _post(url, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools" and str(MAX_REQUEST_SCHEMA_BYTES) in error["message"], error
    print(f"refused in {took * 1e3:.0f} ms; /healthz max {max(prober.latencies, default=0) * 1e3:.1f} ms")
    assert max(prober.latencies, default=0.0) < 0.5
