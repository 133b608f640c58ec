"""From outside, each request's JSON log line against its ledger row: a cache hit's line says
what its row says (the tier whose answer it replays, the task, no tokens, no cost, a hit), not
the empty line of a request that never settled."""

from __future__ import annotations

import io
import json
from pathlib import Path

from tests.support.accounting import ESCALATE_ON_MARK, MARK, chat, read_ledger, running
from tests.support.fault_upstream import FaultUpstream
from tests.support.telemetry import config


async def test_a_cache_hits_line_says_what_its_ledger_row_says(tmp_path: Path, captured: io.StringIO) -> None:
    with FaultUpstream() as upstream:
        cfg = config(
            tmp_path, upstream.base_url, server="allow_unauthenticated = true", small_verifiers=ESCALATE_ON_MARK,
            extra='[logging]\nformat = "json"\n[cache]\nenabled = true',
        )  # fmt: skip
        async with running(cfg) as client:
            first = await client.post("/v1/chat/completions", json=chat(f"{MARK} what is 2+2?"))
            await client.app.state.services.cache.close()  # type: ignore[attr-defined]  # its entry stored
            hit = await client.post("/v1/chat/completions", json=chat(f"{MARK} what is 2+2?"))
    assert first.status_code == hit.status_code == 200
    lines = [json.loads(x) for x in captured.getvalue().splitlines()]
    by_id = {x["request_id"]: x for x in lines if x["logger"] == "tierroute.request"}
    ledger = read_ledger(tmp_path / "ledger.sqlite3")
    answered, replayed = by_id[first.json()["id"]], by_id[hit.json()["id"]]
    row = ledger[hit.json()["id"]]
    assert row.attempts[0].decision == "cached"
    assert answered["cache_hit"] is False and answered["tiers_tried"] == ["small", "large"]
    assert replayed["cache_hit"] is True
    assert replayed["final_tier"] == row.tier == "large"
    assert replayed["task"] == row.task == answered["task"]
    assert replayed["tiers_tried"] == [] and replayed["escalated"] is False
    assert replayed["prompt_tokens"] == row.prompt_tokens == 0
    assert replayed["completion_tokens"] == row.completion_tokens == 0
    assert replayed["cost_usd"] == row.cost_usd == 0.0
