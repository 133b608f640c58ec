"""The frontier report as numbers, one suite at a time: import the published tiers, join them with
the local tiers, and calibrate every cascade for every share of the frontier's accuracy, on the
fixed split and over many random splits.

For every cascade and share:

- on the fixed split (seed 0): every verifier calibrated at the frontier's list price and held
  out with bootstrap intervals, and the policy chosen for each share at every named price point;
- over `evals.splits.SPLITS` random splits (the headline): the policy and its thresholds chosen
  afresh on each calibration half by the same rule, what it did held out, the same with a 4x finer
  threshold grid, and what it saves as the local machine's price per busy hour moves.

The cascades: small -> GPT-4; small -> Mixtral -> GPT-4 (Mixtral accepted where its final number
agrees with the small tier's); and, where Mixtral's answers were published (GSM8K), the anchors'
own setup, Mixtral -> GPT-4 verified after generation (`evals.frontier.verified`). `page` only
formats what this decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from evals import measures, splits
from evals.calibrate import MAX_POINTS, Calibration, Target, in_calibration
from evals.frontier import verified
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
from evals.frontier.scoring import load_scores
from evals.frontier.tiers import write_run
from evals.grading import CHOICE_LETTERS
from evals.store import RunStore
from evals.suites.base import Suite
from evals.sweep import OraclePolicy, ResultTable, evaluate
from router.config import PriceSettings
from router.errors import ConfigError
from router.policy import describe

LIST_PRICE = "gpt-4-1106-preview"  # the price point that is the frontier tier's own
VERIFIED = f"{MIXTRAL} → {GPT4}, verified"  # the anchors' setup, as the page names it
FINER = 4  # the grid check: this many times as many candidate thresholds per tier
# what RouteLLM reports saving against GPT-4 alone at 95% of its quality (LMSYS, RouteLLM, 2024), with Mixtral-8x7B
# as the weak model; it routes before generation and counts calls to GPT-4
ROUTELLM_SAVED = {"gsm8k": 0.35, "mmlu": 0.45}


@dataclass(frozen=True)
class TierLine:
    name: str
    model: str
    price_text: str
    accuracy: float
    cost_per_1k: float
    prompt_tokens: float
    completion_tokens: float


@dataclass(frozen=True)
class Headline:
    """One cascade and share over the splits: the policy each split's calibration half chose and
    what it did on the held-out half, beside the fixed split's."""

    suite: str
    cascade: str
    share: float
    tiers: list[str]
    deployed: splits.SplitOutcomes
    per_verifier: list[splits.SplitOutcomes]
    finer: splits.SplitOutcomes  # the same with FINER times the candidate thresholds per tier
    fixed: Row | None  # the fixed split's chosen policy, held out, with its bootstrap interval
    prices: str  # the price assumption, as the summary states it
    break_even: float | None  # the multiple of today's local price where the median saving is 0


@dataclass(frozen=True)
class SignalLine:
    """One signal on the weak tier's answers, all items: how much of it there is and what it says."""

    label: str
    scored: int  # items it did not abstain on
    auroc: float | None
    top_share: float  # items it scores 1: the answers it vouches for outright
    top_accuracy: float | None  # Mixtral's accuracy there
    cost_per_1k: float


