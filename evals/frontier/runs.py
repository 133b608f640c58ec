"""Writing a frontier model's published results as an eval run, the part every importer shares:
the run built beside its destination and renamed into place (`replace_run`), and the manifest's
entry for a published tier (`published_tier`), which has no verifiers and is only ever the last
tier. Used by `evals.frontier.tiers` (RouteLLM), `evals.frontier.bfcl` and `evals.frontier.ifeval`.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from router.config import PriceSettings
from router.policy import describe


def replace_run(runs_dir: Path, name: str, write: Callable[[Path], Coroutine[Any, Any, None]]) -> Path:
    """Write (or rewrite whole) the run `runs_dir/name` by `write(tmp)`: built in a folder beside
    it and renamed into place, so a failure leaves the old run (or none)."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    final = runs_dir / name
    tmp = Path(tempfile.mkdtemp(dir=runs_dir, prefix=f".{name}-"))
    try:
        asyncio.run(write(tmp))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def published_tier(name: str, model: str, fingerprint: str, price: PriceSettings) -> dict[str, Any]:
    """A published tier as a run's manifest lists it."""
    return {
        "name": name,
        "backend": "published",
        "model": f"published:{model}",
        "fingerprint": fingerprint,
        "max_tokens": None,
        "price": price.model_dump(mode="json"),
        "price_text": describe(price),
        "task": None,
        "combine": "mean",
        "threshold": 0.5,
        "verifiers": [],
        "scored_with": [],
    }
