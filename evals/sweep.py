"""Policy simulation: any routing policy, evaluated on stored results without touching a model.

A run stores, for every item, every tier's output, whether it was right, what it cost and every
verifier's score (see `evals.runner`). A policy maps one item's stored outcomes to a `Route`:
which tiers ran, whose verifiers were paid for, and which tier's answer is returned. So the live
cascade at any threshold, the oracle, a single tier, and later learned routers (a trained
verifier, a prompt-only pre-router that skips tiers) are all evaluated by the same function,
`evaluate`, on the same items.

Costs are priced here, from the token counts and measured busy time in the store and the price
sheet recorded with the run (or a new one passed in), so a price change needs no rerun.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from evals import measures
from evals.runner import verifier_fingerprint
from evals.store import RunStore, generation_key, grade_key, score_key
from router import policy
from router.config import PriceSettings
from router.policy import Usage, describe

CONFIG = "config"  # the pseudo-verifier: each tier's configured verifiers, combined as configured


# ---- the table of outcomes --------------------------------------------------------------------------


@dataclass(frozen=True)
class TierOutcome:
    correct: bool
    cost_usd: float  # generating the answer, priced
    latency_s: float
    busy_s: float
    prompt_tokens: int
    completion_tokens: int
    scores: Mapping[str, float | None]  # verifier label -> score in [0, 1], None where it abstained
    verify_cost_usd: Mapping[str, float]
    verify_s: Mapping[str, float]
    text: str = ""  # the answer itself, for estimators trained on stored results


@dataclass(frozen=True)
class ItemOutcome:
    id: str
    group: str
    tiers: tuple[TierOutcome, ...]
    # what each route has cost this item (`route_cost`): a sweep asks the same few routes of an
    # item once per threshold, thousands of times in a report
    routes: dict[tuple[Any, ...], tuple[float, float, bool]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )


@dataclass(frozen=True)
class TierInfo:
    name: str
    model: str
    price: PriceSettings
    price_text: str
    threshold: float
    local: bool


@dataclass
class ResultTable:
    run: str
    suite: str
    source: str
    tiers: list[TierInfo]
    items: list[ItemOutcome]
    verifiers: list[str]  # labels scored on every item at every tier but the last, CONFIG first
    incomplete: list[str] = field(default_factory=list)  # item ids lacking some tier's output or grade
    manifest: dict[str, Any] = field(default_factory=dict)

    def subset(self, ids: Iterable[str]) -> ResultTable:
        keep = set(ids)
        return replace(self, items=[i for i in self.items if i.id in keep])

    @property
    def top(self) -> int:
        return len(self.tiers) - 1

    def with_scores(
        self,
        label: str,
        scores: Mapping[str, Sequence[float | None]],
        *,
        cost: Callable[[TierOutcome], tuple[float, float]] | None = None,
        verifier: bool = True,
    ) -> ResultTable:
        """A copy with one more score column: `scores[item id]` holds one score per tier. How a
        learned estimator (fit on other items) joins the sweep and calibration. `cost(outcome)`
        gives what computing the score costs on that tier's answer ($, seconds; default nothing);
        `verifier=False` keeps the column out of the verifiers (a pre-router reads no answer). A None
        score is an abstention: an estimator with no model for that tier."""

        def scored(t: TierOutcome, v: float | None) -> TierOutcome:
            value = None if v is None else float(v)
            if cost is None or value is None:
                return replace(t, scores={**t.scores, label: value})
            usd, sec = cost(t)
            return replace(
                t,
                scores={**t.scores, label: value},
                verify_cost_usd={**t.verify_cost_usd, label: usd},
                verify_s={**t.verify_s, label: sec},
            )

        items = []
        for it in self.items:
            values = scores[it.id]
            if len(values) != len(it.tiers):
                raise ValueError(f"{label}: item {it.id} needs {len(it.tiers)} scores, got {len(values)}")
            items.append(replace(it, tiers=tuple(scored(t, v) for t, v in zip(it.tiers, values, strict=True))))
        return replace(self, items=items, verifiers=[*self.verifiers, label] if verifier else self.verifiers)


def load_table(
    store: RunStore, *, prices: Mapping[str, PriceSettings] | None = None, tiers: Sequence[str] | None = None
) -> ResultTable:
    """The run's items that have every tier's output and grade, priced by the run's price sheet
    (or by `prices`, per tier name, where given). `tiers` picks and orders a subset."""
    m = store.manifest()
    suite_fp = m["suite"]["fingerprint"]
    snaps = m["tiers"]
    if tiers:
        by_name = {t["name"]: t for t in snaps}
        missing = [t for t in tiers if t not in by_name]
        if missing:
            from router.errors import ConfigError

            raise ConfigError(f"run {store.name} has no tier(s) {', '.join(missing)}; it has {', '.join(by_name)}")
        snaps = [by_name[t] for t in tiers]
    infos = []
    for t in snaps:
        price = (prices or {}).get(t["name"]) or PriceSettings(**t["price"])
        infos.append(
            TierInfo(t["name"], t["model"], price, describe(price), t["threshold"], t["backend"] == "llamacpp")
        )
    by_tier = {t.name: t for t in infos}
    extra = [(v["label"], v["name"], v["params"]) for v in m.get("verifiers", [])]

    items: list[ItemOutcome] = []
    incomplete: list[str] = []
    for entry in m["items"]:
        outcomes = []
        for snap in snaps:
            info = by_tier[snap["name"]]
            gk = generation_key(snap["fingerprint"], entry["prompt_sha"])
            gen = store.generations.records.get(gk)
            grade = store.grades.records.get(grade_key(gk, suite_fp, entry["id"]))
            if gen is None or grade is None:
                break
            specs = [(v["label"], v["name"], v["params"]) for v in snap["verifiers"]] + extra
            scores: dict[str, float | None] = {}
            vcost: dict[str, float] = {}
            vtime: dict[str, float] = {}
            for label, name, params in specs:
                rec = store.scores.records.get(score_key(gk, verifier_fingerprint(name, params)))
                if rec is None:
                    continue
                scores[label] = rec.value
                worker = by_tier.get(rec.cost_tier or info.name, info)
                vcost[label] = policy.verification_cost(
                    [(worker.price, Usage(rec.cost_prompt_tokens, rec.cost_completion_tokens, rec.cost_seconds))]
                )
                vtime[label] = rec.verify_s
            _combine(snap, scores, vcost, vtime)
            outcomes.append(
                TierOutcome(
                    correct=grade.correct,
                    cost_usd=policy.generation_cost(
                        info.price, gen.prompt_tokens, gen.completion_tokens, gen.busy_s, gen.latency_s
                    ),
                    latency_s=gen.latency_s,
                    busy_s=policy.generation_seconds(gen.busy_s, gen.latency_s),
                    prompt_tokens=gen.prompt_tokens,
                    completion_tokens=gen.completion_tokens,
                    scores=scores,
                    verify_cost_usd=vcost,
                    verify_s=vtime,
                    text=gen.text,
                )
            )
        if len(outcomes) == len(snaps):
            items.append(ItemOutcome(entry["id"], entry.get("group", ""), tuple(outcomes)))
        else:
            incomplete.append(entry["id"])
    labels = [CONFIG] + sorted({label for t in snaps for label in t.get("scored_with", [])} | {e[0] for e in extra})
    deciding = range(len(snaps) - 1) if len(snaps) > 1 else range(len(snaps))
    usable = [label for label in labels if items and all(label in it.tiers[t].scores for it in items for t in deciding)]
    return ResultTable(
        run=store.name,
        suite=m["suite"]["name"],
        source=m["suite"].get("source", ""),
        tiers=infos,
        items=items,
        verifiers=usable,
        incomplete=incomplete,
        manifest=m,
    )


def _combine(
    snap: Mapping[str, Any], scores: dict[str, float | None], vcost: dict[str, float], vtime: dict[str, float]
) -> None:
    """Add the CONFIG score: the tier's configured verifiers combined by the live cascade's rule
    (`router.policy.combine`; 1.0, accept, when it has none)."""
    members = snap["verifiers"]
    if not members:
        scores[CONFIG], vcost[CONFIG], vtime[CONFIG] = policy.combine([]), 0.0, 0.0
        return
    if any(v["label"] not in scores for v in members):
        return
    scores[CONFIG] = policy.combine([(scores[v["label"]], v["weight"]) for v in members], snap.get("combine", "mean"))
    vcost[CONFIG] = math.fsum(vcost[v["label"]] for v in members)
    vtime[CONFIG] = max(vtime[v["label"]] for v in members)  # the cascade runs them concurrently


# ---- policies -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    answered: int  # the tier whose answer is returned
    ran: tuple[int, ...]  # the tiers that generated, in order
    verified: tuple[tuple[int, str], ...] = ()  # (tier, verifier label) whose cost was paid


def _last_checks(item: ItemOutcome, last: int) -> tuple[tuple[int, str], ...]:
    """The last tier's answer is accepted whatever its score, but the live cascade still runs the
    tier's configured verifiers on it (their scores are reported), so their cost is paid."""
    return ((last, CONFIG),) if CONFIG in item.tiers[last].scores else ()


