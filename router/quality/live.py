"""Live quality estimates: tallies per tier and threshold, and their Wilson intervals.

Where clients label their answers (`router.quality.feedback`), the labelled accuracy is counted
beside the proxy, with the same interval.

With no reference answers in production, the accuracy of a tier's accepted answers is estimated
by their agreement with a larger tier on the shadow-sampled share (`router.quality.shadow`): that is a
proxy, exact only where the larger tier is always right; where both are wrong alike it reads high,
and where the agreement rule is strict (free text) it reads low. The acceptance rate is the share
of the tier's answers that passed its threshold. Tallies are kept per threshold because a
recalibrated threshold starts a new population: its figures must not mix with the old one's.

Intervals are Wilson score intervals: unlike the normal (Wald) interval they stay inside [0, 1]
and keep close to their nominal coverage for rates near 0 or 1 and for small counts, which is
where a sampled shadow share lives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a binomial rate; (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # at k = 0 or k = n the interval touches 0 or 1 exactly; say so rather than by rounding
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


@dataclass
class Tally:
    """One tier at one threshold: its tries and acceptances, its shadow pairs and agreements."""

    tried: int = 0
    accepted: int = 0
    pairs: int = 0
    agreed: int = 0
    labelled: int = 0  # requests its clients labelled (router.quality.feedback)
    right: int = 0  # of those, the ones whose latest label says right

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.tried if self.tried else None

    @property
    def agreement(self) -> float | None:
        """Also the estimated accuracy of the accepted answers (agreement as its proxy)."""
        return self.agreed / self.pairs if self.pairs else None

    @property
    def interval(self) -> tuple[float, float] | None:
        return wilson(self.agreed, self.pairs) if self.pairs else None

    @property
    def label_accuracy(self) -> float | None:
        """The accuracy of the answers clients labelled: ground truth where a proxy is all shadow gives."""
        return self.right / self.labelled if self.labelled else None

    @property
    def label_interval(self) -> tuple[float, float] | None:
        return wilson(self.right, self.labelled) if self.labelled else None


def threshold_label(threshold: float) -> str:
    return f"{threshold:g}"
