"""Work spent on a request that gets no answer is still recorded: a client that hangs up mid-stream
(its slot is freed, and the tokens it consumed are charged), and a request whose last tier fails
after a lower tier answered (that answer's cost is in the ledger, not lost with the 503)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from router.api.app import create_app
from router.config import load_settings
from router.ledger.entries import LedgerEntry
from router.ledger.store import SQLiteStore
from tests.support.config import smol_config
from tests.support.servers import UvicornThread, dead_port, llama_cpp_server

# a format check the small model's answer never passes: every request escalates to the large tier
REJECT_ALL = '[[tiers.verifiers]]\nname = "format"\nparams = { regex = "^NEVER-MATCHES$" }\n'
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # greedy SmolLM2 keeps counting: a long answer


def ledger(tmp: Path) -> list[LedgerEntry]:
    store = SQLiteStore(tmp / "ledger.sqlite3", read_only=True)
    store.open()
    try:
        return list(store.entries())
    finally:
        store.close()


def wait_for(check, timeout: float = 20.0):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def gauge(base: str, name: str, tier: str) -> float | None:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(f'{name}{{tier="{tier}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture(scope="module")
def long_answers(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("spent")
    cfg = smol_config(tmp, threshold=0.5, verifiers=REJECT_ALL)
    large = 'name = "large"\nbackend = "llamacpp"\nmax_tokens = 48'
    assert large in cfg.read_text()
    cfg.write_text(cfg.read_text().replace(large, large.replace("48", "1500")))  # the small tier stays short
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield srv.url, tmp


def test_a_client_gone_mid_stream_frees_its_slot_and_is_charged(long_answers: tuple[str, Path]) -> None:
    base, tmp = long_answers
    body = {"model": "auto", "prompt": COUNTING, "max_tokens": 1500, "stream": True}
    received = []
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{base}/v1/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["x-tierroute-tier"] == "large"
        for line in r.iter_lines():
            if line.startswith("data: {"):
                received.append(json.loads(line[6:])["choices"][0]["text"])
            if len([t for t in received if t]) >= 5:
                break  # hang up with the answer well under way
    # the engine stops decoding it within a step or so: no sequence left running
    assert wait_for(lambda: gauge(base, "tierroute_backend_active_sequences", "large") == 0.0)
    entries = wait_for(lambda: ledger(tmp))
    assert len(entries) == 1
    small, large = entries[0].attempts
    assert small.decision == "rejected" and small.cost_usd > 0  # the small answer it escalated from
    assert large.decision == "abandoned" and large.finish_reason == "cancelled"
    assert 5 <= large.completion_tokens < 1500 and large.prompt_tokens > 0
    assert large.cost_usd == pytest.approx((0.60 * large.prompt_tokens + 2.40 * large.completion_tokens) / 1e6)
    assert entries[0].cost_usd == pytest.approx(small.cost_usd + small.verifier_cost_usd + large.cost_usd)
    metrics = httpx.get(f"{base}/metrics").text
    task = entries[0].task  # what detection made of a counting prompt (rules, then the classifier)
    assert task is not None
    assert f'tierroute_requests_total{{outcome="abandoned",task="{task}",tier="large"}} 1.0' in metrics
    # the service is none the worse: the next request is answered in full
    r = httpx.post(f"{base}/v1/completions", json={"model": "small", "prompt": "Hi", "max_tokens": 8}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"]


def hang_up_after(base: str, pieces: int, body: dict) -> None:
    received = 0
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{base}/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                received += 1
            if received >= pieces:
                return


def test_a_client_gone_mid_stream_from_a_remote_tier_is_charged_too(tmp_path: Path, smol_path: Path) -> None:
    """The large tier is llama-cpp-python's server behind the openai backend: the pieces it
    streamed are counted, and the prompt is priced (estimated: its stream reports no usage yet)."""
    with llama_cpp_server(smol_path) as upstream:
        cfg = smol_config(tmp_path, threshold=0.5, verifiers=REJECT_ALL, large="remote", base_url=upstream, timeout=60)
        remote = 'name = "large"\nbackend = "openai"\nmax_tokens = 48'
        assert remote in cfg.read_text()
        cfg.write_text(cfg.read_text().replace(remote, remote.replace("48", "1500")))
        with UvicornThread(create_app(load_settings(cfg))) as srv:
            hang_up_after(srv.url, 5, {"model": "auto", "prompt": COUNTING, "max_tokens": 1500, "stream": True})
            entries = wait_for(lambda: ledger(tmp_path))
            ok = httpx.post(
                f"{srv.url}/v1/completions", json={"model": "large", "prompt": "Hi", "max_tokens": 4}, timeout=60
            )
            assert ok.status_code == 200  # the upstream serves the next request
    assert len(entries) == 1
    small, large = entries[0].attempts
    assert small.decision == "rejected" and small.cost_usd > 0
    assert large.decision == "abandoned" and 5 <= large.completion_tokens < 1500 and large.prompt_tokens > 0
    assert large.cost_usd == pytest.approx((0.60 * large.prompt_tokens + 2.40 * large.completion_tokens) / 1e6)


def test_a_failed_last_tier_does_not_lose_the_lower_tiers_cost(tmp_path: Path, smol_path: Path) -> None:
    dead = f"http://127.0.0.1:{dead_port()}/v1"  # nothing listens: the large tier is unavailable
    cfg = smol_config(tmp_path, threshold=0.5, verifiers=REJECT_ALL, large="remote", base_url=dead)
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        ask = {"model": "auto", "messages": [{"role": "user", "content": "What is 17 * 3?"}], "max_tokens": 16}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=ask, timeout=60)
        assert r.status_code == 503 and r.json()["error"]["type"]
        s = httpx.post(f"{srv.url}/v1/chat/completions", json={**ask, "stream": True}, timeout=60)
        assert s.status_code == 503
    entries = ledger(tmp_path)
    assert len(entries) == 2
    for e in entries:
        small, large = e.attempts
        assert small.decision == "rejected" and small.completion_tokens > 0 and small.cost_usd > 0
        assert large.decision == "error" and large.cost_usd == 0 and large.reason == "tier unavailable" and large.error
        assert e.cost_usd == pytest.approx(small.cost_usd + small.verifier_cost_usd)
