"""How a request picks one of its tier's deployments: the routing strategies, one small class each.

A strategy sees only the deployments that may take the request now (the pool has already left out
those whose breaker is open, that a `Retry-After` marks, that fail their probe or are at their
`max_concurrent`, and those this request already failed on) and picks one of them. It holds no
state of its own and is given its random source, so a test can replay its choices with a seed.

- `least_outstanding` (the default): the deployment with the fewest requests in flight from this
  replica, ties broken at random by weight. A slow deployment keeps its requests longer, so it
  is picked less without anyone measuring its latency.
- `weighted_random`: at random, in proportion to `weight`; in flight counts are ignored.
- `ordered_failover`: the first in config order; the others only when it cannot take the request
  (a primary and its standbys).

They are registered by name in `STRATEGIES`, which the config's `strategy` names.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol


class Candidate(Protocol):
    """What a strategy reads of a deployment."""

    @property
    def weight(self) -> float: ...

    @property
    def outstanding(self) -> int: ...


class Strategy(Protocol):
    def pick(self, candidates: Sequence[Candidate], rng: random.Random) -> int:
        """The index in `candidates` (never empty, in config order) of the deployment to use."""
        ...


class WeightedRandom:
    def pick(self, candidates: Sequence[Candidate], rng: random.Random) -> int:
        return _weighted(range(len(candidates)), candidates, rng)


class LeastOutstanding:
    def pick(self, candidates: Sequence[Candidate], rng: random.Random) -> int:
        fewest = min(c.outstanding for c in candidates)
        return _weighted([i for i, c in enumerate(candidates) if c.outstanding == fewest], candidates, rng)


class OrderedFailover:
    def pick(self, candidates: Sequence[Candidate], rng: random.Random) -> int:
        return 0


def _weighted(indexes: Sequence[int], candidates: Sequence[Candidate], rng: random.Random) -> int:
    if len(indexes) == 1:
        return indexes[0]
    return rng.choices(list(indexes), weights=[candidates[i].weight for i in indexes])[0]


STRATEGIES: dict[str, Strategy] = {
    "least_outstanding": LeastOutstanding(),
    "weighted_random": WeightedRandom(),
    "ordered_failover": OrderedFailover(),
}
