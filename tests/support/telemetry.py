"""Shared by the telemetry tests: two OpenAI-compatible tiers on a scripted upstream, the OTLP
receiver process (tests/support/otlp_receiver.py), and readers for what it and the logs hold."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.config import TOKEN_PRICE, Toml, tier, write_config
from tests.support.markers import FastLoop

RECEIVER = Path(__file__).with_name("otlp_receiver.py")
PROMPT_MARK = "zebra-quartz-prompt-7731"  # a prompt text no span or log line may carry


def remote_tiers(base_url: str, *, small_verifiers: str, threshold: float = 0.5, shadow: bool = False) -> str:
    """`small` and `large`, both OpenAI-compatible tiers on `base_url`; `small` judged by its
    verifiers, and with `shadow` each of its accepted answers also sent to `large`."""
    engine = {"base_url": base_url, "model": "fake", "max_attempts": 2, "backoff_initial_s": 0.05}
    price = {"usd_per_1m_input_tokens": Toml("0.10"), "usd_per_1m_output_tokens": Toml("0.40")}
    tables = {"shadow": {"rate": Toml("1.0"), "usd_per_day": Toml("10.0")}} if shadow else None
    small = tier(
        "small", backend="openai", threshold=threshold, max_tokens=32, engine=engine, price=price, tables=tables
    )
    return (
        small
        + small_verifiers
        + "\n"
        + tier("large", backend="openai", max_tokens=32, engine=engine, price=TOKEN_PRICE)
    )


def config(tmp: Path, base_url: str, *, server: str, small_verifiers: str, extra: str = "", **tiers: Any) -> Path:
    body = f'[server]\n{server}\n[ledger]\npath = "{tmp / "ledger.sqlite3"}"\n{extra}\n'
    return write_config(tmp / "config.toml", body + remote_tiers(base_url, small_verifiers=small_verifiers, **tiers))


@contextlib.contextmanager
def otlp_receiver(out: Path) -> Iterator[str]:
    """The receiver as a child process on a free loopback port: yields its base URL."""
    FastLoop.check("starts an OTLP receiver process")
    proc = subprocess.Popen([sys.executable, str(RECEIVER), str(out)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def received(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line]


def leaks(text: str, *secrets: str) -> list[str]:
    """Which of `secrets` appear in `text`."""
    return [s for s in secrets if s in text]