class Policy(Protocol):
    """Maps one item's stored outcomes to a route. Implementations must only read what the route
    says ran: a cascade reads the scores of the tiers it tried, a pre-router reads nothing but
    the item, the oracle (a bound, not a router) reads correctness."""

    @property
    def name(self) -> str: ...

    def route(self, item: ItemOutcome) -> Route: ...


@dataclass(frozen=True)
class CascadePolicy:
    """The live cascade: try tiers in order, accept when `verifier`'s score reaches the tier's
    threshold; the last tier always answers."""

    verifier: str
    thresholds: tuple[float, ...]  # one per tier but the last

    @property
    def name(self) -> str:
        return f"cascade[{self.verifier}]"

    def route(self, item: ItemOutcome) -> Route:
        verified: list[tuple[int, str]] = []
        last = len(item.tiers) - 1
        for i, outcome in enumerate(item.tiers):
            # the last tier's score is not this policy's to read: its answer stands (policy.decide)
            score, threshold = (None, 0.0) if i == last else (outcome.scores[self.verifier], self.thresholds[i])
            if i < last:
                verified.append((i, self.verifier))
            if policy.decide(score, threshold, last=i == last) != "escalate":
                checks = _last_checks(item, last) if i == last else ()
                return Route(i, tuple(range(i + 1)), (*verified, *checks))
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class PreRoutePolicy:
    """A prompt-only pre-router in front of each tier but the last: a tier whose pre-router
    probability is below its `skip_below` threshold is skipped before it generates (it costs
    nothing). Without a verifier ("pre-route only") the first tier not skipped answers; with one
    ("pre-route then verify") its answer is verified as the cascade does and escalated when it
    fails. The last tier always answers. Reads the pre-router's score of every tier it skips and
    the verifier's score of every tier that ran."""

    prerouter: str
    skip_below: tuple[float, ...]  # one per tier but the last
    verifier: str | None = None
    thresholds: tuple[float, ...] = ()  # the verifier's, one per tier but the last

    @property
    def name(self) -> str:
        return "pre-route only" if self.verifier is None else f"pre-route then verify[{self.verifier}]"

    def route(self, item: ItemOutcome) -> Route:
        ran: list[int] = []
        verified: list[tuple[int, str]] = []
        last = len(item.tiers) - 1
        for i, outcome in enumerate(item.tiers):
            is_last = i == last
            if not is_last and policy.skipped(outcome.scores[self.prerouter], self.skip_below[i], last=is_last):
                continue
            ran.append(i)
            score, threshold = None, 0.0  # the last tier's answer stands whatever its score (policy.decide)
            if not is_last:
                if self.verifier is None:  # pre-route only: the first tier not skipped answers
                    return Route(i, tuple(ran), tuple(verified))
                verified.append((i, self.verifier))
                score, threshold = outcome.scores[self.verifier], self.thresholds[i]
            if policy.decide(score, threshold, last=is_last) != "escalate":
                checks = _last_checks(item, last) if is_last else ()
                return Route(i, tuple(ran), (*verified, *checks))
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class SingleTier:
    tier: int
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or f"tier {self.tier}"

    def route(self, item: ItemOutcome) -> Route:
        return Route(self.tier, (self.tier,))


