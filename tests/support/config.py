"""Config builders: the one place that writes tier config text for the tests.

`smol_config` writes a file (a served router in a child process reads one) and `smol_settings`
loads it; the eval and shadow helpers build their tiers with `tier` too, so a renamed or new tier
key is changed here once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from router.config import Settings, load_settings
from tests.support.model import SMOL


def write_config(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


class Toml(str):
    """A value written as is: `Toml("0.10")` keeps the text a test may look for and replace."""


def toml_value(value: object) -> str:
    if isinstance(value, Toml):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def table(header: str, values: dict[str, object]) -> str:
    """`[header]` and its keys; `header` may be `[tiers]`-style (an array of tables) too."""
    head = header if header.startswith("[") else f"[{header}]"
    return f"{head}\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items() if v is not None)


def tier(
    name: str,
    *,
    backend: str = "llamacpp",
    engine: dict[str, object],
    price: dict[str, object],
    tables: dict[str, dict[str, object]] | None = None,
    extra: str | None = None,
    **fields: object,
) -> str:
    """One `[[tiers]]` entry: its own keys (`fields`; None leaves one out), its backend's table
    (`engine`), its price, more sub-tables (`shadow = {...}`), then `extra` TOML text (for
    `[[tiers.verifiers]]` entries or keys that continue the last table)."""
    text = "\n" + table("[[tiers]]", {"name": name, "backend": backend, **fields})
    text += table(f"tiers.{backend}", engine)
    text += table("tiers.price", price)
    for sub, values in (tables or {}).items():
        text += table(f"tiers.{sub}", values)
    return text if extra is None else f"{text}{extra}\n"


def keyless(ledger: dict[str, object]) -> str:
    """`[server]` open to loopback without keys, and `[ledger]` as given."""
    return table("server", {"allow_unauthenticated": True}) + table("ledger", ledger)


# the large tier's price in the smol configs: OpenAI-like per-token prices
TOKEN_PRICE = {"usd_per_1m_input_tokens": Toml("0.60"), "usd_per_1m_output_tokens": Toml("2.40")}


def small_tier(threshold: float = 0.5, verifiers: str = "") -> str:
    """SmolLM2 as a time-priced small tier, decoding on one thread (as every test engine does: on a
    135M model a second thread mostly waits at llama.cpp's barriers, and the suite runs three
    workers on two cores; four test files took 69 s of CPU on two threads, 49 s on one)."""
    engine = {"model": SMOL, "n_ctx": 2048, "n_threads": 1, "n_parallel": 4}
    price = {"usd_per_hour": Toml("0.10"), "stands_for": "test small tier"}
    return tier("small", threshold=threshold, max_tokens=48, timeout_s=120, engine=engine, price=price, extra=verifiers)


def large_local_tier() -> str:
    """SmolLM2 again as a token-priced large tier."""
    engine = {"model": SMOL, "n_ctx": 2048, "n_threads": 1, "n_parallel": 2}
    return tier("large", max_tokens=48, engine=engine, price=TOKEN_PRICE)


def large_remote_tier(base_url: str, *, timeout: float = 60, breaker_failures: int = 5) -> str:
    """An OpenAI-compatible upstream at `base_url` serving the model as `smol`, as the large tier."""
    engine = {
        "base_url": base_url,
        "model": "smol",
        "max_attempts": 2,
        "backoff_initial_s": 0.1,
        "backoff_max_s": 0.5,
        "breaker_failures": breaker_failures,
        "breaker_cooldown_s": 60,
    }
    return tier("large", backend="openai", max_tokens=48, timeout_s=timeout, engine=engine, price=TOKEN_PRICE)


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
    body += small_tier(threshold, verifiers)
    if large == "local":
        body += large_local_tier()
    elif large == "remote":
        body += large_remote_tier(base_url, timeout=timeout, breaker_failures=breaker_failures)
    return write_config(tmp / "config.toml", body)


def smol_settings(tmp: Path, **kwargs: Any) -> Settings:
    """`smol_config`'s settings, for tests that build an engine or an app in process."""
    return load_settings(smol_config(tmp, **kwargs))
