"""Config builders: the one place that writes tier config text for the tests."""

from __future__ import annotations

from pathlib import Path

from tests.support.model import SMOL


def write_config(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


SMALL_TIER = """
[[tiers]]
name = "small"
backend = "llamacpp"
threshold = {threshold}
max_tokens = 48
timeout_s = 120
[tiers.llamacpp]
model = "{model}"
n_ctx = 2048
n_threads = 2
n_parallel = 4
[tiers.price]
usd_per_hour = 0.10
stands_for = "test small tier"
{verifiers}
"""

LARGE_LOCAL_TIER = """
[[tiers]]
name = "large"
backend = "llamacpp"
max_tokens = 48
[tiers.llamacpp]
model = "{model}"
n_ctx = 2048
n_threads = 2
n_parallel = 2
[tiers.price]
usd_per_1m_input_tokens = 0.60
usd_per_1m_output_tokens = 2.40
"""

LARGE_REMOTE_TIER = """
[[tiers]]
name = "large"
backend = "openai"
max_tokens = 48
timeout_s = {timeout}
[tiers.openai]
base_url = "{base_url}"
model = "smol"
max_attempts = 2
backoff_initial_s = 0.1
backoff_max_s = 0.5
breaker_failures = {breaker_failures}
breaker_cooldown_s = 60
[tiers.price]
usd_per_1m_input_tokens = 0.60
usd_per_1m_output_tokens = 2.40
"""


def smol_config(
    tmp: Path,
    *,
    threshold: float = 0.5,
    verifiers: str = "",
    large: str = "local",
    base_url: str = "",
    server: str = "allow_unauthenticated = true",
    cascade: str = "",
    sandbox: str = "",
    timeout: float = 60,
    breaker_failures: int = 5,
) -> Path:
    body = f'[server]\n{server}\n[ledger]\npath = "{tmp / "ledger.sqlite3"}"\n'
    if cascade:
        body += f"[cascade]\n{cascade}\n"
    if sandbox:
        body += f"[sandbox]\n{sandbox}\n"
    body += SMALL_TIER.format(threshold=threshold, model=SMOL, verifiers=verifiers)
    if large == "local":
        body += LARGE_LOCAL_TIER.format(model=SMOL)
    elif large == "remote":
        body += LARGE_REMOTE_TIER.format(base_url=base_url, timeout=timeout, breaker_failures=breaker_failures)
    return write_config(tmp / "config.toml", body)