@dataclass(frozen=True)
class Anchor:
    """RouteLLM's published saving beside ours and the ceiling a perfect verifier would reach."""

    suite: str
    published: float
    ceiling: float  # Mixtral -> GPT-4 with a perfect verifier (`OraclePolicy`), all items
    mixtral_accuracy: float
    gpt4_accuracy: float
    measured: dict[float, Headline]  # share -> our headline, where Mixtral's answers can be read
    why_not: str = ""  # where they cannot


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
    headlines: list[Headline] = field(default_factory=list)
    n_splits: int = 0
    local_price: str = ""  # the local machine's price, as the pages state it
    measured_multipliers: list[tuple[str, float]] = field(default_factory=list)  # (run, its own rate / today's)
    signals: list[SignalLine] = field(default_factory=list)
    signal_notes: list[str] = field(default_factory=list)
    anchor: Anchor | None = None


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
    weak_scores: Path | None = None,
    n_splits: int = splits.SPLITS,
) -> SuiteFrontier:
    published = load(suite.name, data_dir)
    frontier_store = RunStore(write_run(published, suite, runs_dir))
    local, left_out = local_table(local_stores)
    local_free, _ = local_table(local_stores, scale=0.0)
    hourly = _hourly(local_stores[0])
    rows: list[Row] = []
    no_three = None
    has_texts = all(p.answers[MIXTRAL].text is not None for p in published.items)
    if not has_texts:
        no_three = (
            f"RouteLLM published only the correctness of Mixtral's {suite.name} answers, not the answers: "
            "nothing a caller has could judge them, so there is no cascade via Mixtral"
        )
    listed_frontier = priced(frontier_store, LIST_PRICE)
    agreement = mixtral_agreement(local, listed_frontier) if has_texts else {}
    signals: list[verified.Signal] = []
    notes: list[str] = []
    if has_texts:
        signals, notes = _signals(listed_frontier, local, local_stores, published, suite, weak_scores, hourly)

    fitted: list[np.ndarray] = []  # the learned column on the fixed split: fit once, whatever the prices

    def tables_at(point: str, free: bool = False) -> dict[str, ResultTable]:
        frontier = listed_frontier if point == LIST_PRICE else priced(frontier_store, point)
        small = local_free if free else local
        out = {cascade_name([GPT4]): join(small, frontier, [GPT4])}
        if has_texts:
            out[cascade_name([MIXTRAL, GPT4])] = join(small, frontier, [MIXTRAL, GPT4], agreement)
            table = verified.verified_table(frontier, signals, local_scale=0.0 if free else 1.0)
            if not fitted:
                calibration = np.array([in_calibration(it.id, seed, fraction) for it in table.items])
                fitted.append(verified.learned_scores(table, _bases(signals), calibration))
            out[VERIFIED] = verified.with_learned(table, _bases(signals), fitted[0])
        return out

    listed = tables_at(LIST_PRICE)
    # thresholds are chosen once, at the frontier's own list price; every price point reprices that cascade
    chosen = {name: calibrations(t, seed=seed, fraction=fraction) for name, t in listed.items()}
    for point in TOP_PRICE_POINTS:
        for name, table in (listed if point == LIST_PRICE else tables_at(point)).items():
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
    free = tables_at(LIST_PRICE, free=True)
    headlines = []
    for name, table in listed.items():
        headlines += _headlines(
            suite.name, name, table, free[name], rows, signals, seed=seed, fraction=fraction, n_splits=n_splits
        )
    tier_table = join(local, listed_frontier, [MIXTRAL, GPT4], {it.id: None for it in local.items})
    anchor = _anchor(suite.name, listed_frontier, headlines, has_texts)
    return SuiteFrontier(
        suite=suite.name,
        local_runs=[s.name for s in local_stores],
        n_local=len(local.items),
        n_joined=len(tier_table.items),
        left_out=left_out,
        published=frontier_store.manifest()["published"],
        tiers=_tier_lines(tier_table),
        cascades=list(chosen),
        rows=rows,
        no_three_tier=no_three,
        chance=1 / len(CHOICE_LETTERS) if suite.task == "choice" else None,
        headlines=headlines,
        n_splits=n_splits,
        local_price=f"${hourly:g} per busy hour" if hourly else "",
        measured_multipliers=_measured(local_stores),
        signals=_signal_lines(listed[VERIFIED]) if has_texts else [],
        signal_notes=notes,
        anchor=anchor,
    )


def _hourly(store: RunStore) -> float:
    """The local machine's price per busy hour, as the first local run's small tier was priced."""
    for t in store.manifest()["tiers"]:
        if t["name"] == "small":
            return float(PriceSettings(**t["price"]).usd_per_hour or 0.0)
    return 0.0