@dataclass(frozen=True)
class OraclePolicy:
    """The cheapest tier that is right, else the top tier: what a perfect router would pay."""

    name: str = "oracle"

    def route(self, item: ItemOutcome) -> Route:
        for i, outcome in enumerate(item.tiers):
            if outcome.correct:
                return Route(i, (i,))
        top = len(item.tiers) - 1
        return Route(top, (top,))


# ---- evaluation --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    param: float | None  # the threshold or escalation probability, where there is one
    n: int
    accuracy: float
    cost_per_1k: float
    escalation_rate: float  # answered by a tier other than the first
    top_rate: float  # the top tier generated: "calls to the strong model" in RouteLLM's terms
    answered: tuple[float, ...]  # share answered by each tier
    latency_p50: float | None
    latency_p95: float | None
    savings: float | None  # against always using the top tier

    def as_row(self) -> dict[str, Any]:
        row = {
            k: getattr(self, k)
            for k in (
                "policy",
                "param",
                "n",
                "accuracy",
                "cost_per_1k",
                "escalation_rate",
                "top_rate",
                "latency_p50",
                "latency_p95",
                "savings",
            )
        }
        row["answered"] = "/".join(f"{a:.3f}" for a in self.answered)
        return row


def route_cost(item: ItemOutcome, route: Route) -> tuple[float, float, bool]:
    """(cost in USD, latency in s, correct) of one item along one route."""
    key = (route.answered, route.ran, route.verified)  # a tuple's hash and equality are C's, a dataclass's Python
    known = item.routes.get(key)
    if known is None:
        known = item.routes[key] = _route_cost(item, route)
    return known


