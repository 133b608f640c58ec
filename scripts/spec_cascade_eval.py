"""The speculative cascade beside the sequential cascade, on the same eval items: the report in
docs/eval/spec-cascade.md and its figures, rebuilt from committed per-item results (no model).

    .venv/bin/python scripts/spec_cascade_eval.py [--results evals/results] [--out docs/eval]

A speculative cascade run is the large tier alone, drafting with the small tier's model under a
deferral rule (`[tiers.llamacpp] spec_cascade`), stored as `<suite>-speccascade-<rule>-<margin>`
(evals/configs/ holds each run's config and command); `<suite>-speccascade-off` is the plain large
tier rerun beside them, which shows how far the machine's speed moved since the committed runs.
The sequential cascade is the committed two-tier run (`<suite>`), restricted to the items every
speculative run answered, swept over thresholds of the config's verifier and of the free verifier
(no extra generation) that ranks the small tier's answers best there (AUROC).

Pricing, decided here and stated in the report. At hosted token prices the speculative cascade
pays the large tier's price for every token: the large model reads every position, kept or not,
so its bill is the large tier's for an answer of that length (the draft model's own work, a
small model's busy time, is left out: it only flatters the speculative cascade). The sequential
cascade pays the small tier's busy time and, when it escalates, the large tier's tokens, as the
committed report prices it. On hourly-priced local hardware both pay their busy seconds: the
second axis. Latency is each request's wall time in the eval's batches (width 8 for every run).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evals import measures
from evals.store import RunStore
from evals.sweep import CONFIG, CascadePolicy, ItemOutcome, ResultTable, Route, load_table, route_cost

SUITES = ("gsm8k", "humaneval")
RUN_NAME = re.compile(r"^(?P<suite>[a-z0-9]+)-speccascade-(?:(?P<rule>chow|diff|opt)-(?P<margin>-?[0-9.]+)|off)$")


@dataclass(frozen=True)
class Point:
    label: str
    n: int
    accuracy: float
    cost_per_1k: float  # USD per 1,000 requests
    busy_s: float  # mean busy seconds per request
    latency_s: float  # mean wall seconds per request
    param: float | None = None  # the threshold or margin
    kept: float | None = None  # share of answer tokens the draft model supplied unchecked
    escalated: float | None = None  # sequential cascade: share escalated
    # busy and wall seconds as multiples of the large tier alone measured in the same session (the
    # committed run for the committed points, the "off" rerun for the speculative ones): the
    # machine is shared, and its load moved absolute seconds several-fold between sessions
    busy_x: float = 0.0
    latency_x: float = 0.0


def relative(p: Point, ref: Point) -> Point:
    return replace(p, busy_x=p.busy_s / ref.busy_s, latency_x=p.latency_s / ref.latency_s)


@dataclass(frozen=True)
class SpecRun:
    name: str
    rule: str | None  # None: the plain large tier ("off")
    margin: float | None
    table: ResultTable
    store: RunStore


def spec_runs(results: Path, suite: str) -> list[SpecRun]:
    """The suite's speculative cascade runs (and its "off" rerun), by rule then margin."""
    runs = []
    for path in sorted(results.glob(f"{suite}-speccascade-*")):
        m = RUN_NAME.match(path.name)
        if m is None or m["suite"] != suite or not (path / "manifest.json").exists():
            continue
        store = RunStore(path)
        table = load_table(store, tiers=["large"])
        margin = None if m["margin"] is None else float(m["margin"])
        runs.append(SpecRun(path.name, m["rule"], margin, table, store))
    return sorted(runs, key=lambda r: (r.rule is not None, r.rule or "", r.margin or 0.0))


def kept_share(store: RunStore, ids: set[str]) -> float:
    """The share of the answers' tokens (on items `ids`) the draft model supplied unchecked."""
    tokens = kept = 0
    for rec in store.generations.records.values():
        if rec.item in ids and rec.tier == "large":
            tokens += rec.completion_tokens
            kept += sum(d[2] for d in rec.drafts or () if d[0] == "cascade")
    return kept / tokens if tokens else 0.0


def _busy(item: ItemOutcome, route: Route) -> float:
    busy = sum(item.tiers[t].busy_s for t in route.ran)
    return busy + sum(item.tiers[t].verify_s.get(label, 0.0) for t, label in route.verified)


