"""What each dashboard page shows, as plain JSON values, made by the reports' own code.

Nothing here adds up money or counts answers itself: spend, savings, escalation and latency are
`router.reports.costs.aggregate`'s rows (the same rows `tierroute report costs --by ...` prints),
quality is `router.reports.quality.build`'s (`tierroute report quality`). A day's spend per tier
is `aggregate(..., "tier")` over that UTC day's requests, which is what `report costs --since DAY
--until DAY+1` prints. This module only picks the figures and names them for the page.

Numbers go out as JSON numbers (None where a report shows '-'), never formatted text, so the page
formats them and a test compares them with the report's CSV.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.config import Settings
from router.ledger.entries import Feedback, LedgerEntry, ShadowPair
from router.policy import describe
from router.reports import costs
from router.reports import quality as quality_report


@dataclass(frozen=True)
class Window:
    """The span a page covers: unix seconds, either end open (None)."""

    since: float | None
    until: float | None

    def as_json(self, requests: int) -> dict[str, Any]:
        def shown(ts: float | None) -> str | None:
            return None if ts is None else time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))

        return {
            "since": self.since,
            "until": self.until,
            "since_text": shown(self.since),
            "until_text": shown(self.until),
            "requests": requests,
        }


def cost_row(r: costs.Row) -> dict[str, Any]:
    """One report row's figures, by the report's CSV column names."""
    return {
        "group": r.group,
        "requests": r.requests,
        "answered": r.answered,
        "cost_usd": r.cost_usd,
        "top_tier_usd": r.counterfactual_usd,
        "savings_usd": r.savings_usd,
        "savings_pct": r.savings_pct,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "escalation_rate": r.escalation_rate,
        "p50_ms": r.p50_ms,
        "p95_ms": r.p95_ms,
        "compute_s": r.compute_s,
    }


def prices(settings: Settings) -> list[dict[str, str]]:
    """The price sheet every saving is computed from, as the cost report prints it."""
    return [{"tier": t.name, "price": describe(t.price)} for t in settings.tiers]


def overview(entries: Sequence[LedgerEntry], settings: Settings, window: Window) -> dict[str, Any]:
    """Spend per tier and per UTC day, the saving against the top tier, requests and escalation per task."""
    tiers, total = costs.aggregate(entries, "tier")
    tasks, _ = costs.aggregate(entries, "task")
    by_day: dict[str, list[LedgerEntry]] = defaultdict(list)
    for e in entries:
        by_day[costs.utc_day(e.ts)].append(e)
    days = []
    for day in sorted(by_day):
        rows, day_total = costs.aggregate(by_day[day], "tier")
        days.append(
            {
                "day": day,
                "tiers": {r.group: r.cost_usd for r in rows},
                "cost_usd": day_total.cost_usd,
                "top_tier_usd": day_total.counterfactual_usd,
                "requests": day_total.requests,
                "escalation_rate": day_total.escalation_rate,
            }
        )
    return {
        "window": window.as_json(total.requests),
        "top_tier": settings.tiers[-1].name,
        "prices": prices(settings),
        "total": cost_row(total),
        "tiers": [cost_row(r) for r in tiers],
        "tasks": [cost_row(r) for r in tasks],
        "days": days,
    }


def thresholds(settings: Settings) -> list[dict[str, Any]]:
    """The thresholds in force: each tier's own, each task policy's where it sets one, and the
    drift baselines its shadow sampling states. The last tier accepts whatever it answers."""
    found = []
    last = settings.tiers[-1].name
    for t in settings.tiers:
        shadow = t.shadow
        found.append(
            {
                "tier": t.name,
                "last": t.name == last,
                "threshold": t.threshold,
                "tasks": {task: p.threshold for task, p in sorted(t.tasks.items()) if p.threshold is not None},
                "shadow_rate": None if shadow is None else shadow.rate,
                "baseline_accept": {} if shadow is None else dict(shadow.baseline_accept),
                "baseline_agree": {} if shadow is None else dict(shadow.baseline_agree),
            }
        )
    return found


def quality(
    entries: Sequence[LedgerEntry],
    pairs: Sequence[ShadowPair],
    labels: Sequence[Feedback],
    settings: Settings,
    window: Window,
) -> dict[str, Any]:
    """Acceptance, shadow agreement and label accuracy per tier, task and threshold with their
    Wilson intervals, and the drift alarms, as `report quality` computes them."""
    q = quality_report.build(entries, pairs, settings, labels)
    return {
        "window": window.as_json(len(entries)),
        "rows": [r.values() for r in q.rows],
        "alarms": [
            {
                "ts": a.ts,
                "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(a.ts)),
                "tier": a.tier,
                "task": a.task,
                "signal": a.signal,
                "direction": a.direction,
                "baseline": a.baseline,
                "recent": a.recent,
                "recent_n": a.recent_n,
                "text": a.describe(),
            }
            for a in q.alarms
        ],
        "pairs": len(q.pairs),
        "labels": q.labels,
        "unplaced": q.unplaced,
        "thresholds": thresholds(settings),
    }


def latency(
    entries: Sequence[LedgerEntry],
    window: Window,
    live: Mapping[str, Mapping[str, float]],
    deployments: Mapping[str, Mapping[str, Mapping[str, float]]],
) -> dict[str, Any]:
    """Latency percentiles per tier (each attempt's generation time) and of whole requests
    (admission to answer), with each backend's and deployment's live gauges (queue depth,
    breaker) as /metrics reads them. Time to first token is not in the ledger: it is not shown."""
    tiers, total = costs.aggregate(entries, "tier")
    return {
        "window": window.as_json(total.requests),
        "tiers": [
            {"tier": r.group, "attempts": r.requests, "p50_ms": r.p50_ms, "p95_ms": r.p95_ms, "compute_s": r.compute_s}
            for r in tiers
        ],
        "requests": {"requests": total.requests, "p50_ms": total.p50_ms, "p95_ms": total.p95_ms},
        "backends": [{"tier": tier, "stats": dict(stats)} for tier, stats in live.items()],
        "deployments": [
            {"tier": tier, "deployment": name, "stats": dict(stats)}
            for tier, found in deployments.items()
            for name, stats in found.items()
        ],
    }


def keys(
    entries: Sequence[LedgerEntry],
    window: Window,
    budgets: Sequence[Mapping[str, Any]],
    refusals: Mapping[str, float],
    top: int = 10,
) -> dict[str, Any]:
    """The top spenders of the window (`report costs --by key`), each key's and team's spend this
    UTC day and month against its budgets (the admin API's spend), and the refusals counted since
    the process started (rate limits and budgets: /metrics' `tierroute_requests_refused`)."""
    rows, total = costs.aggregate(entries, "key")
    spenders = sorted(rows, key=lambda r: (-r.cost_usd, r.group))[:top]
    return {
        "window": window.as_json(total.requests),
        "top": [cost_row(r) for r in spenders],
        "total": cost_row(total),
        "budgets": [dict(b) for b in budgets],
        "refusals": dict(refusals),
    }
