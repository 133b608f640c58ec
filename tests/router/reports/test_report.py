"""`tierroute report costs`: the aggregation's arithmetic, the time windows, and reports of live
traffic that equal, to the last bit, what the clients were sent."""

from __future__ import annotations

import asyncio
import base64
import calendar
import csv
import io
import math
import re
from pathlib import Path
from typing import Any

import pytest

from router.cli import main
from router.ledger.entries import SHADOW_KEY, AttemptEntry, LedgerEntry
from router.reports import costs as reports
from tests.support.accounting import ESCALATE_ON_MARK, MARK, auth, chat, config_with_keys, running, tierroute_of

DAY1 = float(calendar.timegm((2025, 5, 1, 10, 0, 0)))
DAY2 = DAY1 + 86400


def att(idx: int, tier: str, decision: str, cost: float, latency_ms: float, tokens: tuple[int, int]) -> AttemptEntry:
    return AttemptEntry(
        idx=idx,
        tier=tier,
        decision=decision,
        reason="",
        error=None,
        score=1.0,
        threshold=0.5,
        scores={},
        prompt_tokens=tokens[0],
        completion_tokens=tokens[1],
        finish_reason="stop",
        latency_ms=latency_ms,
        busy_ms=latency_ms / 2,
        verify_ms=0.0,
        cost_usd=cost,
        verifier_cost_usd=0.0,
        verifier_tokens=0,
    )


def req(rid: str, ts: float, key: str, attempts: list[AttemptEntry], cf: float, latency_ms: float) -> LedgerEntry:
    return LedgerEntry(
        request_id=rid,
        ts=ts,
        key_id=key,
        model="auto",
        tier=attempts[-1].tier,
        escalated=len(attempts) > 1,
        unverified=False,
        latency_ms=latency_ms,
        cost_usd=sum(a.cost_usd for a in attempts),
        counterfactual_usd=cf,
        attempts=tuple(attempts),
    )


ENTRIES = [
    req("a", DAY1, "k1", [att(0, "small", "accepted", 0.001, 100, (10, 5))], cf=0.01, latency_ms=110),
    req(
        "b",
        DAY1 + 60,
        "k2",
        [att(0, "small", "rejected", 0.001, 100, (10, 5)), att(1, "large", "accepted", 0.02, 400, (10, 8))],
        cf=0.02,
        latency_ms=520,
    ),
    req("c", DAY2, "k1", [att(0, "small", "accepted", 0.002, 300, (20, 5))], cf=0.01, latency_ms=310),
    req("d", DAY2 + 60, "k1", [att(0, "small", "accepted", 0.001, 200, (10, 5))], cf=0.01, latency_ms=210),
]


def by_group(rows: list[reports.Row]) -> dict[str, reports.Row]:
    return {r.group: r for r in rows}


def test_by_key_day_and_model() -> None:
    rows, total = reports.aggregate(ENTRIES, "key")
    k1, k2 = by_group(rows)["k1"], by_group(rows)["k2"]
    assert (k1.requests, k2.requests, total.requests) == (3, 1, 4)
    assert k1.cost_usd == math.fsum([0.001, 0.002, 0.001])
    assert k1.savings_usd == math.fsum([0.01 - 0.001, 0.01 - 0.002, 0.01 - 0.001])
    assert k2.escalation_rate == 1.0 and total.escalation_rate == 0.25
    assert k1.p50_ms == 210 and k1.p95_ms == pytest.approx(300)  # 210 + 0.9 * (310 - 210)
    assert total.prompt_tokens == 60 and total.completion_tokens == 28
    assert total.compute_s == pytest.approx((100 + 100 + 400 + 300 + 200) / 2 / 1000)
    assert total.savings_pct == pytest.approx(100 * (0.05 - 0.025) / 0.05)

    days = by_group(reports.aggregate(ENTRIES, "day")[0])
    assert sorted(days) == ["2025-05-01", "2025-05-02"]
    assert days["2025-05-01"].requests == 2 and days["2025-05-02"].cost_usd == 0.003

    models = reports.aggregate(ENTRIES, "model")[0]
    assert [r.group for r in models] == ["auto"] and models[0].requests == 4


