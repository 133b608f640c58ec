"""Drift alarms: has a tier's acceptance rate, its shadow agreement rate, or its labelled accuracy
moved off its baseline?

The signals are streams of yes/no observations (this request accepted or not; this shadow pair
agreed or not; this answer labelled right or not by its client, `router.quality.feedback`), one
stream per tier and task. The detector is the Bernoulli CUSUM (Reynolds and
Stoumbos 1999): for a baseline rate p0 and the rate p1 it should catch, it adds each observation's
log-likelihood ratio, ln(p1/p0) for a yes and ln((1-p1)/(1-p0)) for a no, to a sum floored at 0,
and alarms when the sum reaches h.

Why this one and not Page-Hinkley: the data are Bernoulli, and for a change from one known rate to
another the CUSUM of the exact likelihood ratio is the optimal detector (Moustakides 1986: the
least worst-case detection delay for a given mean time between false alarms). Page-Hinkley is the
same recursion on a Gaussian mean: its drift allowance and threshold are in the data's units and
must be retuned for every baseline, and near rates of 0.9 or more, where a good tier's rates live,
its Gaussian reading of 0/1 data is poor. Here the two parameters have one meaning for every tier:

- the shift to detect is an odds ratio, `ODDS_RATIO` = 2 (p1's odds are p0's halved, for a fall;
  doubled, for a rise in acceptance): from 0.9 that is 0.82, from 0.6 it is 0.43;
- `H` = 6. Simulated with the baseline known, the mean run between false alarms is about 9,000
  observations at p0 = 0.5 and 16,000 at 0.8 (more at higher rates), while a tier that falls to
  30% agreement is caught in about 15-70 observations (fewer the higher its baseline), and one
  that falls to 0 from 0.9 in 10. (h = 4 and 5 gave 1,300 and 3,500 at 0.5: too many alarms for a
  rate an operator reads daily.) tests/router/quality/test_drift.py pins both sides on fixed seeds.

Agreement and feedback are watched for a fall only (agreeing more with the larger tier, or being
labelled right more often, is not a fault); acceptance for a fall and a rise (a verifier that
starts accepting more may have been fooled). Acceptance alone cannot see a tier that answers
wrong at the same confidence: that is what the agreement stream is for.

Baseline: where the operator states one (`tiers[].shadow.baseline_accept` / `baseline_agree`, per
task or '*', e.g. the acceptance the calibration measured on its held-out split), that; else each
stream learns it from its first `baseline_n` observations (default 200), (yes + 1/2) / (n + 1),
and watches from there. Feedback has no stated baseline: a stream of labels is watched once
`baseline_n` labelled requests of the tier and task have arrived, and not before. A learned
baseline is itself uncertain (one standard error is 0.02 at 0.9 from 200 observations), and a
detector tuned to an overestimated baseline reads noise as drift: simulated, 4 runs in 20 alarmed
within 800 observations of a stable 0.9 tier. So each detector starts from the baseline moved
`GUARD` = 2 standard errors towards the side it watches (lower for a fall, higher for a rise).
Simulated over 20 seeds of 20,000 stable observations, the runs with any false alarm fell from 10
to 2 at p0 = 0.9 (17 to 2 at 0.6, 6 to 0 at 0.97), while a fall from 0.9 to 0.3 is still caught
within 26 observations (median 17) and from 0.6 to 0.2 within 108. We chose a config value over
storing the baseline beside the thresholds that `eval calibrate --write` writes: that writer
belongs to the eval package, and an operator can copy the calibration's figure into the config by
hand; the learned baseline covers the rest.

An alarm stays raised until the sum falls back to 0 (the rate came back), so a lasting drift is
one alarm, not one per request. The same detector runs live (`router.quality.shadow`) and over the
ledger's history (`tierroute report quality`), so the report shows the alarms the service raised.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

ODDS_RATIO = 2.0
H = 6.0
GUARD = 2.0  # standard errors a learned baseline is moved by, towards the side each detector watches
# a detector needs its baseline inside [0.005, 0.995]: past it the rate cannot move further its way,
# and a constant stream would still creep towards an alarm by ln(p1/p0) per observation
_EDGE = 0.005

Signal = Literal["acceptance", "agreement", "feedback"]
Direction = Literal["down", "up"]
_DIRECTIONS: dict[Signal, tuple[Direction, ...]] = {
    "acceptance": ("down", "up"),
    "agreement": ("down",),
    "feedback": ("down",),
}


def shifted(p0: float, direction: Direction, odds_ratio: float = ODDS_RATIO) -> float:
    """The rate the detector looks for: p0's odds divided (down) or multiplied (up) by the ratio."""
    odds = p0 / (1 - p0)
    odds = odds / odds_ratio if direction == "down" else odds * odds_ratio
    return odds / (1 + odds)


