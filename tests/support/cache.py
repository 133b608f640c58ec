"""The response cache's tests: a backend that counts its generations, and a config with a cache."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from router.backends.instant import InstantBackend
from router.generation import Delta, Generation, GenerationRequest
from tests.support.accounting import keys_section
from tests.support.config import write_config
from tests.support.model import SMOL


class Counting(InstantBackend):
    """Answers at once, each time differently ("answer 1 here", "answer 2 here", ...): a request
    answered by generating shows it, and `calls` counts the generations."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls = 0

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        self.calls += 1
        self.reply = f"answer {self.calls} here"
        async for event in super().stream(request):
            yield event


def cache_config(
    tmp: Path,
    keys: dict[str, dict[str, Any]],
    *,
    cache: str = "enabled = true\n",
    threshold: float = 0.5,
    name: str = "config.toml",
    ledger_url: str | None = None,
) -> tuple[Path, dict[str, str]]:
    """One tier (its backend replaced by `Counting` in the tests), these keys, a SQLite ledger in
    `tmp` (or the PostgreSQL one at `ledger_url`), and `cache` as the [cache] section's body."""
    body, raw = keys_section(keys)
    ledger = f'url = "{ledger_url}"' if ledger_url else f'path = "{tmp / "ledger.sqlite3"}"'
    text = (
        f"[server]\n{body}\n[ledger]\n{ledger}\n[cache]\n{cache}\n"
        f'[[tiers]]\nname = "small"\nbackend = "llamacpp"\nthreshold = {threshold}\nmax_tokens = 64\n'
        f'[tiers.llamacpp]\nmodel = "{SMOL}"\n'
        "[tiers.price]\nusd_per_1m_input_tokens = 0.60\nusd_per_1m_output_tokens = 2.40\n"
    )
    return write_config(tmp / name, text), raw
