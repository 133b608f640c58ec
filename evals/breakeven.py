"""When does a cascade pay? The large-to-small price ratio above which a calibrated cascade costs
less than the top tier alone, at the accuracy its target asks for.

Why this is its own analysis: whether a cascade saves money depends less on the verifier than on
how much dearer the top tier is. The committed price sheet makes the large tier only about 4x the
small per GSM8K request, where users of hosted models pay 10-100x; a cascade that loses money at 4x
can save most of the bill at 30x. So the report gives, per verifier, the ratio where it breaks even
and what it saves at 10x and 100x, instead of one number at one arbitrary price.

Definitions (the report's text says the same):

- The price ratio r is the mean priced cost of one top-tier request over that of one first-tier
  request, over all the run's items (generation only, as in the report's tier table). The price
  sheet recorded with the run sits at r0. Ratio r means: the top tier's price sheet multiplied by
  s = r / r0, every other tier's price as recorded.
- The cascade is the one the report calibrates: each verifier's thresholds chosen on the
  calibration split for the report's target, at the recorded prices; it is evaluated on the
  held-out items only, against always-top on the same items.
- Every priced cost is linear in a price sheet (tokens times price, or busy seconds times an hourly
  price), so each policy's mean cost is cost(s) = fixed + s * scaled, where `fixed` is what it pays
  with the top tier's price at zero and `scaled` what the top tier's price adds at the recorded
  sheet. Work a verifier has another tier do is priced at that tier, so it lands on the right side.
  The break-even multiplier solves cascade(s) = top(s) in closed form.
- Accuracy condition: the cascade's held-out accuracy must meet the target as the report states
  it (for `min-pgr=G`: at least first + G * (top - first) on the held-out items, so at most
  (1 - G) of the gap below always-top; for `min-accuracy=A`: at least A). Targets that set no
  accuracy (`max-cost`, `max-escalation`) are held to always-top's accuracy itself. A cascade that
  misses it has no break-even ratio ("never"), whatever it saves: it is cheaper because it is
  worse. Why the target's tolerance rather than strict equality: the report calibrates for the
  target, so a cascade asked to recover 80% of the gap is by construction a little less accurate
  than always-top; holding it to equality would answer "never" for every verifier and say nothing
  about the price at which the cascade the user asked for pays.

Accuracy does not move with r: the thresholds are chosen once, at the recorded prices. For two
tiers and an accuracy target that choice is the same at any r > 0 (escalating more never costs
less, so the cheapest threshold meeting the target is the lowest one, whatever the prices).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from evals.sweep import CascadePolicy, ResultTable, SingleTier, evaluate
from router.config import PriceSettings

if TYPE_CHECKING:
    from evals.calibrate import Calibration

RATIOS = (10.0, 100.0)  # the price ratios whose savings the report gives


def scale_price(price: PriceSettings, s: float) -> PriceSettings:
    """The price sheet entry with every price multiplied by `s` (what it stands for kept)."""

    def times(x: float | None) -> float | None:
        return None if x is None else x * s

    return price.model_copy(
        update={
            "usd_per_1m_input_tokens": times(price.usd_per_1m_input_tokens),
            "usd_per_1m_output_tokens": times(price.usd_per_1m_output_tokens),
            "usd_per_hour": times(price.usd_per_hour),
        }
    )


def scaled_top_prices(table: ResultTable, s: float) -> dict[str, PriceSettings]:
    """Every tier's price as `table` priced it, the top tier's multiplied by `s`: what a table is
    reloaded with (`load_table(store, prices=...)`) to price it at multiplier `s`; s = 0 gives the
    table the fixed parts come from."""
    prices = {t.name: t.price for t in table.tiers}
    top = table.tiers[-1]
    prices[top.name] = scale_price(top.price, s)
    return prices


@dataclass(frozen=True)
class LinearCost:
    """A mean cost per 1k requests as a function of the top tier's price multiplier s."""

    fixed: float  # $ per 1k with the top tier free
    scaled: float  # $ per 1k the top tier's recorded price adds, per unit of s

    def at(self, s: float) -> float:
        return self.fixed + s * self.scaled


def break_even_scale(cascade: LinearCost, top: LinearCost) -> float | None:
    """The multiplier s* above which the cascade costs strictly less than always-top:
    cascade.fixed + s * cascade.scaled < top.fixed + s * top.scaled for every s > s*, and not at
    s*. 0 when it is cheaper at every price; None when it is not cheaper at any large enough
    price (its top-tier part is no smaller than always-top's)."""
    slope = top.scaled - cascade.scaled
    if slope <= 0:
        return None
    return max(0.0, (cascade.fixed - top.fixed) / slope)