@dataclass
class BernoulliCusum:
    """One-sided Bernoulli CUSUM from rate p0 towards p1."""

    p0: float
    p1: float
    h: float = H
    s: float = 0.0
    alarmed: bool = False
    since_zero: list[int] = field(default_factory=lambda: [0, 0])  # (yes, n) since the sum was last 0

    def __post_init__(self) -> None:
        self._yes = math.log(self.p1 / self.p0)
        self._no = math.log((1 - self.p1) / (1 - self.p0))

    def update(self, x: bool) -> bool:
        """Add one observation; True when this one raises the alarm."""
        self.s = max(0.0, self.s + (self._yes if x else self._no))
        if self.s == 0.0:
            self.since_zero = [0, 0]
            self.alarmed = False
            return False
        self.since_zero[0] += int(x)
        self.since_zero[1] += 1
        if self.s >= self.h and not self.alarmed:
            self.alarmed = True
            return True
        return False


@dataclass(frozen=True)
class Alarm:
    tier: str
    task: str
    signal: Signal
    direction: Direction
    ts: float  # when it was raised (unix seconds)
    n: int  # the stream's observation count at the alarm
    baseline: float  # stated, or learned from the stream's first observations
    watched_from: float  # the detector's p0: a learned baseline moved by its guard
    recent: float  # the rate over the observations since the sum was last 0
    recent_n: int

    def describe(self) -> str:
        fell = "fell" if self.direction == "down" else "rose"
        return (
            f"drift: {self.tier}/{self.task} {self.signal} {fell}: {self.recent:.1%} over the last "
            f"{self.recent_n} against a baseline of {self.baseline:.1%} (observation {self.n})"
        )


@dataclass
class _Stream:
    baseline: float | None
    warmup: int
    n: int = 0
    yes: int = 0
    armed: bool = False
    detectors: dict[Direction, BernoulliCusum] = field(default_factory=dict)


# the stated baseline for (tier, signal, task), or None to learn it; and the learning window
Baselines = Callable[[str, Signal, str], float | None]
Warmup = Callable[[str], int]


class DriftMonitor:
    """Bernoulli CUSUMs per (tier, task, signal); deterministic, no clock or I/O of its own."""

    def __init__(self, baselines: Baselines, warmup: Warmup, *, h: float = H, odds_ratio: float = ODDS_RATIO) -> None:
        self.baselines = baselines
        self.warmup = warmup
        self.h = h
        self.odds_ratio = odds_ratio
        self.streams: dict[tuple[str, str, Signal], _Stream] = {}
        self.alarms: list[Alarm] = []

    def observe(self, tier: str, task: str, signal: Signal, x: bool, ts: float) -> list[Alarm]:
        """Add one observation; the alarms it raised (usually none)."""
        key = (tier, task, signal)
        st = self.streams.get(key)
        if st is None:
            st = self.streams[key] = _Stream(self.baselines(tier, signal, task), self.warmup(tier))
            if st.baseline is not None:
                self._arm(st, signal, st.baseline)
        st.n += 1
        st.yes += int(x)
        if not st.armed:
            if st.n >= st.warmup:
                self._arm(st, signal, (st.yes + 0.5) / (st.n + 1), guard=GUARD * math.sqrt(1 / st.n))
            return []
        raised = []
        for direction, cusum in st.detectors.items():
            if cusum.update(x):
                yes, n = cusum.since_zero
                baseline = st.baseline if st.baseline is not None else cusum.p0
                raised.append(Alarm(tier, task, signal, direction, ts, st.n, baseline, cusum.p0, yes / n, n))
        self.alarms += raised
        return raised

    def _arm(self, st: _Stream, signal: Signal, p0: float, guard: float = 0.0) -> None:
        """Start the detectors from baseline p0; a learned one is moved `guard` standard errors
        (times sqrt(n), given) towards the side each detector watches."""
        st.baseline, st.armed = p0, True
        se = guard * math.sqrt(p0 * (1 - p0))
        for direction in _DIRECTIONS[signal]:
            base = p0 - se if direction == "down" else p0 + se
            if not _EDGE <= base <= 1 - _EDGE:
                continue  # a rate of all or nothing cannot move further that way: nothing to watch
            st.detectors[direction] = BernoulliCusum(base, shifted(base, direction, self.odds_ratio), self.h)

    def state(self) -> list[tuple[str, str, Signal, Direction, float, bool]]:
        """(tier, task, signal, direction, statistic / h, alarmed) for every armed detector."""
        return [
            (tier, task, signal, d, c.s / c.h, c.alarmed)
            for (tier, task, signal), st in self.streams.items()
            for d, c in st.detectors.items()
        ]
