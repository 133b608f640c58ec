"""The scripted upstream server every backend test talks to, one per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fault_upstream import FaultUpstream


@pytest.fixture
def upstream() -> Iterator[FaultUpstream]:
    with FaultUpstream() as server:
        yield server


@pytest.fixture
def second() -> Iterator[FaultUpstream]:
    """A second fault upstream: the other deployment of a two-deployment tier."""
    with FaultUpstream() as server:
        yield server