def _point(label: str, table: ResultTable, routes: Sequence[Route], **extra: Any) -> Point:
    costs, lat, busy, right = [], [], [], 0
    for item, route in zip(table.items, routes, strict=True):
        cost, latency, correct = route_cost(item, route)
        costs.append(cost)
        lat.append(latency)
        busy.append(_busy(item, route))
        right += correct
    n = len(table.items)
    return Point(label, n, right / n, measures.cost_per_1k(costs), sum(busy) / n, sum(lat) / n, **extra)


def single(label: str, table: ResultTable, tier: int, **extra: Any) -> Point:
    return _point(label, table, [Route(tier, (tier,)) for _ in table.items], **extra)


def cascade_curve(table: ResultTable, verifier: str) -> list[Point]:
    """The sequential cascade at every threshold that changes a decision on these items."""
    scores = sorted({s for it in table.items if (s := it.tiers[0].scores.get(verifier)) is not None})
    points = []
    for threshold in [*scores, 2.0]:  # 2.0: escalate everything
        policy = CascadePolicy(verifier, (threshold,))
        routes = [policy.route(it) for it in table.items]
        escalated = sum(r.answered != 0 for r in routes) / len(routes)
        points.append(_point(f"cascade[{verifier}]", table, routes, param=threshold, escalated=escalated))
    return points


def free_verifiers(table: ResultTable) -> list[str]:
    """Verifiers that cost nothing beyond the small tier's own answer on every item."""
    return [
        v
        for v in table.verifiers
        if v != CONFIG and all(it.tiers[0].verify_cost_usd.get(v, 0.0) == 0.0 for it in table.items)
    ]


def best_free(table: ResultTable) -> tuple[str, float]:
    """The free verifier, other than the small tier's configured ones (the config curve is
    theirs), whose scores rank the small tier's answers best (AUROC; abstentions count as the
    lowest score, as the cascade escalates them)."""
    configured = {v["label"] for v in table.manifest["tiers"][0]["verifiers"]}
    ranked = []
    for v in free_verifiers(table):
        if v in configured:
            continue
        scores = [it.tiers[0].scores.get(v) for it in table.items]
        auc = measures.auroc([it.tiers[0].correct for it in table.items], [-1.0 if s is None else s for s in scores])
        if auc is not None:
            ranked.append((auc, v))
    auc, v = max(ranked)
    return v, auc


def dominated_by_curve(p: Point, curve: Sequence[Point], axis: str) -> bool:
    """Whether some setting of the curve is at least as accurate and no dearer on `axis`."""
    return any(c.accuracy >= p.accuracy and getattr(c, axis) <= getattr(p, axis) for c in curve)


@dataclass(frozen=True)
class SuiteReport:
    suite: str
    n: int
    small: Point
    large: Point
    specs: list[Point]
    off: Point | None
    curves: dict[str, list[Point]]
    best_free: tuple[str, float]


def build(results: Path, suite: str) -> SuiteReport | None:
    runs = [r for r in spec_runs(results, suite) if r.table.items]  # a run just started has none yet
    if not runs:
        return None
    ids = set.intersection(*({it.id for it in r.table.items} for r in runs))
    committed = load_table(RunStore(results / suite), tiers=["small", "large"]).subset(ids)
    specs, off = [], None
    for r in runs:
        table = r.table.subset(ids)
        if r.rule is None:
            off = single("large alone, rerun now", table, 0)
        else:
            label = f"speculative cascade {r.rule} {r.margin:g}"
            specs.append(single(label, table, 0, param=r.margin, kept=kept_share(r.store, ids)))
    large = single("large alone", committed, 1)
    now = off or large
    free = best_free(committed)
    curves = {v: [relative(p, large) for p in cascade_curve(committed, v)] for v in (CONFIG, free[0])}
    return SuiteReport(
        suite=suite,
        n=len(committed.items),
        small=relative(single("small alone", committed, 0), large),
        large=relative(large, large),
        specs=[relative(p, now) for p in specs],
        off=None if off is None else relative(off, off),
        curves=curves,
        best_free=free,
    )


