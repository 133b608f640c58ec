"""`tierroute report quality`: how good each tier's accepted answers are in production, from the
ledger's requests, shadow pairs (`router.quality.shadow`) and the labels clients posted
(`router.quality.feedback`).

Per tier, task and threshold (a recalibrated threshold is a new population, so it gets its own row):

- `tried`, `accepted`, `acceptance`: the tier's answers on 'auto' requests, and the share that
  passed its threshold (the last tier accepts everything and is left out);
- `pairs`, `agreed`, `agreement` with its 95% Wilson interval: the shadow-sampled share of the
  accepted answers, compared with the target tier's answers (`router.quality.agreement`);
- `labelled`, `labelled right`, `label accuracy` with its 95% Wilson interval: the answers the
  tier gave that their clients labelled (POST /v1/feedback), and the share whose latest label
  says right. Ground truth, but of the answers clients chose to label, not of a random sample;
- `est. accuracy`: the estimated accuracy of the accepted answers, which is the agreement rate:
  agreement with the larger tier stands in for correctness. It is exact only where the larger
  tier is always right; both tiers wrong alike reads as right, and a strict rule (free text)
  reads right answers worded differently as wrong.

A label counts for the request it names when that request is in the window (by the request's
time, whatever the label's); labels of requests that passed no threshold (a tier named by the
client, an unverified answer) are counted apart (`Quality.unplaced`).

Drift: the same detectors the service runs live (`router.quality.drift`), replayed over the window in
time order with the config's baselines, so the report lists the alarms the service raised (a
window that starts mid-history learns its baselines afresh, and may differ). Feedback is replayed
as the service saw it: each labelled request once, at its first label.

Shadow requests (key `_shadow`) are the shadow's own work and are left out of the acceptance
counts; their cost is in `report costs`.
"""

from __future__ import annotations

import csv
import html
import io
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from router.config import SHADOW_KEY, Settings
from router.ledger.entries import Feedback, LedgerEntry, ShadowPair
from router.quality.drift import Alarm, DriftMonitor, Signal
from router.quality.feedback import answered, verdicts
from router.quality.live import Tally, threshold_label, wilson
from router.reports.costs import png_base64


@dataclass
class QualityRow:
    tier: str
    task: str
    threshold: float
    tally: Tally = field(default_factory=Tally)
    targets: set[str] = field(default_factory=set)
    rules: dict[str, int] = field(default_factory=dict)

    def values(self) -> dict[str, str | int | float | None]:
        t = self.tally
        low, high = t.interval or (None, None)
        label_low, label_high = t.label_interval or (None, None)
        return {
            "tier": self.tier,
            "task": self.task,
            "threshold": self.threshold,
            "tried": t.tried,
            "accepted": t.accepted,
            "acceptance": t.acceptance,
            "target": ",".join(sorted(self.targets)),
            "pairs": t.pairs,
            "agreed": t.agreed,
            "agreement": t.agreement,
            "wilson_low": low,
            "wilson_high": high,
            "labelled": t.labelled,
            "labelled_right": t.right,
            "label_accuracy": t.label_accuracy,
            "label_low": label_low,
            "label_high": label_high,
            "est_accuracy": t.agreement,
            "rules": ",".join(f"{r}:{n}" for r, n in sorted(self.rules.items())),
        }


COLUMNS = (
    "tier",
    "task",
    "threshold",
    "tried",
    "accepted",
    "acceptance",
    "target",
    "pairs",
    "agreed",
    "agreement",
    "wilson_low",
    "wilson_high",
    "labelled",
    "labelled_right",
    "label_accuracy",
    "label_low",
    "label_high",
    "est_accuracy",
    "rules",
)


@dataclass
class Quality:
    rows: list[QualityRow]
    alarms: list[Alarm]
    entries: Sequence[LedgerEntry]
    pairs: Sequence[ShadowPair]
    labels: int = 0  # labels of requests in the window
    unplaced: int = 0  # labelled requests in the window that passed no threshold: in no row


def _tried(entries: Sequence[LedgerEntry], last: str | None) -> list[tuple[float, str, float, str, bool]]:
    """(ts, tier, threshold, task, accepted) for each answer a tier that could reject gave."""
    out = []
    for e in entries:
        if e.key_id == SHADOW_KEY or e.model != "auto" or e.unverified:
            continue
        for a in e.attempts:
            if a.decision not in ("accepted", "rejected"):
                continue
            # the last tier accepts whatever it answers; without the config, its reason says so
            if a.tier == last or (last is None and a.reason.startswith("last tier")):
                continue
            out.append((e.ts, a.tier, a.threshold, e.task or "open_ended", a.decision == "accepted"))
    return out


