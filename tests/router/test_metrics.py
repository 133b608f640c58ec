"""/metrics: behind the keys, per-app registries, and numbers that agree with the ledger."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.support.accounting import ESCALATE_ON_MARK, MARK, auth, chat, config_with_keys, read_ledger, running
from tests.support.config import smol_config
from tests.support.metrics import samples, value


def total(m: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str) -> float:
    return math.fsum(v for (n, _), v in m.items() if n == name)


@pytest.mark.timeout(300)
async def test_metrics_need_a_key_and_agree_with_the_ledger(tmp_path: Path, smol_path: Path) -> None:
    cfg, keys = config_with_keys(
        tmp_path,
        {"gina": {"requests_per_minute": 5, "roles": ["client", "metrics"]}},
        threshold=0.5,
        verifiers=ESCALATE_ON_MARK,
    )
    async with running(cfg) as client:
        assert (await client.get("/metrics")).status_code == 401
        for prompt, stream in (("Hi.", False), (f"Hi. {MARK}", False), ("Hello.", True), ("Yo.", False)):
            r = await client.post("/v1/chat/completions", json=chat(prompt, stream=stream), headers=auth(keys["gina"]))
            assert r.status_code == 200
        assert (
            await client.post("/v1/chat/completions", json=chat("x"), headers=auth(keys["gina"]))
        ).status_code == 200
        limited = await client.post("/v1/chat/completions", json=chat("x"), headers=auth(keys["gina"]))
        assert limited.status_code == 429
        r = await client.get("/metrics", headers=auth(keys["gina"]))
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        m = samples(r.text)
    ledger = list(read_ledger(tmp_path / "ledger.sqlite3").values())
    assert len(ledger) == 5

    assert value(m, "tierroute_requests_total", tier="small", outcome="accepted") == 4
    assert value(m, "tierroute_requests_total", tier="large", outcome="escalated") == 1
    # every request here is chat without a rule's signs: open-ended, and the label has only task names
    assert value(m, "tierroute_requests_total", task="open_ended") == 5
    assert {dict(labels)["task"] for (n, labels) in m if n == "tierroute_requests_total"} == {"open_ended"}
    assert [e.task for e in ledger] == ["open_ended"] * 5
    assert value(m, "tierroute_escalations_total", from_tier="small", to_tier="large") == 1
    assert value(m, "tierroute_attempts_total", tier="small", decision="rejected") == 1
    assert value(m, "tierroute_requests_refused_total", reason="rate_limited") == 1
    assert value(m, "tierroute_http_responses_total", path="/v1/chat/completions", status="429") == 1
    assert value(m, "tierroute_http_responses_total", path="/metrics", status="401") == 1
    assert value(m, "tierroute_http_responses_total", path="/v1/chat/completions", status="200") == 5

    tokens = sum(a.prompt_tokens + a.completion_tokens for e in ledger for a in e.attempts)
    assert total(m, "tierroute_tokens_total") == tokens
    assert total(m, "tierroute_cost_usd_total") == pytest.approx(math.fsum(e.cost_usd for e in ledger), rel=1e-9)
    assert value(m, "tierroute_key_cost_usd_total", key="gina") == pytest.approx(
        math.fsum(e.cost_usd for e in ledger), rel=1e-9
    )
    assert value(m, "tierroute_counterfactual_cost_usd_total") == pytest.approx(
        math.fsum(e.counterfactual_usd for e in ledger), rel=1e-9
    )
    assert value(m, "tierroute_verifier_score_count", tier="small", verifier="escalate_marked") == 5
    assert value(m, "tierroute_verifier_score_bucket", tier="small", verifier="combined", le="0.1") == 1
    assert value(m, "tierroute_attempt_latency_seconds_count", tier="small") == 5
    assert value(m, "tierroute_attempt_latency_seconds_count", tier="large") == 1
    assert value(m, "tierroute_request_latency_seconds_count", tier="large") == 1
    assert ("tierroute_backend_queue_depth", frozenset({("tier", "small")})) in m
    assert ("tierroute_backend_queue_depth", frozenset({("tier", "large")})) in m
    assert value(m, "process_resident_memory_bytes") > 10e6
    assert value(m, "tierroute_requests_in_flight") == 0


@pytest.mark.timeout(300)
async def test_public_metrics_and_separate_registries(tmp_path: Path, smol_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cfg_a, keys = config_with_keys(tmp_path / "a", {"h": {}}, server_extra="metrics_public = true", large="none")
    cfg_b = smol_config(tmp_path / "b", large="none")
    async with running(cfg_a) as a, running(cfg_b) as b:
        assert (await a.get("/metrics")).status_code == 200  # public: no key needed
        assert (await a.post("/v1/chat/completions", json=chat("Hi."), headers=auth(keys["h"]))).status_code == 200
        ma = samples((await a.get("/metrics")).text)
        mb = samples((await b.get("/metrics")).text)  # open server: no keys configured at all
    assert value(ma, "tierroute_requests_total", tier="small", outcome="accepted") == 1
    assert value(mb, "tierroute_requests_total", tier="small", outcome="accepted") == 0
