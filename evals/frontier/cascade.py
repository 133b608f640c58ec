"""The local small tier in front of frontier tiers: one result table per cascade, calibrated on one
half for a share of the frontier tier's accuracy and reported on the other half, with bootstrap
intervals, at the frontier's list prices and at the prices of other named models.

Why the tables are joined here rather than run: the small tier's answers, scores and costs are
this project's stored runs; the frontier tiers' are published answers imported as runs
(`evals.frontier.tiers`). Both are keyed by the suite's item ids, so a cascade over them is the
same `ResultTable` every other report reads, and the thresholds, the decision rule and the
held-out evaluation are `evals.calibrate`'s and `evals.sweep`'s own, not a copy.

What decides at each tier:
- the small tier: each of its stored verifiers, one policy per verifier (a verifier whose stored
  work was done by another local tier, `cross_tier`, is left out: it reads the answer with the
  next tier's model, and a hosted frontier API gives no log-probabilities of a given text);
- Mixtral, in the three-tier cascade: whether its final number agrees with the small tier's (the
  maths agreement rule of shadow escalation, `evals.agreement_rules.number_rule`), the only signal
  its published text gives. MMLU published no Mixtral answers, only their correctness, so nothing
  can judge them and MMLU has no three-tier cascade.

Targets: `min-accuracy` at `share` times the top tier's accuracy on the calibration half (95% and
99%). The interval of each held-out figure is a percentile bootstrap over held-out items at the
chosen thresholds (the calibration's own variance is not in it).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from evals.calibrate import Calibration, Target, calibrate, split
from evals.frontier.published import GPT4, MIXTRAL, TOP_PRICE_POINTS
from evals.splits import Interval, bootstrap
from evals.store import RunStore
from evals.sweep import (
    CascadePolicy,
    ItemOutcome,
    PolicyResult,
    ResultTable,
    SingleTier,
    accuracy_of,
    evaluate,
    load_table,
    random_escalation,
    route_cost,
)
from router.config import PriceSettings
from router.errors import ConfigError
from router.generation import GenerationRequest, Message
from router.policy import describe

SHARES = (0.95, 0.99)
AGREES = "agrees with small"  # how the Mixtral tier decides, as the page names it


def local_table(
    stores: Sequence[RunStore], tier: str = "small", *, price: PriceSettings | None = None, scale: float = 1.0
) -> tuple[ResultTable, list[str]]:
    """One tier's stored results over several runs of the same suite (the first run that holds an
    item gives it), with the verifiers every item was scored with; and the verifiers left out
    because another tier did their work.

    Pricing: a local tier is charged for its measured busy time, and busy time measured on a
    loaded machine (or inside a batch) can be many times a quiet run's. So every item is charged
    per token at the rate the first run measured (its priced cost over its tokens): the same
    hourly price at that run's throughput, whichever run the item came from. `price` replaces the
    runs' price sheet for the tier (the large local tier priced as local busy time, not as the
    hosted model it stands for in its runs); `scale` multiplies the rate (0: the local work free,
    how the price sensitivity separates it)."""
    tables = [load_table(s, tiers=[tier], prices=None if price is None else {tier: price}) for s in stores]
    suites = {t.suite for t in tables}
    if len(suites) != 1:
        raise ConfigError(f"local runs of different suites: {', '.join(sorted(suites))}")
    other: set[str] = set()
    for s in stores:
        other |= {r.verifier for r in s.scores.records.values() if r.tier == tier and r.cost_tier not in (None, tier)}
    first = tables[0]
    spent = math.fsum(it.tiers[0].cost_usd for it in first.items)
    tokens = sum(it.tiers[0].prompt_tokens + it.tiers[0].completion_tokens for it in first.items)
    rate = scale * spent / tokens if tokens else 0.0
    items: dict[str, ItemOutcome] = {}
    for t in tables:
        for it in t.items:
            o = it.tiers[0]
            items.setdefault(
                it.id, replace(it, tiers=(replace(o, cost_usd=rate * (o.prompt_tokens + o.completion_tokens)),))
            )
    info = first.tiers[0]
    price = PriceSettings(
        usd_per_1m_input_tokens=rate * 1e6,
        usd_per_1m_output_tokens=rate * 1e6,
        stands_for=f"{info.price_text}, per token at the throughput measured on run {first.run}",
    )
    common = [v for v in first.verifiers if all(v in t.verifiers for t in tables) and v not in other]
    merged = replace(
        first,
        run="+".join(t.run for t in tables),
        tiers=[replace(info, price=price, price_text=describe(price))],
        items=list(items.values()),
        verifiers=common,
    )
    return merged, sorted(other & set(first.verifiers))


def mixtral_agreement(local: ResultTable, frontier: ResultTable) -> dict[str, float | None]:
    """Per item: 1.0 when Mixtral's final number agrees with the small tier's, 0.0 when it does
    not, None when either states none (the cascade escalates then)."""
    from evals.agreement_rules import number_rule

    mix = [t.name for t in frontier.tiers].index(MIXTRAL)
    texts = {it.id: it.tiers[mix].text for it in frontier.items}
    request = GenerationRequest(messages=(Message("user", ""),))

    async def agree() -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for it in local.items:
            if it.id in texts:
                a = await number_rule(request, it.tiers[0].text, texts[it.id])
                out[it.id] = None if a is None else float(a.agree)
        return out

    return asyncio.run(agree())


def join(
    local: ResultTable,
    frontier: ResultTable,
    tiers: Sequence[str],
    deciding: Mapping[str, float | None] | None = None,
) -> ResultTable:
    """The cascade small -> `tiers` over the items both tables hold. Every frontier tier but the
    last decides with `deciding` (per item), under every verifier's label."""
    index = {t.name: i for i, t in enumerate(frontier.tiers)}
    upper = {it.id: it for it in frontier.items}
    items = []
    for it in local.items:
        up = upper.get(it.id)
        if up is None:
            continue
        outs = [it.tiers[0]]
        for k, name in enumerate(tiers):
            o = up.tiers[index[name]]
            if k < len(tiers) - 1:
                if deciding is None:
                    raise ValueError("a middle tier needs a deciding score")
                s = deciding[it.id]
                o = replace(o, scores={v: s for v in local.verifiers}, verify_cost_usd={}, verify_s={})
            outs.append(o)
        items.append(ItemOutcome(it.id, it.group, tuple(outs)))
    return replace(
        local,
        run=f"{local.run} -> {' -> '.join(tiers)}",
        tiers=[local.tiers[0], *(frontier.tiers[index[n]] for n in tiers)],
        items=items,
        incomplete=[],
    )


