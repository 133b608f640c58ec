"""From outside: with JSON logs and tracing on, no API key and no prompt text appears in any log
line or span by default, and each API request ends with one JSON line that carries its request
id (the response's and the ledger's), key name, tiers, tokens, cost, latency and status."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from router.config import load_settings
from router.telemetry.setup import Tracing
from tests.support.accounting import ESCALATE_ON_MARK, MARK, auth, chat, keys_section, read_ledger, running
from tests.support.fault_upstream import FaultUpstream, status
from tests.support.telemetry import PROMPT_MARK, config, leaks


def span_text(exporter: InMemorySpanExporter) -> str:
    """Everything the exported spans say: names, attributes, events and the resource."""
    parts: list[Any] = []
    for s in exporter.get_finished_spans():
        parts += [s.name, dict(s.attributes or {}), [(e.name, dict(e.attributes or {})) for e in s.events]]
        parts.append(dict(s.resource.attributes))
    return json.dumps(parts, default=str)


async def test_no_key_or_prompt_in_logs_or_spans_and_one_json_line_per_request(
    tmp_path: Path, captured: io.StringIO
) -> None:
    body, raw = keys_section({"team-a": {}})
    exporter = InMemorySpanExporter()
    with FaultUpstream() as upstream:
        cfg = config(
            tmp_path,
            upstream.base_url,
            server=body,
            small_verifiers=ESCALATE_ON_MARK,
            extra='[logging]\nformat = "json"',
        )
        key = raw["team-a"]
        async with running(cfg, tracing=Tracing.to(exporter)) as client:
            plain = await client.post("/v1/chat/completions", json=chat(PROMPT_MARK), headers=auth(key))
            escalated = await client.post(
                "/v1/chat/completions", json=chat(f"{MARK} {PROMPT_MARK}", stream=True), headers=auth(key)
            )
            # an upstream that refuses the request: logged as a warning and a 400 line, no prompt
            # (the upstream's own words are logged as it sent them: one that quotes the prompt back
            # would put it in the log, which no setting here can tell from other text)
            upstream.script(status(400, "unsupported parameter"))
            failed = await client.post("/v1/chat/completions", json=chat(PROMPT_MARK, model="large"), headers=auth(key))
            refused = await client.post("/v1/chat/completions", json=chat(PROMPT_MARK), headers=auth(key + "x"))
    assert plain.status_code == 200 and escalated.status_code == 200
    assert failed.status_code == 400 and refused.status_code == 401

    logs = captured.getvalue()
    assert leaks(logs, key, PROMPT_MARK) == []
    assert leaks(span_text(exporter), key, PROMPT_MARK) == []

    lines = [json.loads(line) for line in logs.splitlines()]
    requests = [line for line in lines if line["logger"] == "tierroute.request"]
    assert len(requests) == 4  # one per API request, refused ones too
    by_id = {line["request_id"]: line for line in requests}
    ledger = read_ledger(tmp_path / "ledger.sqlite3")
    rid = plain.json()["id"]
    line = by_id[rid]
    assert rid in ledger and ledger[rid].key_id == "team-a"
    assert line["key"] == "team-a" and line["status"] == 200 and line["final_tier"] == "small"
    assert line["tiers_tried"] == ["small"] and line["escalated"] is False and line["escalation_reason"] is None
    assert line["prompt_tokens"] == ledger[rid].prompt_tokens and line["completion_tokens"] > 0
    assert line["cost_usd"] == pytest.approx(ledger[rid].cost_usd)
    assert line["latency_ms"] > 0 and line["task"]
    streamed = next(v for k, v in by_id.items() if k is not None and k != rid and v["status"] == 200)
    assert streamed["tiers_tried"] == ["small", "large"] and streamed["final_tier"] == "large"
    assert streamed["escalated"] is True and "score 0.000 < threshold" in streamed["escalation_reason"]
    assert streamed["request_id"] in ledger
    assert {line["status"] for line in requests} == {200, 400, 401}
    # the refused request has no id, no key: it never reached an account
    (unauthorized,) = [line for line in requests if line["status"] == 401]
    assert unauthorized["request_id"] is None and unauthorized["key"] is None


def test_the_format_is_set_by_the_config_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(tmp_path, "http://127.0.0.1:9/v1", server="allow_unauthenticated = true", small_verifiers="")
    assert load_settings(cfg).logging.format == "text"
    monkeypatch.setenv("TIERROUTE_LOGGING__FORMAT", "json")
    assert load_settings(cfg).logging.format == "json"
    monkeypatch.setenv("TIERROUTE_TELEMETRY__ENDPOINT", "http://127.0.0.1:4318")
    assert load_settings(cfg).telemetry.endpoint == "http://127.0.0.1:4318"
