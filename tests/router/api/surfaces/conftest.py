"""The served routers the surface tests share (tests/support/surfaces.py), one of each per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import UvicornThread
from tests.support.surfaces import smol_server, tools_server


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[UvicornThread]:
    with smol_server(tmp_path_factory.mktemp("smol")) as srv:
        yield srv


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[UvicornThread]:
    with tools_server(tmp_path_factory.mktemp("tools")) as srv:
        yield srv
