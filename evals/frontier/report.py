"""The frontier report as numbers, one suite at a time: import the published tiers, join them with
the local small tier, calibrate every cascade and verifier for every share of the frontier's
accuracy at its list price, and evaluate the policy chosen for each share at every named price
point. `page` only formats what this decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals import measures
from evals.calibrate import Calibration
from evals.frontier.cascade import (
    AGREES,
    Row,
    calibrations,
    held_out_row,
    join,
    local_table,
    mixtral_agreement,
    priced,
)
from evals.frontier.published import GPT4, MIXTRAL, TOP_PRICE_POINTS, load
from evals.frontier.tiers import write_run
from evals.grading import CHOICE_LETTERS
from evals.store import RunStore
from evals.suites.base import Suite
from evals.sweep import ResultTable

LIST_PRICE = "gpt-4-1106-preview"  # the price point that is the frontier tier's own


@dataclass(frozen=True)
class TierLine:
    name: str
    model: str
    price_text: str
    accuracy: float
    cost_per_1k: float
    prompt_tokens: float
    completion_tokens: float


@dataclass
class SuiteFrontier:
    suite: str
    local_runs: list[str]
    n_local: int  # items with small-tier results
    n_joined: int  # of them, items the frontier tiers answered
    left_out: list[str]  # verifiers left out: another tier did their work
    published: dict[str, Any]  # the imported run's manifest block: source, matches, grading, prices
    tiers: list[TierLine]
    cascades: list[str]  # cascade names, in the order the page shows them
    rows: list[Row] = field(default_factory=list)
    no_three_tier: str | None = None  # why there is no cascade via Mixtral
    chance: float | None = None  # a guess's accuracy, where the suite's answers are options


def cascade_name(tiers: Sequence[str]) -> str:
    return " → ".join(["small", *tiers])


def build(
    suite: Suite,
    local_stores: Sequence[RunStore],
    runs_dir: Path,
    *,
    data_dir: Path,
    seed: int = 0,
    fraction: float = 0.5,
) -> SuiteFrontier:
    published = load(suite.name, data_dir)
    frontier_store = RunStore(write_run(published, suite, runs_dir))
    local, left_out = local_table(local_stores)
    rows: list[Row] = []
    no_three = None
    has_texts = all(p.answers[MIXTRAL].text is not None for p in published.items)
    if not has_texts:
        no_three = (
            f"RouteLLM published only the correctness of Mixtral's {suite.name} answers, not the answers: "
            "nothing a caller has could judge them, so there is no cascade via Mixtral"
        )

    def tables_at(point: str) -> dict[str, ResultTable]:
        frontier = priced(frontier_store, point)
        out = {cascade_name([GPT4]): join(local, frontier, [GPT4])}
        if has_texts:
            out[cascade_name([MIXTRAL, GPT4])] = join(
                local, frontier, [MIXTRAL, GPT4], mixtral_agreement(local, frontier)
            )
        return out

    # thresholds are chosen once, at the frontier's own list price; every price point reprices that cascade
    chosen = {name: calibrations(t, seed=seed, fraction=fraction) for name, t in tables_at(LIST_PRICE).items()}
    for point in TOP_PRICE_POINTS:
        for name, table in tables_at(point).items():
            for share, cal in chosen[name]:
                if point != LIST_PRICE and cal is not _best_cal(chosen[name], share):
                    continue
                rows.append(
                    held_out_row(
                        table,
                        cal,
                        share,
                        suite=suite.name,
                        cascade=name,
                        price_point=point,
                        seed=seed,
                        fraction=fraction,
                    )
                )
    listed = join(local, priced(frontier_store, LIST_PRICE), [MIXTRAL, GPT4], {it.id: None for it in local.items})
    return SuiteFrontier(
        suite=suite.name,
        local_runs=[s.name for s in local_stores],
        n_local=len(local.items),
        n_joined=len(listed.items),
        left_out=left_out,
        published=frontier_store.manifest()["published"],
        tiers=_tier_lines(listed),
        cascades=list(chosen),
        rows=rows,
        no_three_tier=no_three,
        chance=1 / len(CHOICE_LETTERS) if suite.task == "choice" else None,
    )


def _tier_lines(table: ResultTable) -> list[TierLine]:
    lines = []
    for i, t in enumerate(table.tiers):
        outs = [it.tiers[i] for it in table.items]
        n = len(outs)
        lines.append(
            TierLine(
                name=t.name,
                model=t.model,
                price_text=t.price_text,
                accuracy=sum(o.correct for o in outs) / n,
                cost_per_1k=measures.cost_per_1k([o.cost_usd for o in outs]),
                prompt_tokens=sum(o.prompt_tokens for o in outs) / n,
                completion_tokens=sum(o.completion_tokens for o in outs) / n,
            )
        )
    return lines


def _best_cal(cals: Sequence[tuple[float, Calibration]], share: float) -> Calibration | None:
    """The policy a user would deploy: among those that met the target on the calibration half, the
    cheapest there (never chosen by its held-out figures, which would flatter it)."""
    pool = [c for s, c in cals if s == share and c.met]
    if not pool:
        return None
    return min(pool, key=lambda c: (c.calibration.cost_per_1k, c.verifier))


def best(rows: Sequence[Row], cascade: str, share: float, point: str = LIST_PRICE) -> Row | None:
    """The row of the policy `_best_cal` chooses for this cascade and share, at `point`."""
    pool = [r for r in rows if r.cascade == cascade and r.share == share and r.price_point == LIST_PRICE]
    chosen = _best_cal([(r.share, r.calibration) for r in pool], share)
    if chosen is None:
        return None
    return next(r for r in rows if r.cascade == cascade and r.price_point == point and r.calibration is chosen)


__all__ = ["AGREES", "SuiteFrontier", "TierLine", "best", "build", "cascade_name"]
