"""A schema-check worker that crashes or hangs on a batch: the request is refused cleanly, the
batch is never checked in the service's own process, and the next request gets a new worker.

Before, a batch that failed in two workers was checked on the feeding thread, in the service's
process: a schema that crashes a worker would crash the service there, and one that hangs it would
hold the GIL and with it the event loop (issue 26, item 6). The workers here are stand-ins that die
or stall on whatever they are sent (no real schema is known to do either: this is the path for the
one that will), and a spy on the service's own checker counts what it checks. Checked from
outside: the HTTP answers, their time, and `/healthz` meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.api import schema_checks
from router.api.app import create_app
from router.config import load_settings
from router.structured import grammars
from tests.support.config import smol_config
from tests.support.servers import UvicornThread

CRASHES = ("-c", "import sys; sys.stdin.readline(); sys.exit(3)")
STALLS = ("-c", "import sys, time; sys.stdin.readline(); time.sleep(60)")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[UvicornThread]:
    cfg = smol_config(tmp_path_factory.mktemp("worker"), large="none")
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield srv


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """A fresh pool (fresh feeding threads, so no worker started before is reused), short
    timeouts, and the schemas the service checked in its own process."""
    checked: list[Any] = []
    real = grammars.schema_verdict

    def spy(schema: Any) -> grammars.Verdict:
        checked.append(schema)
        return real(schema)

    monkeypatch.setattr(grammars, "schema_verdict", spy)
    monkeypatch.setattr(schema_checks, "_pool", None)
    monkeypatch.setattr(schema_checks, "BATCH_TIMEOUT_S", 1.0)
    monkeypatch.setattr(schema_checks, "PER_SCHEMA_S", 0.0)
    yield checked
    pool: ThreadPoolExecutor | None = schema_checks._pool
    if pool is not None:
        pool.shutdown(wait=False)


def _body(tag: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {tag: {"type": "integer"}}, "required": [tag]}
    return {
        "model": "small",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
    }


def _post(url: str, body: dict[str, Any]) -> tuple[float, httpx.Response]:
    began = time.monotonic()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    return time.monotonic() - began, r


@pytest.mark.parametrize(
    ("worker", "status", "kind"),
    [(CRASHES, 400, "invalid_request_error"), (STALLS, 503, None)],
    ids=["crashes", "stalls"],
)
def test_a_batch_that_fails_twice_is_refused_not_checked_in_the_service(
    server: UvicornThread,
    in_process: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    worker: tuple[str, ...],
    status: int,
    kind: str | None,
) -> None:
    monkeypatch.setattr(schema_checks, "WORKER_ARGS", worker)
    took, r = _post(server.url, _body(f"bad_{status}"))
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert "could not be checked" in error["message"]
    if kind is not None:
        assert error["type"] == kind and error["code"] == "schema_check_failed"
    assert took < 60  # two workers' allowance (1 s each here), on two busy cores
    assert in_process == []  # before: the batch was checked here, in the service's own process
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200

    # the refusal is not remembered, and a working worker replaces the failed ones
    monkeypatch.setattr(schema_checks, "WORKER_ARGS", ("-m", "router.api.schema_worker"))
    monkeypatch.setattr(schema_checks, "BATCH_TIMEOUT_S", 60.0)
    _, r = _post(server.url, _body(f"bad_{status}"))
    assert r.status_code == 200, r.text
    assert in_process == []


def _big_schema() -> dict[str, Any]:
    """About 30 KB, near MAX_SCHEMA_BYTES: patterns, enums, nesting, anyOf, the meta-schema's work."""
    props = {
        f"p{i}": {
            "anyOf": [{"type": "string", "pattern": f"^[a-z]{{1,{i % 8 + 1}}}-[0-9]{{4}}$"}, {"type": "null"}],
            "description": "x" * 80,
        }
        for i in range(120)
    }
    # 300 values that part within two characters (sharing a longer beginning is over the grammar bound)
    props["kind"] = {"enum": [f"{chr(97 + i % 26)}{chr(97 + i // 26)}_value_{i}" for i in range(300)]}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


@pytest.mark.slow  # starts a schema worker process
def test_the_worker_caps_its_own_address_space() -> None:
    # read from outside, in /proc: the cap is on the worker process itself, and a large schema's
    # check stays well inside it (so the cap refuses no real schema)
    from router.api.schema_worker import WORKER_MEMORY_BYTES

    schema = _big_schema()
    assert 25_000 < len(grammars.schema_key(schema)) < grammars.MAX_SCHEMA_BYTES
    worker = schema_checks._Worker()
    try:
        assert worker.check([schema, {"type": "object", "not": {}}]) == [
            None,
            grammars.schema_verdict({"type": "object", "not": {}}),
        ]
        pid = worker.proc.pid
        limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
        cap = next(line for line in limits if line.startswith("Max address space")).split()[3]
        assert int(cap) == WORKER_MEMORY_BYTES
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        peak_kb = int(next(line for line in status if line.startswith("VmPeak")).split()[1])
        assert peak_kb * 1024 < WORKER_MEMORY_BYTES / 2, peak_kb
    finally:
        worker.close()
