"""The deployment fault matrix and balancing, against real processes: `tierroute serve` with large
tiers of two deployments, each a fault-injecting upstream process (`tests.support.fault_process`).

One deployment answers 500s, hangs, resets, rate-limits with `Retry-After`, or cuts streams before
their first token, while the other is healthy: every client request of a 200-request run (plain and
streamed, eight at a time) is answered 200 with the whole text, and none waits as long as the
tier's deadline. The five faults run side by side, each against its own tier and its own faulty
upstream (`tests.support.deployment_load.fault_matrix`): they mostly wait, so together they cost
about what the slowest costs alone. Both down: `on_unavailable` applies as it did with one
`base_url`. Weighted random follows its weights over 1,000 requests.
`scripts/deployment_faults.py` runs the same code, one fault at a time, for the docs' figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import re
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.deployment_load import (
    DEADLINE_S,
    FAULTS,
    TEXT,
    WEIGHTS,
    Matrix,
    closed_loops,
    fault_matrix,
    matrix_config,
    p50,
    two_deployments,
    weighted_run,
)
from tests.support.fault_process import fault_process
from tests.support.fault_upstream import TOKENS
from tests.support.servers import TIERROUTE, free_port, serve_process

pytestmark = pytest.mark.slow

PER_FAULT = 200  # the acceptance's run, per fault


Served = Callable[[], tuple[str, int, int, Path]]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[Served]:
    """The router with the small tier and one large tier: a function that returns, once it is up,
    its URL, the large tier's two deployments' ports (nothing listens there yet) and its ledger. It
    starts in a thread (loading the small model) while the fault matrix below runs."""
    tmp = tmp_path_factory.mktemp("deployments")
    a, b = free_port(), free_port()
    ledger = tmp / "ledger.sqlite3"
    cfg = matrix_config(tmp / "config.toml", ledger, f"http://127.0.0.1:{a}/v1", f"http://127.0.0.1:{b}/v1")
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(1) as pool:
        starting = pool.submit(stack.enter_context, serve_process(cfg, log_path=tmp / "serve.log", log_level="warning"))
        try:
            yield lambda: (starting.result()[1], a, b, ledger)
        finally:
            starting.exception()  # started (or failed) before the stack stops it


@pytest.fixture(scope="module")
def matrix(
    tmp_path_factory: pytest.TempPathFactory, served: Served
) -> Iterator[tuple[Matrix, Future[list[tuple[float, str | None]]]]]:
    """Every fault's run, side by side, once for the module; and beside it (a thread, while the
    matrix's router starts and its tiers warm up) the weighted random run of 1,000 requests, whose
    shares do not depend on how loaded the machine is. It asks for `served` only so that router
    starts (in its thread) first, meanwhile, rather than after the matrix."""
    with ThreadPoolExecutor(1) as pool:
        weighted = pool.submit(weighted_run, 1000)
        with fault_matrix(tmp_path_factory.mktemp("matrix"), PER_FAULT, side_by_side=True) as done:
            weighted.result()
            yield done, weighted


def admitting(url: str, tier: str = "large") -> None:
    """Until one of the tier's breakers takes requests (at most its 1 s cool-down and a little)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        open_ = re.findall(rf'^tierroute_deployment_breaker_open{{deployment="\w+",tier="{tier}"}} (\S+)$', text, re.M)
        if not open_ or min(float(v) for v in open_) == 0.0:
            return
        time.sleep(0.1)
    raise AssertionError("both breakers stayed open")


@pytest.mark.parametrize("fault", FAULTS)
def test_one_faulty_deployment_is_invisible_to_clients(matrix: tuple[Matrix, Any], fault: str) -> None:
    run = matrix[0].runs[fault]
    assert [o.status for o in run.healthy] == [200] * len(run.healthy)
    assert {o.deployment for o in run.healthy} == {"a", "b"}  # both take traffic while both are up
    assert [o.status for o in run.outcomes] == [200] * PER_FAULT
    assert all(o.text == TEXT for o in run.outcomes)
    slowest = max(o.seconds for o in run.outcomes)
    assert slowest < DEADLINE_S, f"{fault}: a client waited {slowest:.2f} s, the deadline is {DEADLINE_S} s"
    assert sum(o.streamed for o in run.outcomes) == PER_FAULT // 2
    assert {o.deployment for o in run.outcomes} <= {"a", "b"}
    assert run.failed_at_a > 0  # the faulty deployment was tried, and failed


def test_a_stream_cut_after_its_first_token_ends_with_an_error_and_is_recorded(
    served: Served,
) -> None:
    url, a, b, ledger = served()
    body = {"model": "large", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 8, "stream": True}
    admitting(url)  # an earlier test (another order) may have left both breakers open
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


def test_both_deployments_down_is_on_unavailable_as_before(served: Served) -> None:
    url, a, b, _ = served()
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


def test_metrics_and_the_ledger_say_which_deployment_answered(served: Served, matrix: tuple[Matrix, Any]) -> None:
    done = matrix[0]
    text = httpx.get(f"{done.url}/metrics", timeout=10).text
    for fault in FAULTS:
        line = rf'^tierroute_deployment_requests_total{{deployment="b",tier="large-{fault}"}} (\S+)$'
        answered = re.search(line, text, re.M)
        assert answered and float(answered.group(1)) >= PER_FAULT, fault

    def report(ledger: Path) -> dict[str, int]:
        out = subprocess.run(
            [TIERROUTE, "report", "costs", "--by", "deployment", "--format", "csv", "--ledger", str(ledger)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        return {row["deployment"]: int(row["requests"]) for row in csv.DictReader(io.StringIO(out))}

    groups = report(done.ledger)
    assert all(groups[f"large-{fault}/b"] >= PER_FAULT for fault in FAULTS), groups
    assert "small" in report(served()[3])  # a tier without deployments, by its name


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


def test_weighted_random_follows_its_weights(matrix: tuple[Matrix, Any]) -> None:
    # two healthy upstream processes, weights 1:3, 1,000 requests from 8 closed loops
    done = matrix[1].result()
    heavy = sum(d == "heavy" for _, d in done) / len(done)
    assert len(done) == 1000 and {d for _, d in done} == {"light", "heavy"}
    assert abs(heavy - WEIGHTS[1] / sum(WEIGHTS)) <= 0.04, heavy  # 75% within 4 points