def _route_cost(item: ItemOutcome, route: Route) -> tuple[float, float, bool]:
    cost = policy.request_cost(
        [item.tiers[t].cost_usd for t in route.ran]
        + [item.tiers[t].verify_cost_usd.get(label, 0.0) for t, label in route.verified]
    )
    latency = sum(item.tiers[t].latency_s for t in route.ran)
    for t, label in route.verified:
        latency += item.tiers[t].verify_s.get(label, 0.0)
    return cost, latency, item.tiers[route.answered].correct


def top_cost_per_1k(table: ResultTable) -> float:
    return measures.cost_per_1k([it.tiers[table.top].cost_usd for it in table.items])


def evaluate(policy: Policy, table: ResultTable, param: float | None = None) -> PolicyResult:
    n = len(table.items)
    if n == 0:
        raise ValueError(f"run {table.run}: no complete items to evaluate")
    costs, latencies, right = [], [], 0
    answered = [0] * len(table.tiers)
    escalated = top = 0
    highest = table.top
    for item in table.items:
        route = policy.route(item)
        cost, latency, correct = route_cost(item, route)
        costs.append(cost)
        latencies.append(latency)
        right += correct
        answered[route.answered] += 1
        escalated += route.answered != 0
        top += highest in route.ran
    c1k = measures.cost_per_1k(costs)
    return PolicyResult(
        policy=policy.name,
        param=param,
        n=n,
        accuracy=right / n,
        cost_per_1k=c1k,
        escalation_rate=escalated / n,
        top_rate=top / n,
        answered=tuple(a / n for a in answered),
        latency_p50=measures.percentile(latencies, 50),
        latency_p95=measures.percentile(latencies, 95),
        savings=measures.savings(c1k, top_cost_per_1k(table)),
    )


def random_escalation(table: ResultTable, p: float) -> PolicyResult:
    """The random baseline: a cascade whose verifier escalates each answer with probability `p`,
    whatever it says. Expected values, computed exactly: tier k answers with probability
    p^k (1 - p) (the last with p^last), and tier k runs with probability p^k. No verifier is paid."""
    n = len(table.items)
    last = table.top
    reach = [p**k for k in range(last + 1)]
    answer = [reach[k] * (1 - p) if k < last else reach[k] for k in range(last + 1)]
    acc = sum(answer[k] * sum(it.tiers[k].correct for it in table.items) for k in range(last + 1)) / n
    c1k = sum(reach[k] * measures.cost_per_1k([it.tiers[k].cost_usd for it in table.items]) for k in range(last + 1))
    return PolicyResult(
        policy="random",
        param=p,
        n=n,
        accuracy=acc,
        cost_per_1k=c1k,
        escalation_rate=1 - answer[0],
        top_rate=reach[last],
        answered=tuple(answer),
        latency_p50=None,
        latency_p95=None,
        savings=measures.savings(c1k, top_cost_per_1k(table)),
    )


