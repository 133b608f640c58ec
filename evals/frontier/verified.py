"""The anchors' own setup: the weak frontier tier (Mixtral-8x7B) in front of the strong one
(GPT-4-1106) on GSM8K, its published answers verified after generation by what this project can
read from a given text.

RouteLLM routes before generation (a router reads the prompt and picks Mixtral or GPT-4) and
reports 35% saved on GSM8K at 95% of GPT-4's quality. A cascade can do what a router cannot: read
Mixtral's answer before deciding. What reads a given text here, each a score column of Mixtral's
tier in one `ResultTable` (two tiers: Mixtral, GPT-4), priced with what it costs:

- `steps`, the arithmetic of its worked steps re-checked (`verifiers.steps`), and `math_answer`
  (it states a numeric final answer): microseconds, free;
- agreement of its final number with a local tier's (the maths rule of shadow escalation,
  `evals.agreement_rules.number_rule`): `agrees with small` (the 0.5B on all 1,319 items) and
  `agrees with large` (the 1.5B wherever its answer is stored: 200 items in the committed run,
  all of them once `evals/results-gsm8k-full` holds its tier); the local tier's generation is paid
  for, at the local machine's hourly price per the throughput its first run measured; where it has
  no answer the column abstains (the cascade escalates);
- `cross_tier` (the 1.5B's prefill reading of Mixtral's text, from `tierroute eval frontier-score`:
  `evals.frontier.scoring`), where cached: its mean, min and top-1 share, priced as the scoring
  tier's busy seconds at the local hourly price; abstains where not computed;
- combinations of two of them, `min(a, b)` and `mean(a, b)` by the live cascade's own rule
  (`router.policy.combine`), paying for both;
- `learned`: the learned estimator (`evals.fitting.fit_model`, the project's logistic regression
  chosen by cross-validation) over all of them, fit on each calibration half alone: its
  calibration items get the out-of-fold scores of that fit, its held-out items the final model's.

Which of these decides is chosen on each calibration half (`evals.frontier.report`), never by
held-out figures. MMLU published only the correctness of Mixtral's answers: nothing can read them,
so the report gives MMLU's ceiling (a perfect verifier) and says what cannot be verified.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np

from evals.frontier.published import GPT4, MIXTRAL
from evals.frontier.scoring import PublishedScores
from evals.sweep import ItemOutcome, ResultTable, TierOutcome
from router import policy
from router.generation import Generation, GenerationRequest, Message

STEPS = "steps"
MATH = "math_answer"
AGREES_SMALL = "agrees with small"
AGREES_LARGE = "agrees with large"
CROSS = 'cross_tier[tier="large"]'
CROSS_MIN = "cross_tier_min"
CROSS_TOP1 = "cross_tier_top1"
LEARNED = "learned"
READERS = (STEPS, MATH)  # the verifiers that read the text alone
CROSS_STATS = {CROSS: "mean", CROSS_MIN: "min", CROSS_TOP1: "top1_share"}


@dataclass(frozen=True)
class Signal:
    """One score column of the weak tier: per item its score (None: abstained) and what computing
    it cost (USD; the local part of it, for the price sensitivity)."""

    label: str
    scores: Mapping[str, float | None]
    cost: Mapping[str, float]
    local: bool  # its cost is local busy time


def reader_signals(texts: Mapping[str, str]) -> list[Signal]:
    """`steps` and `math_answer` on each answer, made by the verifier registry as the service
    makes them. They read only the answer (the request is not theirs to read)."""
    from router.plugins import VerifierRegistry
    from verifiers.base import VerifierContext

    registry = VerifierRegistry.from_entry_points()
    made = {label: registry.create(label, {}, VerifierContext(tier=MIXTRAL)) for label in READERS}
    request = GenerationRequest(messages=(Message("user", ""),))

    async def run() -> dict[str, dict[str, float | None]]:
        out: dict[str, dict[str, float | None]] = {label: {} for label in made}
        for item, text in texts.items():
            candidate = Generation(
                text=text, finish_reason="stop", prompt_tokens=0, completion_tokens=0, token_logprobs=None, latency_s=0
            )
            for label, v in made.items():
                s = await v.score(request, candidate)
                out[label][item] = None if s.value is None else float(s.value)
        return out

    scored = asyncio.run(run())
    return [Signal(label, scored[label], dict.fromkeys(texts, 0.0), False) for label in READERS]


def agreement_signal(label: str, texts: Mapping[str, str], local: ResultTable) -> Signal:
    """1 where the weak tier's final number agrees with the local tier's answer, 0 where it does
    not, None where either states none or the local tier has no answer; costs the local tier's
    generation where it answered."""
    from evals.agreement_rules import number_rule

    request = GenerationRequest(messages=(Message("user", ""),))
    answers = {it.id: it.tiers[0] for it in local.items}

    async def run() -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for item, text in texts.items():
            mine = answers.get(item)
            if mine is None:
                out[item] = None
                continue
            a = await number_rule(request, mine.text, text)
            out[item] = None if a is None else float(a.agree)
        return out

    cost = {item: (answers[item].cost_usd if item in answers else 0.0) for item in texts}
    return Signal(label, asyncio.run(run()), cost, True)


def cross_signals(texts: Mapping[str, str], cached: PublishedScores, usd_per_hour: float) -> list[Signal]:
    """The cached `cross_tier` readings, one column per statistic, priced as the scoring tier's
    busy seconds at `usd_per_hour`; None where an item has no reading."""
    out = []
    for label, stat in CROSS_STATS.items():
        scores: dict[str, float | None] = {}
        cost: dict[str, float] = {}
        for item in texts:
            rec = cached.records.get(item)
            value = None if rec is None or rec.value is None else rec.details.get(stat)
            scores[item] = None if value is None else min(1.0, max(0.0, float(value)))
            cost[item] = 0.0 if rec is None else usd_per_hour * rec.cost_seconds / 3600.0
        out.append(Signal(label, scores, cost, True))
    return out


def combined(signals: Sequence[Signal]) -> list[Signal]:
    """`min(a, b)` and `mean(a, b)` of every pair, by `router.policy.combine` (an abstention is
    ignored; both abstaining abstains), paying for both."""
    out = []
    for a, b in combinations(signals, 2):
        for how in ("min", "mean"):
            scores = {item: policy.combine([(a.scores[item], 1.0), (b.scores[item], 1.0)], how) for item in a.scores}
            cost = {item: a.cost[item] + b.cost[item] for item in a.scores}
            out.append(Signal(f"{how}({a.label}, {b.label})", scores, cost, a.local or b.local))
    return out


def verified_table(frontier: ResultTable, signals: Sequence[Signal], *, local_scale: float = 1.0) -> ResultTable:
    """The cascade weak -> strong over the items every signal covers, each signal a verifier of
    the weak tier; `local_scale` multiplies the cost of the signals whose work is local (0: free,
    how the price sensitivity separates it)."""
    index = {t.name: i for i, t in enumerate(frontier.tiers)}
    weak, strong = index[MIXTRAL], index[GPT4]
    labels = [s.label for s in signals]
    items = []
    for it in frontier.items:
        if not all(it.id in s.scores for s in signals):
            continue
        w = it.tiers[weak]
        scores = {s.label: s.scores[it.id] for s in signals}
        cost = {s.label: s.cost[it.id] * (local_scale if s.local else 1.0) for s in signals}
        outs = (
            replace(w, scores=scores, verify_cost_usd=cost, verify_s=dict.fromkeys(labels, 0.0)),
            replace(it.tiers[strong], scores={}, verify_cost_usd={}, verify_s={}),
        )
        items.append(ItemOutcome(it.id, it.group, outs))
    return replace(
        frontier,
        run=f"{frontier.run}: {MIXTRAL} -> {GPT4}, verified",
        tiers=[frontier.tiers[weak], frontier.tiers[strong]],
        items=items,
        verifiers=labels,
        incomplete=[],
    )


# ---- the learned estimator, fit on each calibration half ----------------------------------------------


def features(table: ResultTable, labels: Sequence[str]) -> np.ndarray:
    """Items x features of the weak tier's answers: each signal's score (an abstention reads as 0.5,
    `router.learned.features.ABSTAINED`, beside a column saying it abstained) and the answer's and
    the prompt's token counts (log-scaled, as `router.learned.features` scales them)."""
    from router.learned.features import ABSTAINED

    rows = []
    for it in table.items:
        o: TierOutcome = it.tiers[0]
        row = []
        for label in labels:
            v = o.scores[label]
            row += [ABSTAINED if v is None else float(v), 1.0 if v is None else 0.0]
        row += [math.log1p(o.completion_tokens), math.log1p(o.prompt_tokens)]
        rows.append(row)
    return np.array(rows, dtype=float)


