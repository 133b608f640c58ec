"""The session's real vLLM server (tests/support/vllm_server.py), and the order its tests run in.

Every test here talks to one vLLM process, started once: its start is most of the time these tests
take. `TIERROUTE_TEST_VLLM_URL` and `TIERROUTE_TEST_VLLM_KEY` point them at a server already running
(started with scripts/vllm/env.sh), for working on the tests; the tests that kill the server then
skip, since it is not theirs to kill.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.vllm_server import ExternalVllm, VllmServer, cannot_run_here, missing_setup


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # the tests that kill vLLM run last, so the one server lasts the others through
    items.sort(key=lambda item: item.get_closest_marker("vllm") is not None and "kill" in item.name)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    why = cannot_run_here()
    if why is not None:
        pytest.skip(f"vLLM cannot run on this machine: {why}")
    if url := os.environ.get("TIERROUTE_TEST_VLLM_URL"):
        yield ExternalVllm(url, os.environ.get("TIERROUTE_TEST_VLLM_KEY", ""))
        return
    if (missing := missing_setup()) is not None:
        pytest.fail(missing)
    server = VllmServer(tmp_path_factory.mktemp("vllm"))
    try:
        yield server
    finally:
        server.stop()
        print(f"\nvLLM started {len(server.starts)} time(s): {', '.join(f'{s:.0f} s' for s in server.starts)}")


@pytest.fixture
def vllm(vllm_server: VllmServer) -> VllmServer:
    """The session's vLLM, up: started on first use, and again after a test killed it."""
    return vllm_server.ensure_up()
