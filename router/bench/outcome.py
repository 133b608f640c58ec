"""One request as the client saw it, and one level's figures made from many.

Tokens and times of a level are of the answered requests only; refusals (503) and errors are
counted beside them, so a server that sheds load is not scored as fast.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.bench.stats import distribution_ms, rounded


@dataclass
class Outcome:
    """One request as the client saw it. `error` is None when answered, else the HTTP status
    ("503", "500", ...), "timeout", "connection", "stream_error" (an error reported after output
    began), or "incomplete" (the stream ended without a finish reason: cut short, as
    llama-cpp-python's server does to a running stream when another request arrives, unless it is
    started with `--interrupt_requests False`)."""

    index: int
    sent_s: float  # since the level began
    latency_s: float = 0.0
    ttft_s: float | None = None
    output_tokens: int = 0
    usage_reported: bool = False
    finish_reason: str | None = None
    error: str | None = None
    server_ms: float | None = None  # overhead mode: the app's own time, from Server-Timing
    tier: str | None = None  # overhead mode: the tier that answered
    cache: str | None = None  # overhead mode: what the response cache did (x-tierroute-cache), if it is on

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "i": self.index,
            "sent_s": rounded(self.sent_s, 6),
            "latency_ms": rounded(self.latency_s * 1000),
            "ttft_ms": rounded(None if self.ttft_s is None else self.ttft_s * 1000),
            "output_tokens": self.output_tokens,
            "finish_reason": self.finish_reason,
            "error": self.error,
        }
        if self.server_ms is not None:
            row["server_ms"] = rounded(self.server_ms)
        if self.tier is not None:
            row["tier"] = self.tier
        if self.cache is not None:
            row["cache"] = self.cache
        return row


def summarize(outcomes: Sequence[Outcome], wall_s: float) -> dict[str, Any]:
    """One level's figures. Tokens and times are of the answered requests only."""
    ok = [o for o in outcomes if o.ok]
    refused = sum(1 for o in outcomes if o.error == "503")
    errors = Counter(o.error for o in outcomes if o.error is not None and o.error != "503")
    tokens = sum(o.output_tokens for o in ok)
    with_usage = sum(1 for o in ok if o.usage_reported)
    source = None if not ok else "usage" if with_usage == len(ok) else "chunks" if with_usage == 0 else "mixed"
    per_token = [
        (o.latency_s - o.ttft_s) / (o.output_tokens - 1) for o in ok if o.ttft_s is not None and o.output_tokens > 1
    ]
    return {
        "requests": len(outcomes),
        "ok": len(ok),
        "refused_503": refused,
        "errors": dict(sorted(errors.items())),
        "wall_s": rounded(wall_s),
        "output_tokens": tokens,
        "output_tok_s": rounded(tokens / wall_s if wall_s > 0 else 0.0),
        "requests_s": rounded(len(ok) / wall_s if wall_s > 0 else 0.0),
        "finish_reasons": dict(sorted(Counter(o.finish_reason or "none" for o in ok).items())),
        "tokens_source": source,
        "ttft_ms": distribution_ms([o.ttft_s for o in ok if o.ttft_s is not None]),
        "latency_ms": distribution_ms([o.latency_s for o in ok]),
        "decode_ms_per_token": distribution_ms(per_token),
    }
