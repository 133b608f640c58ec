"""Speculative decoding's acceptance rate, read from a server's Prometheus /metrics around a level.

The rate is a server's own count, so it is read where the server keeps it rather than inferred on
the client: the draft tokens proposed and accepted during a level are the difference of the
counters before and after it. Two servers speak here:

- tierroute: `tierroute_draft_tokens_total{tier,source}` and
  `tierroute_draft_accepted_tokens_total{tier,source}`, source "model" (the draft model's tokens)
  or "rejected" (a lower tier's rejected answer, reused as the first draft on escalation);
- llama.cpp's llama-server (started with `--metrics`): `llamacpp:spec_decode_num_draft_tokens_total`
  and `llamacpp:spec_decode_num_accepted_tokens_total`, counted as source "model".

A server that exposes neither (no /metrics, or an engine without drafting) gives None, not zero:
"did not draft" and "drafted nothing" are different findings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.bench.workload import Target

# sample name -> which count it is
_TIERROUTE = {
    "tierroute_draft_tokens_total": "drafted",
    "tierroute_draft_accepted_tokens_total": "accepted",
}
_LLAMA_SERVER = {
    "llamacpp:spec_decode_num_draft_tokens_total": "drafted",
    "llamacpp:spec_decode_num_accepted_tokens_total": "accepted",
}

Counts = dict[tuple[str, str], float]  # (source, "drafted" | "accepted") -> count


def parse_draft_counters(text: str) -> Counts | None:
    """The draft counters in a Prometheus text exposition, summed over tiers, per source; None
    when the text has none of them."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: Counts = {}
    found = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            kind = _TIERROUTE.get(sample.name)
            source = sample.labels.get("source", "model")
            if kind is None:
                kind = _LLAMA_SERVER.get(sample.name)
                source = "model"
            if kind is None:
                continue
            found = True
            counts[(source, kind)] = counts.get((source, kind), 0.0) + float(sample.value)
    return counts if found else None


def metrics_url(target: Target) -> str:
    """/metrics sits at the server's root, beside /v1."""
    base = target.url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return f"{base}/metrics"


async def read_draft_counters(target: Target) -> Counts | None:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.get(metrics_url(target), headers={"authorization": f"Bearer {target.api_key}"})
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return parse_draft_counters(response.text)


@dataclass
class DraftProbe:
    """Reads the counters before a level and gives the level's acceptance after it."""

    target: Target
    _before: Counts | None = None

    async def start(self) -> None:
        self._before = await read_draft_counters(self.target)

    async def result(self) -> dict[str, Any] | None:
        after = await read_draft_counters(self.target)
        if after is None:
            return None
        return draft_delta(self._before or {}, after)


def draft_delta(before: Mapping[tuple[str, str], float], after: Mapping[tuple[str, str], float]) -> dict[str, Any]:
    """Per source and in total: draft tokens proposed and accepted between two readings, and the
    acceptance rate (accepted / proposed; None when nothing was proposed)."""
    sources = sorted({source for source, _ in after})
    out: dict[str, Any] = {}
    total_drafted = total_accepted = 0.0
    for source in sources:
        drafted = after.get((source, "drafted"), 0.0) - before.get((source, "drafted"), 0.0)
        accepted = after.get((source, "accepted"), 0.0) - before.get((source, "accepted"), 0.0)
        out[source] = _row(drafted, accepted)
        total_drafted += drafted
        total_accepted += accepted
    out["total"] = _row(total_drafted, total_accepted)
    return out


def _row(drafted: float, accepted: float) -> dict[str, Any]:
    return {
        "drafted": int(drafted),
        "accepted": int(accepted),
        "acceptance": round(accepted / drafted, 4) if drafted > 0 else None,
    }