def _measured(stores: Sequence[RunStore]) -> list[tuple[str, float]]:
    """Each later run's own measured cost per token of the small tier, over the first run's: the
    multiple of today's price its throughput would have meant (a loaded machine, a batch)."""
    from evals.sweep import load_table

    def rate(store: RunStore) -> float:
        t = load_table(store, tiers=["small"])
        tokens = sum(it.tiers[0].prompt_tokens + it.tiers[0].completion_tokens for it in t.items)
        return sum(it.tiers[0].cost_usd for it in t.items) / tokens if tokens else 0.0

    first = rate(stores[0])
    return [(s.name, rate(s) / first) for s in stores[1:] if first > 0]


def _signals(
    frontier: ResultTable,
    local: ResultTable,
    stores: Sequence[RunStore],
    published: Any,
    suite: Suite,
    weak_scores: Path | None,
    hourly: float,
) -> tuple[list[verified.Signal], list[str]]:
    """What reads Mixtral's answers (`evals.frontier.verified`), with notes on what is missing."""
    mix = [t.name for t in frontier.tiers].index(MIXTRAL)
    ids = {it.id for it in local.items}
    texts = {it.id: it.tiers[mix].text for it in frontier.items if it.id in ids}
    out = verified.reader_signals(texts)
    out.append(verified.agreement_signal(verified.AGREES_SMALL, texts, local))
    notes = []
    with_large = [s for s in stores if any(t["name"] == "large" for t in s.manifest()["tiers"])]
    if with_large:
        price = PriceSettings(usd_per_hour=hourly, stands_for="the local machine, its measured busy time")
        large, _ = local_table(with_large, tier="large", price=price)
        sig = verified.agreement_signal(verified.AGREES_LARGE, texts, large)
        out.append(sig)
        have = sum(v is not None for v in sig.scores.values())
        notes.append(
            f"`{verified.AGREES_LARGE}`: the 1.5B's answers are stored for {len(large.items):,} of the "
            f"{len(texts):,} items ({', '.join(f'`{s.name}`' for s in with_large)}); the column abstains elsewhere "
            f"({have:,} scored: where either answer states a number)."
        )
    if weak_scores is None:
        notes.append(
            f"`{verified.CROSS}` (the 1.5B reading Mixtral's text) is left out: no `--weak-scores` directory given."
        )
    else:
        cached = load_scores(weak_scores, published, suite)
        done = sum(1 for k in texts if k in cached.records)
        if done < len(texts):
            notes.append(
                f"`{verified.CROSS}` is left out until the 1.5B has read every answer: `{weak_scores}` holds "
                f"{done:,} of {len(texts):,} (`tierroute eval frontier-score` resumes it)."
            )
        else:
            out += verified.cross_signals(texts, cached, hourly)
    paired = [sig for sig in out if sig.label not in (verified.CROSS_MIN, verified.CROSS_TOP1)]
    return out + verified.combined(paired), notes


def _bases(signals: Sequence[verified.Signal]) -> list[str]:
    """The signals the learned estimator reads: each single one (not their combinations)."""
    return [s.label for s in signals if not s.label.startswith(("min(", "mean("))]


def _headlines(
    suite: str,
    name: str,
    table: ResultTable,
    free: ResultTable,
    rows: Sequence[Row],
    signals: Sequence[verified.Signal],
    *,
    seed: int,
    fraction: float,
    n_splits: int,
) -> list[Headline]:
    """Both shares of one cascade over the splits (seeds seed + 1 on), with the finer grid."""
    masks = splits.split_masks([it.id for it in table.items], n_splits, fraction, first=seed + 1)
    if not (masks.any(axis=1).all() and (~masks).any(axis=1).all()):
        raise ConfigError(f"{suite}: {len(table.items)} items leave one side of some of {n_splits} random splits empty")
    cascades = splits.priced_cascades(table, free)
    if name == VERIFIED:  # refit on every split's calibration half, never the fixed split's fit
        learned = next(c for c in cascades if c.verifier == verified.LEARNED)
        scores = verified.learned_split_scores(table, _bases(signals), masks)
        cascades = [c for c in cascades if c.verifier != verified.LEARNED]
        cascades.append(replace(learned, split_scores=scores))
    targets = [_share_target(s) for s in (0.95, 0.99)]
    coarse = splits.study(cascades, masks, targets, splits.cheapest_met)
    fine = splits.study(cascades, masks, targets, splits.cheapest_met, max_points=FINER * MAX_POINTS)
    prices = "; ".join(_short_price(t.name, t.price, t.local) for t in table.tiers)
    out = []
    for share, (each, deployed), (_, finer) in zip((0.95, 0.99), coarse, fine, strict=True):
        out.append(
            Headline(
                suite=suite,
                cascade=name,
                share=share,
                tiers=[t.name for t in table.tiers],
                deployed=deployed,
                per_verifier=each,
                finer=finer,
                fixed=best(rows, name, share),
                prices=prices,
                break_even=deployed.break_even(),
            )
        )
    return out


