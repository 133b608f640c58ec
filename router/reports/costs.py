"""Cost reports from the ledger: aggregation, then a table, CSV, or a self-contained HTML page.

Every figure is computed from ledger entries, which hold the same cost floats the clients
received; nothing is re-priced here. Groupings:

- `key`, `day` (UTC), `model` (what the client asked for), `deployment` (`<tier>/<deployment>` that
  answered, or the tier alone for a tier without deployments), `task` (`router.tasks`; rows
  written before tasks were recorded are `open_ended`, as the quality report reads them): per
  request. `escalation` is the share of requests that went past their first tier; latency is
  admission to answer.
- `tier`: per tier *attempt*, because one request can spend money at several tiers. `cost` and
  tokens are what was spent at that tier, `escalation` is the share of its attempts rejected (sent
  on), latency is its generation time. `answered` counts the requests the tier answered, and
  `top-tier cost` and `savings` belong to those requests, so every column still sums to the total.
  Shadow generations (the operator key `_shadow`, `router.quality.shadow`) are not client traffic: their
  attempts are rows of their own, `<tier> (shadow)`, so a tier's requests, answers and escalation
  rate are the clients' while the shadow spend still sums into the total.

`savings` is what the same requests would have cost sent straight to the top tier, minus what they
cost. `compute s` is the measured generation time beside the priced cost, so nobody mistakes one
for the other.
"""

from __future__ import annotations

import base64
import calendar
import csv
import html
import io
import math
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from router.ledger.entries import SHADOW_KEY, AttemptEntry, LedgerEntry

GroupBy = Literal["tier", "key", "day", "model", "deployment", "task"]
GROUPINGS: tuple[GroupBy, ...] = ("tier", "key", "day", "model", "deployment", "task")
TOTAL = "TOTAL"