def build(
    entries: Sequence[LedgerEntry],
    pairs: Sequence[ShadowPair],
    settings: Settings | None = None,
    feedback: Sequence[Feedback] = (),
) -> Quality:
    """The report's figures. Without settings the last tier is not known: its attempts are told
    by their reason ('last tier: ...'), which misses a last tier whose verifiers passed.
    `feedback` may hold labels of requests outside `entries`: only those of `entries` count."""
    last = settings.tiers[-1].name if settings is not None else None
    rows: dict[tuple[str, str, float], QualityRow] = {}

    def row(tier: str, task: str, threshold: float) -> QualityRow:
        return rows.setdefault((tier, task, threshold), QualityRow(tier, task, threshold))

    events: list[tuple[float, int, str, str, Signal, bool]] = []
    for ts, tier, threshold, task, ok in _tried(entries, last):
        r = row(tier, task, threshold)
        r.tally.tried += 1
        r.tally.accepted += int(ok)
        events.append((ts, 0, tier, task, "acceptance", ok))
    for p in pairs:
        task = p.task or "open_ended"
        r = row(p.tier, task, p.threshold)
        r.tally.pairs += 1
        r.tally.agreed += int(p.agree)
        r.targets.add(p.target)
        r.rules[p.rule] = r.rules.get(p.rule, 0) + 1
        events.append((p.ts, 1, p.tier, task, "agreement", p.agree))
    by_id = {e.request_id: e for e in entries}
    labels = [f for f in feedback if f.request_id in by_id]
    unplaced = 0
    for rid, verdict in verdicts(labels).items():
        about = answered(by_id[rid])
        if about is None:
            unplaced += 1
            continue
        r = row(about.tier, about.task, about.threshold)
        r.tally.labelled += 1
        r.tally.right += int(verdict.right)
        events.append((verdict.first_ts, 2, about.tier, about.task, "feedback", verdict.first_right))
    monitor = DriftMonitor(*_baselines(settings))
    for ts, _, tier, task, signal, ok in sorted(events, key=lambda e: (e[0], e[1])):
        monitor.observe(tier, task, signal, ok, ts)
    ordered = [rows[k] for k in sorted(rows)]
    return Quality(ordered, monitor.alarms, entries, pairs, len(labels), unplaced)


def _baselines(settings: Settings | None) -> tuple[Callable[[str, Signal, str], float | None], Callable[[str], int]]:
    def baseline(tier: str, signal: Signal, task: str) -> float | None:
        if settings is None or signal == "feedback":  # labels have no stated baseline: learned
            return None
        try:
            cfg = settings.tier(tier).shadow
        except KeyError:
            return None
        if cfg is None:
            return None
        stated = cfg.baseline_accept if signal == "acceptance" else cfg.baseline_agree
        return stated.get(task, stated.get("*"))

    def warmup(tier: str) -> int:
        if settings is not None:
            try:
                cfg = settings.tier(tier).shadow
            except KeyError:
                cfg = None
            if cfg is not None:
                return cfg.baseline_n
        return 200

    return baseline, warmup


def _fmt(column: str, v: str | int | float | None) -> str:
    if v is None:
        return "-"
    if column in (
        "acceptance",
        "agreement",
        "wilson_low",
        "wilson_high",
        "label_accuracy",
        "label_low",
        "label_high",
        "est_accuracy",
    ):
        return f"{100 * float(v):.1f}%"
    if column == "threshold":
        return threshold_label(float(v))
    return str(v)


def table(q: Quality) -> tuple[list[str], list[list[str]]]:
    header = [c.replace("_", " ") for c in COLUMNS]
    return header, [[_fmt(c, r.values()[c]) for c in COLUMNS] for r in q.rows]


def alarm_lines(q: Quality) -> list[str]:
    return [f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(a.ts))} {a.describe()}" for a in q.alarms]


def to_csv(q: Quality) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in q.rows:
        v = r.values()
        v["threshold"] = threshold_label(r.threshold)
        w.writerow(["" if v[c] is None else (f"{v[c]:.6f}" if isinstance(v[c], float) else v[c]) for c in COLUMNS])
    return buf.getvalue()


@dataclass
class _Bucketed:
    labels: list[str]
    agreement: dict[str, list[tuple[int, int]]]  # tier -> (agreed, pairs) per bucket
    acceptance: dict[str, list[tuple[int, int]]]  # tier -> (accepted, tried) per bucket


