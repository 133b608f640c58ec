"""The deployment fault matrix and balancing, against real processes: `tierroute serve` with a large
tier of two deployments, each a fault-injecting upstream process (`tests.support.fault_process`).

One deployment at a time answers 500s, hangs, resets, rate-limits with `Retry-After`, or cuts
streams before their first token, while the other is healthy: every client request (plain and
streamed, eight at a time) is answered 200 with the whole text, within the tier's deadline. Both
down: `on_unavailable` applies as it did with one `base_url`. Sized to stay bounded on a loaded
machine (40 requests per fault); `scripts/deployment_faults.py` runs 200 per fault for the docs.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.deployment_load import (
    FAULTS,
    TEXT,
    closed_loops,
    failed_attempts,
    heal,
    http_run,
    matrix_config,
    p50,
    two_deployments,
)
from tests.support.fault_process import fault_process
from tests.support.fault_upstream import TOKENS
from tests.support.servers import TIERROUTE, free_port, serve_process

pytestmark = pytest.mark.slow

DEADLINE_S = 6.0
SLACK_S = 2.0  # the router's own work and a loaded machine, on top of the tier's deadline
PER_FAULT = 40


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[tuple[str, int, int, Path]]:
    """The router (its URL), the two deployments' ports (nothing listens there yet), its ledger."""
    tmp = tmp_path_factory.mktemp("deployments")
    a, b = free_port(), free_port()
    ledger = tmp / "ledger.sqlite3"
    cfg = matrix_config(
        tmp / "config.toml", ledger, f"http://127.0.0.1:{a}/v1", f"http://127.0.0.1:{b}/v1", timeout_s=DEADLINE_S
    )
    with serve_process(cfg, log_path=tmp / "serve.log", log_level="warning") as (_, url, _):
        yield url, a, b, ledger


@pytest.mark.parametrize("fault", FAULTS)
def test_one_faulty_deployment_is_invisible_to_clients(served: tuple[str, int, int, Path], fault: str) -> None:
    url, a, b, _ = served
    with fault_process("ok", port=b):
        healthy = heal(url, a)
        with fault_process(fault, port=a):
            before = failed_attempts(url, "a")
            outcomes = asyncio.run(http_run(url, PER_FAULT, 8))
            after = failed_attempts(url, "a")
    assert [o.status for o in healthy] == [200] * len(healthy)
    assert {o.deployment for o in healthy} == {"a", "b"}  # both take traffic while both are up
    assert [o.status for o in outcomes] == [200] * PER_FAULT
    assert all(o.text == TEXT for o in outcomes)
    assert max(o.seconds for o in outcomes) < DEADLINE_S + SLACK_S
    assert sum(o.streamed for o in outcomes) == PER_FAULT // 2
    assert {o.deployment for o in outcomes} <= {"a", "b"}
    assert after > before  # the faulty deployment was tried, and failed


def test_both_deployments_down_is_on_unavailable_as_before(served: tuple[str, int, int, Path]) -> None:
    url, a, b, _ = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    with fault_process("500", port=a), fault_process("reset", port=b):
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="large", messages=[{"role": "user", "content": "Hi."}], max_tokens=8)
        assert info.value.status_code == 503 and int(info.value.response.headers["retry-after"]) >= 1
        with pytest.raises(openai.APIStatusError) as streamed:
            client.chat.completions.create(
                model="large", messages=[{"role": "user", "content": "Hi."}], max_tokens=8, stream=True
            )
        assert streamed.value.status_code == 503
        # best_effort: the small tier's answer, marked unverified, when the large tier is down
        r = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "Hi."}], max_tokens=8)
        ext = (r.model_extra or {})["tierroute"]
        assert ext["tier"] == "small" and ext["unverified"] is True and ext["deployment"] is None
        assert ext["attempts"][1]["tier"] == "large" and ext["attempts"][1]["error"]


def test_a_stream_cut_after_its_first_token_ends_with_an_error_and_is_recorded(
    served: tuple[str, int, int, Path],
) -> None:
    url, a, b, ledger = served
    body = {"model": "large", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 8, "stream": True}
    time.sleep(1.2)  # past the breakers' 1 s cool-down, whatever an earlier test left them in
    with fault_process("late", port=a), fault_process("late", port=b):
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200 and "[DONE]" not in r.text
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    sent = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    assert sent == "".join(TOKENS[:2]) and "error" in events[-1]  # no second deployment's text after it
    rid = events[0]["id"]
    with sqlite3.connect(ledger) as db:
        row = db.execute("SELECT deployment, tier FROM requests WHERE request_id = ?", (rid,)).fetchone()
        attempt = db.execute("SELECT decision, completion_tokens FROM attempts WHERE request_id = ?", (rid,)).fetchone()
    assert row[0] in ("a", "b") and row[1] == "large"
    assert attempt[0] == "error" and attempt[1] == 2  # what was sent is what was recorded


def test_metrics_and_the_ledger_say_which_deployment_answered(served: tuple[str, int, int, Path]) -> None:
    url, _, _, ledger = served
    text = httpx.get(f"{url}/metrics", timeout=10).text
    answered = re.search(r'^tierroute_deployment_requests_total{deployment="b",tier="large"} (\S+)$', text, re.M)
    assert answered and float(answered.group(1)) >= PER_FAULT
    out = subprocess.run(
        [TIERROUTE, "report", "costs", "--by", "deployment", "--format", "csv", "--ledger", str(ledger)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    groups = {row["deployment"]: int(row["requests"]) for row in csv.DictReader(io.StringIO(out))}
    assert groups["large/b"] >= PER_FAULT and "small" in groups


def test_least_outstanding_sends_most_of_a_run_to_the_fast_deployment() -> None:
    fast_port, slow_port = free_port(), free_port()

    async def run(fast: str, slow: str) -> tuple[list[tuple[float, str | None]], list[tuple[float, str | None]]]:
        both, alone = two_deployments(fast, slow), two_deployments(fast, slow, strategy="ordered_failover")
        balanced: list[tuple[float, str | None]] = []
        fast_only: list[tuple[float, str | None]] = []  # ordered failover: always the fast one
        for backend in (both, alone):
            await backend.start()
        try:
            await closed_loops(alone.generate, 16, 8)  # connections made, code warm
            for _ in range(4):  # in turns, so the machine's load falls on both alike
                balanced += await closed_loops(both.generate, 50, 8)
                fast_only += await closed_loops(alone.generate, 50, 8)
        finally:
            for backend in (both, alone):
                await backend.close()
        return balanced, fast_only

    with fault_process("ok", port=fast_port, delay=0.05) as fast, fault_process("slow", port=slow_port) as slow:
        balanced, fast_only = asyncio.run(run(fast, slow))
    share = sum(d == "fast" for _, d in balanced) / len(balanced)
    assert {d for _, d in fast_only} == {"fast"}
    assert share >= 0.8
    assert p50([s for s, _ in balanced]) <= 1.2 * p50([s for s, _ in fast_only])