def threshold_grid(table: ResultTable, verifier: str, *, max_points: int = 200) -> list[float]:
    """Thresholds that give every distinct routing on these items: each distinct score (or
    `max_points` quantiles of them), plus 0 (accept everything) and +inf (escalate everything)."""
    scored = (it.tiers[t].scores[verifier] for it in table.items for t in range(max(1, table.top)))
    values = sorted({v for v in scored if v is not None})
    if len(values) > max_points:
        idx = [round(i * (len(values) - 1) / (max_points - 1)) for i in range(max_points)]
        values = [values[i] for i in sorted(set(idx))]
    return sorted({0.0, *values, math.inf})


def sweep(table: ResultTable, verifier: str, thresholds: Sequence[float] | None = None) -> list[PolicyResult]:
    """The cascade with `verifier` at each threshold (shared by every tier but the last)."""
    grid = threshold_grid(table, verifier) if thresholds is None else thresholds
    k = max(1, table.top)
    return evaluate_cascades(table, verifier, [((th,) * k, th) for th in grid])


@dataclass(frozen=True)
class CascadeArrays:
    """A cascade's items as arrays, for evaluating many settings (or many splits) at once: per item
    and answering tier, what the cascade's route to that answer costs, how long it takes and whether
    the answer is right (each priced once by `route_cost`, as `evaluate` prices it), and the scores
    the cascade reads (every tier but the last; NaN where the verifier abstained)."""

    cost: np.ndarray  # items x tiers, USD
    latency: np.ndarray  # items x tiers, s
    right: np.ndarray  # items x tiers, bool
    scores: np.ndarray  # items x (tiers - 1)


def cascade_arrays(table: ResultTable, verifier: str) -> CascadeArrays:
    """`table`'s cascade with `verifier` as arrays (see `CascadeArrays`). A cascade item can only be
    answered by one of its tiers, each along one route, so these arrays hold every outcome any
    setting of the thresholds can give it."""
    n = len(table.items)
    last = table.top
    priced = [[route_cost(it, _cascade_route(it, k, verifier)) for k in range(last + 1)] for it in table.items]
    return CascadeArrays(
        cost=np.array([[c for c, _, _ in row] for row in priced], dtype=float).reshape(n, last + 1),
        latency=np.array([[lat for _, lat, _ in row] for row in priced], dtype=float).reshape(n, last + 1),
        right=np.array([[ok for _, _, ok in row] for row in priced], dtype=bool).reshape(n, last + 1),
        scores=np.array(
            [
                [math.nan if (v := it.tiers[t].scores[verifier]) is None else v for t in range(last)]
                for it in table.items
            ],
            dtype=float,
        ).reshape(n, last),
    )


@dataclass(frozen=True)
class SettingOutcomes:
    """Many settings of one cascade on the same items: per setting, its accuracy, mean cost per 1k
    requests and escalation rate, as `evaluate` computes them for that setting (the cost summed
    exactly, see `weigh_settings`)."""

    accuracy: np.ndarray
    cost_per_1k: np.ndarray
    escalation: np.ndarray


PICO = 1e12  # costs are summed as whole pico-dollars: exact in float64, so no sum depends on its order
_CHUNK = 1 << 21  # settings x items weighed at once, at most