def test_by_tier_counts_attempts_and_still_sums_to_the_total() -> None:
    rows, total = reports.aggregate(ENTRIES, "tier")
    small, large = by_group(rows)["small"], by_group(rows)["large"]
    assert (small.requests, small.answered, large.requests, large.answered) == (4, 3, 1, 1)
    assert small.escalation_rate == 0.25 and large.escalation_rate == 0.0
    assert small.cost_usd + large.cost_usd == pytest.approx(total.cost_usd)
    assert small.savings_usd + large.savings_usd == pytest.approx(total.savings_usd)
    assert large.savings_usd == pytest.approx(0.02 - 0.021)  # the escalated request cost more than the top tier
    assert small.p50_ms == 150 and large.p50_ms == 400


def test_shadow_work_has_rows_of_its_own_by_tier() -> None:
    """A shadow generation (operator key `_shadow`) is not a client request the large tier answered:
    by tier it is a row `large (shadow)`, the client rows keep their counts, and the spend still sums
    to the total; the escalation series counts client requests only."""
    shadow = req(
        "s", DAY1 + 120, SHADOW_KEY, [att(0, "large", "accepted", 0.03, 500, (10, 9))], cf=0.03, latency_ms=510
    )
    rows, total = reports.aggregate([*ENTRIES, shadow], "tier")
    groups = by_group(rows)
    assert sorted(groups) == ["large", "large (shadow)", "small"]
    large, extra = groups["large"], groups["large (shadow)"]
    assert (large.requests, large.answered, extra.requests, extra.answered) == (1, 1, 1, 1)
    assert extra.cost_usd == 0.03 and extra.savings_usd == 0.0
    assert math.fsum(r.cost_usd for r in rows) == pytest.approx(total.cost_usd)
    assert total.requests == 5  # as `--by key` counts it, where shadow work is the key `_shadow`

    series = reports.time_series([*ENTRIES, shadow])
    first = series.labels.index("2025-05-01 10:00")
    assert series.cost_by_tier["large (shadow)"][first] == 0.03
    assert series.requests[first] == 2 and series.escalation_rate[first] == 0.5


def test_percentile() -> None:
    assert reports.percentile([], 50) is None
    assert reports.percentile([5.0], 95) == 5.0
    assert reports.percentile([1, 2, 3, 4], 50) == 2.5


def test_parse_time() -> None:
    now = float(calendar.timegm((2025, 5, 2, 15, 30, 0)))
    assert reports.parse_time("2025-05-01", now) == calendar.timegm((2025, 5, 1, 0, 0, 0))
    assert reports.parse_time("2025-05-01T12:00", now) == calendar.timegm((2025, 5, 1, 12, 0, 0))
    assert reports.parse_time("2025-05-01T12:00+02:00", now) == calendar.timegm((2025, 5, 1, 10, 0, 0))
    assert reports.parse_time("today", now) == calendar.timegm((2025, 5, 2, 0, 0, 0))
    assert reports.parse_time("yesterday", now) == calendar.timegm((2025, 5, 1, 0, 0, 0))
    assert reports.parse_time("24h", now) == now - 86400
    assert reports.parse_time("7d", now) == now - 7 * 86400
    assert reports.parse_time("90m", now) == now - 5400
    with pytest.raises(ValueError, match="24h"):
        reports.parse_time("last tuesday", now)


def test_csv_round_trips_floats() -> None:
    rows, total = reports.aggregate(ENTRIES, "key")
    parsed = list(csv.DictReader(io.StringIO(reports.to_csv(rows, total, "key"))))
    assert [r["key"] for r in parsed] == ["k1", "k2", "TOTAL"]
    assert float(parsed[-1]["cost_usd"]) == total.cost_usd


@pytest.mark.slow
def test_html_is_self_contained_with_both_plots() -> None:
    rows, total = reports.aggregate(ENTRIES, "day")
    page = reports.to_html(rows, total, "day", ENTRIES, title="t <x>", window="all time", prices=[("small", "$1/h")])
    imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(imgs) == 2
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in imgs)
    assert "t &lt;x&gt;" in page and "2025-05-02" in page and "$1/h" in page
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing fetched from elsewhere