def fit_scores(x: np.ndarray, right: np.ndarray, calibration: np.ndarray, seed: int = 0) -> np.ndarray:
    """Per item, the learned estimator's probability of a right answer fit on the `calibration`
    rows alone: out of fold there (`evals.fitting.fit_with_out_of_fold`), the final model's on
    every other row."""
    from threadpoolctl import threadpool_limits

    from evals.fitting import fit_with_out_of_fold

    cal = np.flatnonzero(calibration)
    with threadpool_limits(1):  # a few hundred rows: threads only wait on each other
        model, oof = fit_with_out_of_fold(x[cal], right[cal].astype(int), x.shape[1], seed=seed)
        out = model.probability(x)
    out[cal] = oof
    return np.asarray(out, dtype=float)


def learned_split_scores(table: ResultTable, labels: Sequence[str], masks: np.ndarray) -> np.ndarray:
    """splits x items x 1: the learned estimator's scores on each split (`masks`, splits x items,
    True on the calibration side), refit on each calibration half."""
    x = features(table, labels)
    right = np.array([it.tiers[0].correct for it in table.items])
    return np.stack([fit_scores(x, right, m) for m in masks])[:, :, np.newaxis]


def learned_scores(table: ResultTable, labels: Sequence[str], calibration: np.ndarray) -> np.ndarray:
    """Per item, the learned estimator fit on one split's calibration side (`calibration`, items)."""
    right = np.array([it.tiers[0].correct for it in table.items])
    return fit_scores(features(table, labels), right, calibration)


def with_learned(table: ResultTable, labels: Sequence[str], scores: np.ndarray) -> ResultTable:
    """`table` with the `learned` column (`learned_scores`, per item in the table's order), paying
    for every signal it reads."""
    items = []
    for it, p in zip(table.items, scores, strict=True):
        o = it.tiers[0]
        cost = math.fsum(o.verify_cost_usd[label] for label in labels)
        o = replace(
            o,
            scores={**o.scores, LEARNED: float(p)},
            verify_cost_usd={**o.verify_cost_usd, LEARNED: cost},
            verify_s={**o.verify_s, LEARNED: 0.0},
        )
        items.append(replace(it, tiers=(o, *it.tiers[1:])))
    return replace(table, items=items, verifiers=[*table.verifiers, LEARNED])
