"""200 clients at once against a real `tierroute serve` process, hostile and valid requests mixed.

What must hold: the process lives; every answer is a 200, a 4xx or a 503 (a full queue); the burst
ends in bounded time; and once it is over, the server's resident memory is back within 10% of
what it was before (read from /proc/PID/status after a first, warm-up burst of the same mix: a
leak per request, or per refused request, would show as growth across 200 more of them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.support.config import smol_config
from tests.support.hostile import CASES, Case, chat
from tests.support.servers import serve_process

CLIENTS = 200
HOSTILE = [
    "seed -1 sampled",
    "temperature subnormal",
    "temperature NaN",
    "stream yes",
    "lone surrogate in content",
    "invalid UTF-8 bytes",
    "deeply nested JSON",
    "huge array of messages",
    "huge stop list",
    "unknown role",
    "content part of unknown type",
    "wrong content-type",
    "model with NUL",
    "prompt over the context",
    "prompt of 900k characters",
    "top_logprobs 21",
    "tests without permission",
    "top_p 0",
    "max_tokens 0",
    "JSON array body",
    "Host not allowed",
]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def as_request(case: Case, url: str) -> dict:
    headers = {"content-type": "application/json", **case.headers}
    body = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
    return {"method": case.method, "url": f"{url}{case.path}", "content": body, "headers": headers}


async def burst(url: str, n: int) -> list[tuple[str, int, bool]]:
    """n requests at once, every third valid; (what, status, carried Retry-After) each."""
    valid = Case(chat(max_tokens=4), frozenset({200}))
    plan = [
        ("valid", valid) if i % 3 == 0 else (HOSTILE[i % len(HOSTILE)], CASES[HOSTILE[i % len(HOSTILE)]])
        for i in range(n)
    ]
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(name: str, case: Case) -> tuple[str, int, bool]:
            resp = await client.request(**as_request(case, url))
            return name, resp.status_code, "retry-after" in resp.headers

        return await asyncio.gather(*(one(name, case) for name, case in plan))


@pytest.fixture()
def served(tmp_path: Path, smol_path: Path):  # type: ignore[no-untyped-def]
    cfg = smol_config(tmp_path, large="none")
    log_path = tmp_path / "serve.log"
    with serve_process(cfg, log_path=log_path, log_level="warning") as (proc, url, _):
        yield proc, url, log_path


def test_a_hostile_burst_of_200_clients(served) -> None:  # type: ignore[no-untyped-def]
    proc, url, log_path = served
    cold = rss_kib(proc.pid)
    # the service as it is once it has served: valid requests at full width (the engine's compute
    # buffers for a batch of sequences are allocated on first use)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(
            pool.map(lambda _: httpx.post(f"{url}/v1/chat/completions", json=chat(max_tokens=8), timeout=60), range(16))
        )
    time.sleep(1.0)
    served_rss = rss_kib(proc.pid)
    # warm-up: the same burst once. The first one raises the allocator's high-water mark (a few
    # 1 MB bodies parsed at once; glibc keeps such freed memory for reuse), so "back within 10%"
    # is measured from there: a leak per request would still grow across the next 200.
    asyncio.run(burst(url, CLIENTS))
    time.sleep(1.0)
    before = rss_kib(proc.pid)

    t0 = time.monotonic()
    results = asyncio.run(burst(url, CLIENTS))
    took = time.monotonic() - t0
    assert took < 180, f"the burst took {took:.0f} s"

    assert proc.poll() is None, log_path.read_text()[-3000:]
    statuses = Counter(status for _, status, _ in results)
    assert set(statuses) <= {200, 400, 403, 413} | {503}, statuses
    assert all(has_retry for _, status, has_retry in results if status == 503)
    assert statuses[200] > 0
    for name, status, _ in results:
        if name != "valid" and status != 503:
            assert status in CASES[name].ok, (name, status)

    # the same process still answers, and its memory came back
    ok = httpx.post(f"{url}/v1/chat/completions", json=chat(max_tokens=2), timeout=30)
    assert ok.status_code == 200
    time.sleep(2.0)
    after = rss_kib(proc.pid)
    print(
        f"burst: {dict(statuses)} in {took:.1f} s; RSS cold {cold / 1024:.0f}, served {served_rss / 1024:.0f}, "
        f"after warm-up {before / 1024:.0f}, after the burst {after / 1024:.0f} MiB"
    )
    assert after <= before * 1.10, f"RSS grew from {before} KiB to {after} KiB"
    # from the service as it was after serving (not the stricter warm-up point): measured +12%
    # after two hostile bursts, Python's own object arenas keeping part of their peak
    assert after <= served_rss * 1.20, f"RSS grew from {served_rss} KiB (served) to {after} KiB"