def weigh_settings(arrays: CascadeArrays, settings: np.ndarray, masks: np.ndarray) -> list[SettingOutcomes]:
    """Every setting (a settings x tiers-but-the-last array of thresholds) on each set of items
    `masks` names (sets x items, booleans), through the decision rule's table form
    (`router.policy.answering_tiers`) applied once to all items: how a calibration weighs all its
    candidates, and how the split study (`evals.splits`) weighs them on two hundred calibration
    halves at once, one matrix product per quantity.

    Every sum is exact, so it does not depend on the order of its terms or on which other items
    are summed beside it: counts are integers, and a cost is summed as whole pico-dollars (each
    item's cost rounded to 1e-12 USD, far below any price's precision; the sums stay below 2^53).
    So a setting weighed on a table's calibration half and the same setting weighed on the whole
    table with that half's mask give the same figures to the bit, and choose the same."""
    masks = np.asarray(masks, dtype=bool).reshape(-1, len(arrays.scores))
    counts = masks.sum(axis=1)
    if (counts == 0).any():
        raise ValueError("no items to evaluate the settings on")
    n = len(arrays.scores)
    pico = np.round(arrays.cost * PICO)
    right_flat = np.ascontiguousarray(arrays.right.T).reshape(-1).astype(np.float32)
    pico_flat = np.ascontiguousarray(pico.T).reshape(-1)
    offsets = np.arange(n)
    m32, m64 = masks.T.astype(np.float32), masks.T.astype(np.float64)
    right_sum, pico_sum, escalated = [], [], []
    step = max(1, _CHUNK // max(1, n * max(1, arrays.scores.shape[1])))
    for start in range(0, len(settings), step):
        answered = policy.answering_tiers(arrays.scores, settings[start : start + step])
        flat = answered * n + offsets
        right_sum.append(right_flat[flat] @ m32)  # 0/1 counts below 2^24: exact in float32
        pico_sum.append(pico_flat[flat] @ m64)
        escalated.append((answered != 0).astype(np.float32) @ m32)
    rights, picos, escs = (np.concatenate(x, axis=0).T for x in (right_sum, pico_sum, escalated))
    return [
        SettingOutcomes(
            accuracy=rights[k].astype(np.float64) / counts[k],
            cost_per_1k=1000.0 * picos[k] / counts[k] / PICO,
            escalation=escs[k].astype(np.float64) / counts[k],
        )
        for k in range(len(masks))
    ]


def evaluate_settings(arrays: CascadeArrays, settings: np.ndarray) -> SettingOutcomes:
    """Every setting on all of `arrays`' items (`weigh_settings` with one set: all of them)."""
    return weigh_settings(arrays, settings, np.ones((1, len(arrays.scores)), dtype=bool))[0]


def evaluate_cascades(
    table: ResultTable, verifier: str, settings: Sequence[tuple[tuple[float, ...], float | None]]
) -> list[PolicyResult]:
    """`evaluate(CascadePolicy(verifier, thresholds), table, param)` for each (thresholds, param),
    the same results to the bit, in one pass per setting over arrays instead of a route per item:
    a report sweeps thousands of settings over thousands of items. Each item's outcome per
    answering tier is priced once (`cascade_arrays`); a setting then only picks a column per item.
    The means and percentiles are numpy's over the same values in the same order as `evaluate`'s
    lists, so they are equal, not merely close."""
    n = len(table.items)
    if n == 0:
        raise ValueError(f"run {table.run}: no complete items to evaluate")
    last = table.top
    name = CascadePolicy(verifier, ()).name
    arrays = cascade_arrays(table, verifier)
    cost, latency, right, scores = arrays.cost, arrays.latency, arrays.right, arrays.scores
    rows = np.arange(n)
    top_c1k = top_cost_per_1k(table)
    out = []
    for thresholds, param in settings:
        answered = policy.answering_tiers(scores, thresholds[:last])
        c1k = measures.cost_per_1k(cost[rows, answered].tolist())
        lat = latency[rows, answered].tolist()
        counts = [int(c) for c in np.bincount(answered, minlength=last + 1)]
        out.append(
            PolicyResult(
                policy=name,
                param=param,
                n=n,
                accuracy=int(right[rows, answered].sum()) / n,
                cost_per_1k=c1k,
                escalation_rate=(n - counts[0]) / n,
                top_rate=counts[last] / n,  # the cascade ran the top tier exactly when it answered
                answered=tuple(a / n for a in counts),
                latency_p50=measures.percentile(lat, 50),
                latency_p95=measures.percentile(lat, 95),
                savings=measures.savings(c1k, top_c1k),
            )
        )
    return out


def _cascade_route(item: ItemOutcome, answered: int, verifier: str) -> Route:
    """The route `CascadePolicy.route` gives an item that tier `answered` answers."""
    last = len(item.tiers) - 1
    if answered == last:
        return Route(last, tuple(range(last + 1)), (*((i, verifier) for i in range(last)), *_last_checks(item, last)))
    return Route(answered, tuple(range(answered + 1)), tuple((i, verifier) for i in range(answered + 1)))


def preroute_sweep(table: ResultTable, prerouter: str) -> list[PolicyResult]:
    """The pre-router alone at each skip threshold (shared by every tier but the last): a skipped
    tier's item goes up, a tier that runs answers unverified. Skip threshold 0 never skips."""
    k = max(1, table.top)
    return [evaluate(PreRoutePolicy(prerouter, (th,) * k), table, th) for th in threshold_grid(table, prerouter)]


@dataclass
class VerifierSummary:
    verifier: str
    auroc: list[float | None]  # per tier (None where the tier has no score or one class)
    ece: list[float | None]
    brier: list[float | None]
    apgr: float | None  # over the whole 0..1 range of calls to the top tier (`measures.apgr_full`)
    cpt: dict[float, float | None]  # target PGR -> fraction of calls to the top tier
    aiq: float | None
    curve: list[PolicyResult]
    # the range the sweep itself covers: from the share it escalates at threshold 0 (above 0 for a
    # verifier that abstains) to 1; and APGR normalised by that range alone (RouteLLM's `apgr`)
    covered_from: float | None = None
    apgr_covered: float | None = None


CPT_TARGETS = (0.5, 0.8, 0.95)


@dataclass(frozen=True)
class ScoreQuality:
    """How well one column's scores on one tier predict a right answer."""

    n: int
    auroc: float | None  # None with one class only
    ece: float | None
    brier: float | None


def score_quality(table: ResultTable, column: str) -> list[ScoreQuality | None]:
    """Per tier (None where the tier has no such scores)."""
    out: list[ScoreQuality | None] = []
    for t in range(len(table.tiers)):
        pairs = [(it.tiers[t].correct, v) for it in table.items if (v := it.tiers[t].scores.get(column)) is not None]
        if not pairs:
            out.append(None)
            continue
        y, s = zip(*pairs, strict=True)
        out.append(ScoreQuality(len(y), measures.auroc(y, s), measures.ece(y, s), measures.brier(y, s)))
    return out


def summarize(table: ResultTable, verifier: str, curve: list[PolicyResult] | None = None) -> VerifierSummary:
    curve = curve if curve is not None else sweep(table, verifier)
    quality = score_quality(table, verifier)
    aurocs = [q.auroc if q else None for q in quality]
    eces = [q.ece if q else None for q in quality]
    briers = [q.brier if q else None for q in quality]
    weak = accuracy_of(table, 0)
    strong = accuracy_of(table, table.top)
    xy = [(r.top_rate, r.accuracy) for r in curve]
    singles = [measures.cost_per_1k([it.tiers[t].cost_usd for it in table.items]) for t in range(len(table.tiers))]
    return VerifierSummary(
        verifier=verifier,
        auroc=aurocs,
        ece=eces,
        brier=briers,
        apgr=measures.apgr_full(xy, weak, strong),
        cpt={x: measures.cpt(xy, weak, strong, x) for x in CPT_TARGETS},
        aiq=measures.aiq([(r.cost_per_1k, r.accuracy) for r in curve], min(singles), max(singles)),
        curve=curve,
        covered_from=min((x for x, _ in xy), default=None),
        apgr_covered=measures.apgr(xy, weak, strong),
    )


def accuracy_of(table: ResultTable, tier: int) -> float:
    return sum(it.tiers[tier].correct for it in table.items) / len(table.items)


def baselines(table: ResultTable, steps: int = 20) -> dict[str, list[PolicyResult]]:
    """Single tiers, the oracle, and the random-escalation curve."""
    return {
        "tiers": [evaluate(SingleTier(i, t.name), table) for i, t in enumerate(table.tiers)],
        "oracle": [evaluate(OraclePolicy(), table)],
        "random": [random_escalation(table, i / steps) for i in range(steps + 1)],
    }