def _buckets(q: Quality, last: str | None) -> _Bucketed:
    """Hourly buckets for spans up to three days, daily beyond (as the cost report's)."""
    stamps = [p.ts for p in q.pairs] + [t[0] for t in _tried(q.entries, last)]
    if not stamps:
        return _Bucketed([], {}, {})
    lo, hi = min(stamps), max(stamps)
    step = 3600 if hi - lo <= 3 * 86400 else 86400
    first = lo - lo % step
    n = int((hi - first) // step) + 1
    agreement: dict[str, list[tuple[int, int]]] = defaultdict(lambda: [(0, 0)] * n)
    acceptance: dict[str, list[tuple[int, int]]] = defaultdict(lambda: [(0, 0)] * n)
    for p in q.pairs:
        i = int((p.ts - first) // step)
        k, m = agreement[p.tier][i]
        agreement[p.tier][i] = (k + int(p.agree), m + 1)
    for ts, tier, _, _, ok in _tried(q.entries, last):
        i = int((ts - first) // step)
        k, m = acceptance[tier][i]
        acceptance[tier][i] = (k + int(ok), m + 1)
    fmt = "%Y-%m-%d %H:00" if step == 3600 else "%Y-%m-%d"
    labels = [time.strftime(fmt, time.gmtime(first + i * step)) for i in range(n)]
    return _Bucketed(labels, dict(agreement), dict(acceptance))


def plots(q: Quality, last: str | None = None) -> list[tuple[str, str]]:
    """(title, base64 PNG): agreement with its Wilson band, and acceptance, per period and tier."""
    b = _buckets(q, last)
    if not b.labels:
        return []
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    x = list(range(len(b.labels)))
    ticks = x if len(x) <= 12 else x[:: max(1, len(x) // 12)]
    out = []
    for title, series, band in (
        ("Shadow agreement (estimated accuracy of accepted answers) per period", b.agreement, True),
        ("Acceptance rate per period", b.acceptance, False),
    ):
        if not series:
            continue
        fig = Figure(figsize=(8, 3.2))
        ax = fig.subplots()
        for tier, counts in sorted(series.items()):
            rate = [100 * k / m if m else math.nan for k, m in counts]
            (line,) = ax.plot(x, rate, marker="o", label=tier)
            if band:
                bounds = [wilson(k, m) if m else (math.nan, math.nan) for k, m in counts]
                ax.fill_between(
                    x, [100 * lo for lo, _ in bounds], [100 * hi for _, hi in bounds], alpha=0.2, color=line.get_color()
                )
        for a in q.alarms:
            label = time.strftime("%Y-%m-%d %H:00" if ":" in b.labels[0] else "%Y-%m-%d", time.gmtime(a.ts))
            if label in b.labels:
                ax.axvline(b.labels.index(label), color="red", linestyle="--", linewidth=1)
        ax.set_ylim(0, 100)
        ax.set_ylabel("%")
        ax.set_xticks(ticks, [b.labels[i] for i in ticks], rotation=30, ha="right", fontsize=8)
        ax.legend(fontsize=8)
        ax.set_title(title + (" (band: 95% Wilson; red: drift alarms)" if band else ""), fontsize=9)
        out.append((title, png_base64(fig)))
    return out


def to_html(q: Quality, *, title: str, window: str, last: str | None = None) -> str:
    esc = html.escape
    header, body = table(q)
    thead = "".join(f"<th>{esc(h)}</th>" for h in header)
    tbody = "\n".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>" for cells in body)
    alarms = "".join(f"<li>{esc(line)}</li>" for line in alarm_lines(q))
    unplaced = f" ({q.unplaced} labelled requests passed no threshold and are in no row)" if q.unplaced else ""
    figures = "".join(
        f'<figure><img alt="{esc(t)}" src="data:image/png;base64,{png}"><figcaption>{esc(t)}</figcaption></figure>'
        for t, png in plots(q, last)
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
figure {{ margin: 1.5em 0; }}
.note {{ color: #555; font-size: 0.9em; max-width: 60em; }}
.alarm {{ color: #a00; }}
</style></head><body>
<h1>{esc(title)}</h1>
<p>{esc(window)}; {len(q.pairs)} shadow pairs; {q.labels} feedback labels{unplaced}.</p>
<table><thead><tr>{thead}</tr></thead><tbody>
{tbody}
</tbody></table>
<p class=note>est. accuracy is the agreement rate: agreement with the larger tier stands in for
correctness (exact only where the larger tier is always right). label accuracy is the share of the
answers clients labelled whose latest label says right (POST /v1/feedback). Intervals are 95% Wilson.</p>
<h2>Drift alarms</h2>
{f"<ul class=alarm>{alarms}</ul>" if alarms else "<p>None.</p>"}
{f"<h2>Over time</h2>{figures}" if figures else "<p>No shadow pairs or requests in this window.</p>"}
</body></html>
"""