@dataclass
class Row:
    group: str
    requests: int = 0  # for `tier`: attempts at the tier
    answered: int = 0
    escalated: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # money is summed with math.fsum at the end: correctly rounded whatever the order, so a report
    # equals, to the last bit, the sum of the costs the clients were sent
    costs: list[float] = field(default_factory=list, repr=False)
    counterfactuals: list[float] = field(default_factory=list, repr=False)
    savings: list[float] = field(default_factory=list, repr=False)
    compute_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def cost_usd(self) -> float:
        return math.fsum(self.costs)

    @property
    def counterfactual_usd(self) -> float:
        return math.fsum(self.counterfactuals)

    @property
    def savings_usd(self) -> float:
        return math.fsum(self.savings)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def escalation_rate(self) -> float:
        return self.escalated / self.requests if self.requests else 0.0

    @property
    def savings_pct(self) -> float | None:
        return 100.0 * self.savings_usd / self.counterfactual_usd if self.counterfactual_usd > 0 else None

    @property
    def p50_ms(self) -> float | None:
        return percentile(self.latencies_ms, 50)

    @property
    def p95_ms(self) -> float | None:
        return percentile(self.latencies_ms, 95)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def utc_day(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def _add_request(row: Row, e: LedgerEntry) -> None:
    row.requests += 1
    row.answered += 1
    row.escalated += int(e.escalated)
    row.prompt_tokens += e.prompt_tokens
    row.completion_tokens += e.completion_tokens
    row.costs.append(e.cost_usd)
    row.counterfactuals.append(e.counterfactual_usd)
    row.savings.append(e.counterfactual_usd - e.cost_usd)
    row.compute_s += sum(_compute_ms(a) for a in e.attempts) / 1000
    row.latencies_ms.append(e.latency_ms)


def _compute_ms(a: AttemptEntry) -> float:
    """Measured busy time where the backend knows it (local tiers), wall latency otherwise."""
    if a.busy_ms is not None:
        return a.busy_ms
    return a.latency_ms or 0.0


def tier_group(entry: LedgerEntry, tier: str) -> str:
    """The row a tier's attempt belongs to: the tier, or `<tier> (shadow)` for shadow work."""
    return f"{tier} (shadow)" if entry.key_id == SHADOW_KEY else tier


def deployment_group(entry: LedgerEntry) -> str:
    """The row a request belongs to by deployment: `<tier>/<deployment>` that answered it, or the
    tier alone when it has none (a local tier, or a row from before deployments)."""
    return f"{entry.tier}/{entry.deployment}" if entry.deployment else entry.tier


def request_group(entry: LedgerEntry, by: GroupBy) -> str:
    """The row a request belongs to, for every grouping but `tier` (which is per attempt)."""
    if by == "key":
        return entry.key_id
    if by == "day":
        return utc_day(entry.ts)
    if by == "model":
        return entry.model
    if by == "deployment":
        return deployment_group(entry)
    if by == "task":
        return entry.task or "open_ended"
    raise ValueError(f"no request grouping {by!r}")


def aggregate(entries: Iterable[LedgerEntry], by: GroupBy) -> tuple[list[Row], Row]:
    """Rows per group, sorted by group, and the total row."""
    rows: dict[str, Row] = {}
    total = Row(TOTAL)

    def row(name: str) -> Row:
        return rows.setdefault(name, Row(name))

    for e in entries:
        _add_request(total, e)
        if by == "tier":
            for a in e.attempts:
                r = row(tier_group(e, a.tier))
                r.requests += 1
                r.escalated += int(a is not e.attempts[-1])  # sent on to the next tier
                r.prompt_tokens += a.prompt_tokens
                r.completion_tokens += a.completion_tokens
                r.costs.extend((a.cost_usd, a.verifier_cost_usd))
                r.compute_s += _compute_ms(a) / 1000
                if a.latency_ms is not None:
                    r.latencies_ms.append(a.latency_ms)
            answering = row(tier_group(e, e.tier))
            answering.answered += 1
            answering.counterfactuals.append(e.counterfactual_usd)
            answering.savings.append(e.counterfactual_usd - e.cost_usd)
        else:
            _add_request(row(request_group(e, by)), e)
    return [rows[k] for k in sorted(rows)], total


# ---- time ------------------------------------------------------------------------------------------

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(text: str, now: float | None = None) -> float:
    """'2025-06-01', '2025-06-01T12:00', '2025-06-01T12:00+02:00' (naive means UTC), 'today',
    'yesterday', or a span ago: '30m', '24h', '7d', '2w'."""
    now = time.time() if now is None else now
    t = text.strip().lower()
    m = _RELATIVE.match(t)
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    if t in ("today", "yesterday"):
        y, mo, d = time.gmtime(now)[:3]
        start = float(calendar.timegm((y, mo, d, 0, 0, 0)))
        return start - (86400 if t == "yesterday" else 0)
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"cannot read time {text!r}: use an ISO date or datetime (UTC unless it has an offset), "
            "'today', 'yesterday', or a span ago such as 24h or 7d"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


# ---- rendering -------------------------------------------------------------------------------------

COLUMNS = (
    "requests",
    "answered",
    "cost_usd",
    "top_tier_usd",
    "savings_usd",
    "savings_pct",
    "prompt_tokens",
    "completion_tokens",
    "escalation_rate",
    "p50_ms",
    "p95_ms",
    "compute_s",
)


def _values(r: Row) -> dict[str, float | int | None]:
    return {
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


def to_csv(rows: list[Row], total: Row, by: GroupBy) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([by, *COLUMNS])
    for r in [*rows, total]:
        w.writerow([r.group, *("" if v is None else repr(v) for v in _values(r).values())])
    return buf.getvalue()


def _fmt(column: str, v: float | int | None) -> str:
    if v is None:
        return "-"
    if column in ("cost_usd", "top_tier_usd", "savings_usd"):
        return f"-${-v:,.6f}" if v < 0 else f"${v:,.6f}"
    if column == "savings_pct":
        return f"{v:.1f}%"
    if column == "escalation_rate":
        return f"{100 * v:.1f}%"
    if column in ("p50_ms", "p95_ms"):
        return f"{v:,.0f}"
    if column == "compute_s":
        return f"{v:,.1f}"
    return f"{v:,}"


_HEADERS = {
    "requests": "requests",
    "answered": "answered",
    "cost_usd": "cost",
    "top_tier_usd": "top-tier cost",
    "savings_usd": "savings",
    "savings_pct": "saved",
    "prompt_tokens": "prompt tok",
    "completion_tokens": "compl. tok",
    "escalation_rate": "escalation",
    "p50_ms": "p50 ms",
    "p95_ms": "p95 ms",
    "compute_s": "compute s",
}


def _columns(by: GroupBy) -> tuple[str, ...]:
    # 'answered' only differs from 'requests' when rows are tiers
    return COLUMNS if by == "tier" else tuple(c for c in COLUMNS if c != "answered")


def table_rows(rows: list[Row], total: Row, by: GroupBy) -> tuple[list[str], list[list[str]]]:
    """Header and formatted cells, the total last; shared by the terminal and HTML tables."""
    cols = _columns(by)
    header = [by, *(_HEADERS[c] for c in cols)]
    body = []
    for r in [*rows, total]:
        v = _values(r)
        body.append([r.group, *(_fmt(c, v[c]) for c in cols)])
    return header, body


@dataclass
class Series:
    """Per time bucket: cost spent per tier, top-tier cost, and the escalation rate (nan where a
    bucket has no requests)."""

    labels: list[str]
    starts: list[float]
    cost_by_tier: dict[str, list[float]]
    counterfactual: list[float]
    escalation_rate: list[float]
    requests: list[int]


def time_series(entries: Sequence[LedgerEntry]) -> Series:
    """Hourly buckets for spans up to three days, daily beyond."""
    if not entries:
        return Series([], [], {}, [], [], [])
    span = entries[-1].ts - entries[0].ts
    step = 3600 if span <= 3 * 86400 else 86400
    fmt = "%Y-%m-%d %H:00" if step == 3600 else "%Y-%m-%d"
    buckets: dict[float, list[LedgerEntry]] = defaultdict(list)
    for e in entries:
        buckets[e.ts - e.ts % step].append(e)
    # every period from the first to the last, so quiet periods show as gaps, not as nothing
    starts = [min(buckets) + i * step for i in range(int((max(buckets) - min(buckets)) // step) + 1)]
    tiers = sorted({tier_group(e, a.tier) for e in entries for a in e.attempts})
    cost = {t: [0.0] * len(starts) for t in tiers}
    cf, esc, n = [], [], []
    for i, s in enumerate(starts):
        group = buckets.get(s, [])
        for e in group:
            for a in e.attempts:
                cost[tier_group(e, a.tier)][i] += a.cost_usd + a.verifier_cost_usd
        cf.append(math.fsum(e.counterfactual_usd for e in group))
        routed = [e for e in group if e.key_id != SHADOW_KEY]  # shadow work is never escalated
        esc.append(sum(e.escalated for e in routed) / len(routed) if routed else math.nan)  # nan: a gap
        n.append(len(routed))
    labels = [time.strftime(fmt, time.gmtime(s)) for s in starts]
    return Series(labels, starts, cost, cf, esc, n)


def png_base64(fig: object) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")  # type: ignore[attr-defined]
    return base64.b64encode(buf.getvalue()).decode()


def plots(series: Series) -> list[tuple[str, str]]:
    """(title, base64 PNG) for cost over time and escalation rate over time."""
    if not series.labels:
        return []
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    x = list(range(len(series.labels)))
    ticks = x if len(x) <= 12 else x[:: max(1, len(x) // 12)]
    out = []

    fig = Figure(figsize=(8, 3.4))
    ax = fig.subplots()
    bottom = [0.0] * len(x)
    for tier, values in series.cost_by_tier.items():
        ax.bar(x, values, bottom=bottom, label=f"spent at {tier}")
        bottom = [b + v for b, v in zip(bottom, values, strict=False)]
    ax.plot(x, series.counterfactual, color="black", marker="o", label="top tier only")
    ax.set_ylabel("USD")
    ax.set_xticks(ticks, [series.labels[i] for i in ticks], rotation=30, ha="right", fontsize=8)
    ax.legend(fontsize=8)
    ax.set_title("Cost per period, by tier, against sending everything to the top tier", fontsize=10)
    out.append(("Cost over time", png_base64(fig)))

    fig = Figure(figsize=(8, 3.0))
    ax = fig.subplots()
    ax.plot(x, [100 * v for v in series.escalation_rate], marker="o")
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of requests escalated")
    ax.set_xticks(ticks, [series.labels[i] for i in ticks], rotation=30, ha="right", fontsize=8)
    ax.set_title("Escalation rate per period", fontsize=10)
    out.append(("Escalation rate over time", png_base64(fig)))
    return out


def to_html(
    rows: list[Row],
    total: Row,
    by: GroupBy,
    entries: Sequence[LedgerEntry],
    *,
    title: str,
    window: str,
    prices: Sequence[tuple[str, str]] = (),
) -> str:
    """One self-contained page: the table, the price sheet, and the plots inlined as PNG."""
    esc = html.escape
    header, body = table_rows(rows, total, by)
    thead = "".join(f"<th>{esc(h)}</th>" for h in header)
    tbody = "\n".join(
        ("<tr class=total>" if i == len(body) - 1 else "<tr>") + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>"
        for i, cells in enumerate(body)
    )
    price_items = "".join(f"<li><b>{esc(t)}</b>: {esc(p)}</li>" for t, p in prices)
    figures = "".join(
        f'<figure><img alt="{esc(t)}" src="data:image/png;base64,{png}"><figcaption>{esc(t)}</figcaption></figure>'
        for t, png in plots(time_series(entries))
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
tr.total td {{ font-weight: bold; background: #f3f3f3; }}
figure {{ margin: 1.5em 0; }}
.note {{ color: #555; font-size: 0.9em; max-width: 60em; }}
</style></head><body>
<h1>{esc(title)}</h1>
<p>{esc(window)}; {total.requests} requests, grouped by {esc(by)}.</p>
<table><thead><tr>{thead}</tr></thead><tbody>
{tbody}
</tbody></table>
<p class=note>Savings compare each request's cost with what it would have cost sent straight to the
top tier. Costs are priced from the price sheet below; compute s is the measured generation time.</p>
{f"<h2>Price sheet</h2><ul>{price_items}</ul>" if price_items else ""}
{f"<h2>Over time</h2>{figures}" if figures else "<p>No requests in this window.</p>"}
</body></html>
"""