@dataclass(frozen=True)
class Row:
    """One cascade, one verifier, one target, one price sheet: held-out figures."""

    suite: str
    cascade: str
    verifier: str
    share: float
    price_point: str
    top_price: str
    calibration: Calibration  # thresholds chosen at the frontier's list price
    result: PolicyResult  # the cascade on the held-out items, at this price point
    top: PolicyResult  # the top tier alone on the same items, at this price point
    accuracy_ratio: float  # the cascade's held-out accuracy over the top tier's
    ratio_ci: Interval
    saved: float  # 1 - cascade cost / top tier's cost, held-out
    saved_ci: Interval
    random_saved: float | None  # what escalating at random, as accurate on these items, saves
    price_ratio: float  # mean top-tier cost of one request over the small tier's (all items)


def target_for(table: ResultTable, share: float, seed: int, fraction: float) -> Target:
    calib, _ = split(table, seed, fraction)
    return Target("min-accuracy", share * accuracy_of(calib, table.top))


def calibrations(
    table: ResultTable, *, seed: int = 0, fraction: float = 0.5, shares: Sequence[float] = SHARES
) -> list[tuple[float, Calibration]]:
    """Every verifier of `table` calibrated for every share, as (share, calibration)."""
    out = []
    for share in shares:
        target = target_for(table, share, seed, fraction)
        out += [(share, calibrate(table, v, target, seed=seed, fraction=fraction)) for v in table.verifiers]
    return out


def held_out_row(
    table: ResultTable,
    cal: Calibration,
    share: float,
    *,
    suite: str,
    cascade: str,
    price_point: str,
    seed: int = 0,
    fraction: float = 0.5,
) -> Row:
    """The calibrated cascade on `table`'s held-out items (the table priced at `price_point`),
    with bootstrap intervals and the random baseline."""
    _, held = split(table, seed, fraction)
    top = table.top
    policy = CascadePolicy(cal.verifier, tuple(cal.thresholds.values()))
    per_item = [route_cost(it, policy.route(it)) for it in held.items]
    cost = np.array([c for c, _, _ in per_item])
    right = np.array([ok for _, _, ok in per_item], dtype=float)
    top_cost = np.array([it.tiers[top].cost_usd for it in held.items])
    top_right = np.array([it.tiers[top].correct for it in held.items], dtype=float)
    ratio, ratio_ci, saved, saved_ci = bootstrap(cost, right, top_cost, top_right, seed)
    result = evaluate(policy, held, cal.thresholds[table.tiers[0].name])
    small_mean = float(np.mean([it.tiers[0].cost_usd for it in table.items]))
    top_mean = float(np.mean([it.tiers[top].cost_usd for it in table.items]))
    return Row(
        suite=suite,
        cascade=cascade,
        verifier=cal.verifier,
        share=share,
        price_point=price_point,
        top_price=describe(table.tiers[top].price),
        calibration=cal,
        result=result,
        top=evaluate(SingleTier(top, table.tiers[top].name), held),
        accuracy_ratio=ratio,
        ratio_ci=ratio_ci,
        saved=saved,
        saved_ci=saved_ci,
        random_saved=random_at(held, result.accuracy),
        price_ratio=top_mean / small_mean if small_mean > 0 else float("inf"),
    )


def random_at(table: ResultTable, accuracy: float) -> float | None:
    """What the random-escalation baseline (`evals.sweep.random_escalation`) saves on `table` at
    the escalation probability that makes it `accuracy` accurate (found by bisection: its accuracy
    rises with the probability while each tier is more accurate than the one below); None when no
    probability reaches it."""
    lo, hi = 0.0, 1.0
    if not random_escalation(table, lo).accuracy <= accuracy <= random_escalation(table, hi).accuracy:
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        if random_escalation(table, mid).accuracy < accuracy:
            lo = mid
        else:
            hi = mid
    return random_escalation(table, hi).savings


def priced(frontier_store: RunStore, point: str) -> ResultTable:
    """The frontier run with its top tier charged at the named price point."""
    price: PriceSettings = TOP_PRICE_POINTS[point].settings(point)
    return load_table(frontier_store, prices={GPT4: price})