# ---- the report ---------------------------------------------------------------------------------

AXES = (
    ("cost_per_1k", "$ per 1k requests"),
    ("busy_x", "busy seconds, x the large tier alone"),
    ("latency_x", "latency, x the large tier alone"),
)


def _row(p: Point) -> str:
    kept = "" if p.kept is None else f"{100 * p.kept:.0f}%"
    return (
        f"| {p.label} | {p.n} | {100 * p.accuracy:.1f}% | {p.cost_per_1k:.3f} | {p.busy_s:.2f} ({p.busy_x:.2f}x) | "
        f"{p.latency_s:.1f} ({p.latency_x:.2f}x) | {kept} |"
    )


def _verdict(r: SuiteReport) -> list[str]:
    lines = []
    curve = [p for c in r.curves.values() for p in c]
    for p in r.specs:
        beaten = [name for axis, name in AXES if dominated_by_curve(p, curve, axis)]
        gain = p.accuracy - r.large.accuracy
        if len(beaten) == len(AXES):
            what = "the sequential cascade does at least as well for less on every axis"
        elif beaten:
            what = f"the sequential cascade does at least as well for less in {', '.join(beaten)}"
        else:
            what = "no setting of the sequential cascade is both as accurate and as cheap on any axis"
        now = ""
        if r.off is not None:
            now = (
                f" Against the large tier rerun now, beside it on the same machine: busy seconds "
                f"{p.busy_s / r.off.busy_s:.2f}x, latency {p.latency_s / r.off.latency_s:.2f}x, "
                f"$ {p.cost_per_1k / r.off.cost_per_1k:.2f}x."
            )
        lines.append(
            f"- {p.label}: {100 * p.accuracy:.1f}% ({100 * gain:+.1f} points against the large tier alone), "
            f"{100 * (p.kept or 0.0):.0f}% of its tokens the small model's unchecked; {what}.{now}"
        )
    return lines


