"""The dashboard's builds on threads of their own, bounded: one more than MAX_BUILDS is a 429 at
once, never a queue on the pool that admission, revocations and admin routes share."""

from __future__ import annotations

import asyncio
import threading

import pytest

from router.api import routes_ui
from router.errors import RateLimitError


async def test_builds_run_off_the_shared_pool_and_one_too_many_is_refused() -> None:
    release = threading.Event()
    names: list[str] = []

    def slow() -> str:
        names.append(threading.current_thread().name)
        release.wait(10)
        return "done"

    running = [asyncio.create_task(routes_ui._build(slow)) for _ in range(routes_ui.MAX_BUILDS)]
    while len(names) < routes_ui.MAX_BUILDS:
        await asyncio.sleep(0.01)
    with pytest.raises(RateLimitError):
        await routes_ui._build(slow)
    release.set()
    assert await asyncio.gather(*running) == ["done"] * routes_ui.MAX_BUILDS
    assert all(n.startswith("tierroute-ui") for n in names)
    assert await routes_ui._build(lambda: 1) == 1  # free again