# ---- live traffic ------------------------------------------------------------------------------------


def report_csv(capsys: pytest.CaptureFixture[str], cfg: Path, *args: str) -> dict[str, dict[str, str]]:
    assert main(["--config", str(cfg), "report", "costs", "--format", "csv", *args]) == 0
    out = capsys.readouterr().out
    reader = csv.DictReader(io.StringIO(out))
    group = reader.fieldnames[0]  # type: ignore[index]
    return {row[group]: row for row in reader}


@pytest.mark.timeout(300)
async def test_report_of_live_traffic_matches_the_responses(
    tmp_path: Path, smol_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, keys = config_with_keys(tmp_path, {"ann": {}, "ben": {}}, threshold=0.5, verifiers=ESCALATE_ON_MARK)
    plan = [
        ("ann", "Hi.", False),
        ("ann", f"Hi. {MARK}", True),
        ("ben", "Yes?", False),
        ("ben", f"No? {MARK}", False),
        ("ben", "Maybe.", True),
    ]
    async with running(cfg) as client:
        got = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=chat(p, stream=s), headers=auth(keys[k])) for k, p, s in plan)
        )
    exts: list[tuple[str, dict[str, Any]]] = []
    for r, (k, _, s) in zip(got, plan, strict=False):
        ext = tierroute_of(r.text, s)
        assert r.status_code == 200 and ext is not None
        exts.append((k, ext))

    by_key = report_csv(capsys, cfg, "--by", "key")
    for key in ("ann", "ben"):
        mine = [e for k, e in exts if k == key]
        assert int(by_key[key]["requests"]) == len(mine)
        assert float(by_key[key]["cost_usd"]) == math.fsum(e["cost_usd"] for e in mine)
        assert float(by_key[key]["top_tier_usd"]) == math.fsum(e["counterfactual_top_tier_usd"] for e in mine)
    assert float(by_key["TOTAL"]["cost_usd"]) == math.fsum(e["cost_usd"] for _, e in exts)

    by_tier = report_csv(capsys, cfg, "--by", "tier")
    assert int(by_tier["small"]["requests"]) == 5 and int(by_tier["small"]["answered"]) == 3
    assert int(by_tier["large"]["answered"]) == 2
    assert float(by_tier["small"]["escalation_rate"]) == 0.4
    small_spend = math.fsum(
        a["cost_usd"] + a["verifier_cost_usd"] for _, e in exts for a in e["attempts"] if a["tier"] == "small"
    )
    assert float(by_tier["small"]["cost_usd"]) == pytest.approx(small_spend, rel=1e-12)
    tokens = sum(a["completion_tokens"] for _, e in exts for a in e["attempts"] if a["tier"] == "large")
    assert int(by_tier["large"]["completion_tokens"]) == tokens

    by_day = report_csv(capsys, cfg, "--by", "day")
    assert int(by_day["TOTAL"]["requests"]) == 5 and len(by_day) in (2, 3)  # a run may straddle midnight
    assert float(by_day["TOTAL"]["escalation_rate"]) == 0.4

    assert report_csv(capsys, cfg, "--by", "model")["auto"]["requests"] == "5"
    empty = report_csv(capsys, cfg, "--until", "2000-01-01")
    assert list(empty) == ["TOTAL"] and empty["TOTAL"]["requests"] == "0"
    assert report_csv(capsys, cfg, "--since", "1h")["TOTAL"]["requests"] == "5"

    html = tmp_path / "report.html"
    assert main(["--config", str(cfg), "report", "costs", "--by", "key", "--format", "html", "-o", str(html)]) == 0
    assert html.read_text().count("data:image/png;base64,") == 2
    assert main(["--config", str(cfg), "report", "costs", "--by", "tier"]) == 0
    table = capsys.readouterr().out
    assert "TOTAL" in table and "small" in table and "large" in table