@dataclass(frozen=True)
class BreakEven:
    """One verifier's calibrated cascade on the held-out items, as prices change."""

    verifier: str
    thresholds: dict[str, float]
    accuracy: float  # the cascade's, held-out
    top_accuracy: float  # always-top's on the same items
    required: float  # what the accuracy condition asks for
    cascade: LinearCost
    top: LinearCost
    base_ratio: float  # r0: the recorded price sheet's ratio

    @property
    def accuracy_met(self) -> bool:
        return self.accuracy >= self.required - 1e-12

    @property
    def cost_scale(self) -> float | None:
        """The break-even multiplier of the top tier's price, on cost alone."""
        return break_even_scale(self.cascade, self.top)

    @property
    def ratio(self) -> float | None:
        """The break-even price ratio r*: above it the cascade is cheaper than always-top and
        meets the accuracy condition. None ("never") when it misses the accuracy condition, or
        when no price ratio makes it cheaper."""
        s = self.cost_scale
        if s is None or not self.accuracy_met:
            return None
        return s * self.base_ratio

    @property
    def never_because(self) -> str | None:
        if not self.accuracy_met:
            return "accuracy"
        if self.cost_scale is None:
            return "cost"
        return None

    def savings_at(self, ratio: float) -> float | None:
        """1 - cascade / always-top at price ratio `ratio` (held-out items); None where
        always-top costs nothing."""
        s = ratio / self.base_ratio
        top = self.top.at(s)
        return None if top <= 0 else 1.0 - self.cascade.at(s) / top


@dataclass(frozen=True)
class BreakEvenReport:
    base_ratio: float | None  # None: no ratio (one tier, or a tier that costs nothing)
    rows: list[BreakEven]
    n_held_out: int
    why_none: str = ""  # why there is no ratio


def linear_cost(policy: CascadePolicy | SingleTier, priced: ResultTable, top_free: ResultTable) -> LinearCost:
    """A policy's mean cost per 1k on `priced`'s items as fixed + s * scaled, from the same items
    priced as recorded and with the top tier free."""
    at_zero = evaluate(policy, top_free).cost_per_1k
    return LinearCost(at_zero, evaluate(policy, priced).cost_per_1k - at_zero)


def required_accuracy(cal: Calibration) -> float:
    """The held-out accuracy the cascade must reach (see the module's definitions)."""
    from evals.calibrate import ACCURACY_KINDS

    if cal.target.kind in ACCURACY_KINDS:
        return cal.held_out_goal
    return cal.held_out_tiers[-1].accuracy  # a cost or escalation target: the top tier's accuracy


def analyse(priced: ResultTable, top_free: ResultTable, calibrations: list[Calibration]) -> BreakEvenReport:
    """The break-even of each calibrated cascade. `top_free` is `priced` reloaded with the top
    tier's price at zero (`scaled_top_prices(priced, 0)`): the same items, every other price as
    recorded."""
    from evals.calibrate import split

    if len(priced.tiers) < 2:
        return BreakEvenReport(None, [], 0, "one tier: there is nothing to cascade, so no price ratio")
    if [it.id for it in priced.items] != [it.id for it in top_free.items]:
        raise ValueError(f"run {priced.run}: the repriced table holds other items")
    first_cost = evaluate(SingleTier(0), priced).cost_per_1k
    top_cost = evaluate(SingleTier(priced.top), priced).cost_per_1k
    if first_cost <= 0 or top_cost <= 0:
        free = priced.tiers[0 if first_cost <= 0 else -1].name
        return BreakEvenReport(None, [], 0, f"tier {free} costs nothing at the recorded prices: no price ratio")
    base = top_cost / first_cost
    if not calibrations:
        return BreakEvenReport(base, [], 0, "no calibrated cascade")
    rows = []
    c0 = calibrations[0]
    _, held = split(priced, c0.seed, c0.fraction)
    _, held_free = split(top_free, c0.seed, c0.fraction)
    top = linear_cost(SingleTier(priced.top), held, held_free)
    for cal in calibrations:
        names = [t.name for t in priced.tiers[:-1]]
        policy = CascadePolicy(cal.verifier, tuple(cal.thresholds[n] for n in names))
        rows.append(
            BreakEven(
                verifier=cal.verifier,
                thresholds=dict(cal.thresholds),
                accuracy=cal.held_out.accuracy,
                top_accuracy=cal.held_out_tiers[-1].accuracy,
                required=required_accuracy(cal),
                cascade=linear_cost(policy, held, held_free),
                top=top,
                base_ratio=base,
            )
        )
    return BreakEvenReport(base, rows, len(held.items))


def log_grid(lo: float = 1.0, hi: float = 1000.0, n: int = 200) -> list[float]:
    """`n` ratios evenly spaced in log scale from `lo` to `hi`."""
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]
