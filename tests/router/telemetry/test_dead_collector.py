"""From outside, a collector that accepts connections and never answers (a hung or black-holed
OTLP endpoint): requests are served as usual, and the app's shutdown waits for the last spans at
most `telemetry.export_timeout_s`, not the SDK's 30 s per shutdown (more than compose's 10 s
stop timeout and the systemd unit's 30 s, so every stop ended in SIGKILL)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.config import TelemetrySettings
from router.telemetry.setup import Tracing
from tests.support.accounting import chat, running
from tests.support.fault_upstream import FaultUpstream
from tests.support.telemetry import config


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A TCP listener that accepts and reads nothing back: its base URL."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


async def test_a_hung_collector_holds_shutdown_only_for_the_export_timeout(
    tmp_path: Path, black_hole: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a batch per span: each export waits its full timeout, as a full queue's four batches do
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
    tracing = Tracing.otlp(TelemetrySettings(endpoint=black_hole, export_timeout_s=1.0))
    with FaultUpstream() as upstream:
        cfg = config(tmp_path, upstream.base_url, server="allow_unauthenticated = true", small_verifiers="")
        async with running(cfg, tracing=tracing) as client:
            for _ in range(3):
                r = await client.post("/v1/chat/completions", json=chat("hello"))
                assert r.status_code == 200
            stopping = time.monotonic()
        stopped_s = time.monotonic() - stopping
    # 1 s allowed; the SDK alone takes 1 s per queued span here (15 or so). A wide margin for load
    assert stopped_s < 8.0, stopped_s
