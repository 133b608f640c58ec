"""Fixtures the telemetry tests share."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from router.telemetry.logs import JsonFormatter


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Every log record of the process at the service's default level, as its JSON formatter writes it."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