def render(reports: Sequence[SuiteReport], figures: dict[str, str]) -> str:
    out = [
        "# The speculative cascade against the sequential cascade",
        "",
        "Written by `scripts/spec_cascade_eval.py` from the committed runs in evals/results (no model):",
        "",
        "    .venv/bin/python scripts/spec_cascade_eval.py",
        "",
        "The speculative cascade (research mode, docs/speculative-cascade.md) runs the large tier",
        "(Qwen2.5-Coder-1.5B) drafting with the small tier's model (Qwen2.5-Coder-0.5B); at each drafted",
        "position a deferral rule keeps the small model's token unchecked or defers to the large model's",
        "ordinary check. Each run's config and command are in evals/configs/ (`spec-cascade-*.toml`): greedy,",
        "the committed runs' width (8 sequences decoded together, the draft model drafting for all 8,",
        "`draft_max_batch = 8`), `draft_max = 8`, `draft_p_min = 0.6`. The sequential cascade is the",
        "committed two-tier run on the same items, at every threshold of its config verifier and of the",
        "free verifier that ranks the small tier's answers best on these items.",
        "",
        "Pricing. At hosted token prices the speculative cascade pays the large tier's price for every",
        "token (the large model reads every position, kept or not): its $ is the large tier's bill for an",
        "answer of that length, the draft model's own work not added (that only flatters it). The sequential",
        "cascade pays as the committed report prices it: the small tier's busy time at $0.10/hour and, when",
        "it escalates, the large tier's tokens. On hourly-priced local hardware both pay busy seconds",
        "(engine time, the draft model's included), the second axis. Latency is each request's wall time",
        "in the eval's batches. Busy and wall seconds were measured on a shared 2-core machine, the",
        "speculative runs at other times (and loads) than the committed ones, so each is also given as a",
        "multiple of the large tier alone measured in the same session (x large): the committed large",
        "run for the committed policies, the large tier rerun beside the speculative runs (`off`, plain",
        "decoding, same items) for those. The figures plot those multiples; dominance below is judged",
        "on them and on $.",
        "",
    ]
    for r in reports:
        out += [
            f"## {r.suite} ({r.n} items)",
            "",
            f"![{r.suite}]({figures[r.suite]})",
            "",
            "| policy | items | accuracy | $ / 1k requests | busy s / request (x large) "
            "| latency s / request (x large) | kept unchecked |",
            "|---|---|---|---|---|---|---|",
            _row(r.small),
            _row(r.large),
        ]
        if r.off is not None:
            out.append(_row(r.off))
        out += [_row(p) for p in r.specs]
        out += ["", f"The sequential cascade, by threshold (best free verifier: `{r.best_free[0]}`, "]
        out[-1] += f"AUROC {r.best_free[1]:.3f} on these items):"
        out += [
            "",
            "| verifier | threshold | escalated | accuracy | $ / 1k requests | busy s / request (x large) "
            "| latency s / request (x large) |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, curve in r.curves.items():
            for p in _thin(curve):
                t = "all" if p.param is not None and p.param > 1.0 else f"{p.param:.3f}"
                out.append(
                    f"| {name} | {t} | {100 * (p.escalated or 0.0):.0f}% | {100 * p.accuracy:.1f}% | "
                    f"{p.cost_per_1k:.3f} | {p.busy_s:.2f} ({p.busy_x:.2f}x) | {p.latency_s:.1f} ({p.latency_x:.2f}x) |"
                )
        out += ["", "Verdict, point by point:", "", *_verdict(r), ""]
    return "\n".join(out)


def _thin(curve: Sequence[Point], rows: int = 12) -> list[Point]:
    """About `rows` settings spread over the escalation range, the two ends kept."""
    if len(curve) <= rows:
        return list(curve)
    step = (len(curve) - 1) / (rows - 1)
    return [curve[round(i * step)] for i in range(rows)]


def plot(r: SuiteReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(AXES), figsize=(15, 4.5))
    for ax, (attr, name) in zip(axes, AXES, strict=True):
        for (verifier, curve), color in zip(r.curves.items(), ("tab:blue", "tab:green"), strict=False):
            pts = sorted(curve, key=lambda p: getattr(p, attr))
            ax.plot(
                [getattr(p, attr) for p in pts],
                [100 * p.accuracy for p in pts],
                "-",
                color=color,
                alpha=0.8,
                label=f"sequential cascade [{verifier}]",
            )
        for p, marker in ((r.small, "s"), (r.large, "D")):
            ax.scatter(getattr(p, attr), 100 * p.accuracy, marker=marker, color="black", zorder=3)
            ax.annotate(p.label, (getattr(p, attr), 100 * p.accuracy), textcoords="offset points", xytext=(5, 5))
        if r.off is not None:
            ax.scatter(getattr(r.off, attr), 100 * r.off.accuracy, marker="D", color="grey", zorder=3)
            ax.annotate(
                "large, rerun now",
                (getattr(r.off, attr), 100 * r.off.accuracy),
                xytext=(5, -12),
                textcoords="offset points",
            )
        for i, p in enumerate(r.specs):  # labels stacked: points of equal accuracy sit close together
            ax.scatter(getattr(p, attr), 100 * p.accuracy, marker="o", color="tab:red", zorder=4)
            ax.annotate(
                p.label.replace("speculative cascade ", "spec "),
                (getattr(p, attr), 100 * p.accuracy),
                textcoords="offset points",
                xytext=(5, 6 + 11 * i),
                color="tab:red",
                fontsize=8,
            )
        ax.margins(x=0.08, y=0.2)
        ax.set_xlabel(name)
        ax.set_ylabel("accuracy %")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower left", fontsize=8)
    fig.suptitle(f"{r.suite}: speculative cascade (red) against the sequential cascade ({r.n} items)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=Path("evals/results"))
    parser.add_argument("--out", type=Path, default=Path("docs/eval"))
    parser.add_argument("--no-figures", action="store_true", help="write the report only")
    args = parser.parse_args(argv)
    reports = [r for suite in SUITES if (r := build(args.results, suite)) is not None]
    if not reports:
        parser.error(f"no <suite>-speccascade-* runs in {args.results}")
    figures = {r.suite: f"spec-cascade-{r.suite}.png" for r in reports}
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_figures:
        for r in reports:
            plot(r, args.out / figures[r.suite])
    (args.out / "spec-cascade.md").write_text(render(reports, figures))
    print(f"wrote {args.out / 'spec-cascade.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
