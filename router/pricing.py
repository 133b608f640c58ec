"""What a tier's work costs, from its price sheet entry.

Token-priced tiers (hosted APIs) cost input and output tokens. Time-priced tiers (self-hosted
hardware) cost their hourly price times the measured busy time of the work; where a backend cannot
measure busy time (a remote server), wall latency stands in for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.config import PriceSettings


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    seconds: float


def cost_usd(price: PriceSettings, usage: Usage) -> float:
    if price.usd_per_hour is not None:
        return price.usd_per_hour * max(0.0, usage.seconds) / 3600.0
    assert price.usd_per_1m_input_tokens is not None and price.usd_per_1m_output_tokens is not None
    return (
        usage.prompt_tokens * price.usd_per_1m_input_tokens + usage.completion_tokens * price.usd_per_1m_output_tokens
    ) / 1_000_000


def describe(price: PriceSettings) -> str:
    if price.usd_per_hour is not None:
        basis = f"${price.usd_per_hour:g}/hour of measured busy time"
    else:
        basis = f"${price.usd_per_1m_input_tokens:g} / ${price.usd_per_1m_output_tokens:g} per 1M input / output tokens"
    return f"{basis} ({price.stands_for})" if price.stands_for else basis
