"""Reading Prometheus text back into numbers."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(m: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of the samples of `name` that carry these labels (and any others)."""
    want = set(labels.items())
    return math.fsum(v for (n, have), v in m.items() if n == name and want <= have)