def _share_target(share: float) -> splits.TargetRule:
    def rule(first: float, top: float) -> Target:
        return Target("min-accuracy", share * top)

    return rule


def _short_price(name: str, price: PriceSettings, local: bool) -> str:
    if price.usd_per_hour is not None or local:
        return f"{name} local"
    return f"{name} ${price.usd_per_1m_input_tokens:g} / ${price.usd_per_1m_output_tokens:g} per 1M"


def _anchor(suite: str, frontier: ResultTable, headlines: Sequence[Headline], has_texts: bool) -> Anchor | None:
    if suite not in ROUTELLM_SAVED:
        return None
    index = {t.name: i for i, t in enumerate(frontier.tiers)}
    pair = replace(frontier, tiers=[frontier.tiers[index[MIXTRAL]], frontier.tiers[index[GPT4]]])
    pair = replace(
        pair,
        items=[replace(it, tiers=(it.tiers[index[MIXTRAL]], it.tiers[index[GPT4]])) for it in frontier.items],
    )
    oracle = evaluate(OraclePolicy(), pair)
    measured = {h.share: h for h in headlines if h.cascade == VERIFIED}
    return Anchor(
        suite=suite,
        published=ROUTELLM_SAVED[suite],
        ceiling=float(oracle.savings or 0.0),
        mixtral_accuracy=sum(it.tiers[0].correct for it in pair.items) / len(pair.items),
        gpt4_accuracy=sum(it.tiers[1].correct for it in pair.items) / len(pair.items),
        measured=measured,
        why_not=""
        if has_texts
        else (
            "RouteLLM published only whether each Mixtral answer was right, not the answer: no verifier can read "
            "it, so nothing here can be verified; only the ceiling (a perfect verifier, which would need the "
            "answers) and the published correctness can be stated"
        ),
    )


def _signal_lines(table: ResultTable) -> list[SignalLine]:
    lines = []
    y = np.array([it.tiers[0].correct for it in table.items])
    for label in table.verifiers:
        if label.startswith(("min(", "mean(")) or label == verified.LEARNED:
            continue
        s = np.array([np.nan if (v := it.tiers[0].scores[label]) is None else v for it in table.items])
        ok = ~np.isnan(s)
        top = ok & (s >= 1.0 - 1e-12)
        lines.append(
            SignalLine(
                label=label,
                scored=int(ok.sum()),
                auroc=measures.auroc(y[ok], s[ok]) if ok.any() else None,
                top_share=float(top.mean()),
                top_accuracy=float(y[top].mean()) if top.any() else None,
                cost_per_1k=measures.cost_per_1k([it.tiers[0].verify_cost_usd[label] for it in table.items]),
            )
        )
    return lines


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
    cheapest there (never chosen by its held-out figures, which would flatter it). The same rule as
    `evals.splits.cheapest_met` over the splits."""
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


def headline_of(rep: SuiteFrontier, cascade: str, share: float) -> Headline | None:
    return next((h for h in rep.headlines if h.cascade == cascade and h.share == share), None)


__all__ = [
    "AGREES",
    "VERIFIED",
    "Anchor",
    "Headline",
    "SignalLine",
    "SuiteFrontier",
    "TierLine",
    "best",
    "build",
    "cascade_name",
    "describe",
    "headline_of",
]
