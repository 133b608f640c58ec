"""Bounded concurrency with a bounded wait: `Slots` lets `slots` holders in at once and `queue`
more wait; one more is refused at once with OverloadedError (503 with Retry-After) instead of
queueing without bound.

Two levels use it for sandboxed code (`code_tests`, `execution`): each verifier's own slots, and the
host's, one `Slots` per engine (`[sandbox]` in the config) that every such verifier on every tier
shares through its `VerifierContext`. Without the host's, each verifier instance on each tier ran
its own CPU count of boxes, so a mixed-traffic config of two tiers with both verifiers ran four
times the CPU count at once, each box allowed `max_procs * memory_mb` of memory and all of them
sharing uid 65534's process count. A holder takes its verifier's slot first and the host's second,
always in that order, so no two holders wait on each other.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from router.errors import OverloadedError

if TYPE_CHECKING:
    from router.config import SandboxSettings


class Slots:
    """`slots` holders at once, `queue` waiting; one more is refused (OverloadedError). One
    semaphore per event loop: an asyncio primitive belongs to the loop that first used it (tests
    and evals run several loops in one process)."""

    def __init__(self, owner: str, slots: int, queue: int) -> None:
        if slots < 1 or queue < 0:
            raise ValueError(f"{owner}: slots must be at least 1 and queue not negative")
        self.owner = owner
        self.slots = slots
        self.queue = queue
        self._per_loop: dict[asyncio.AbstractEventLoop, tuple[asyncio.Semaphore, list[int]]] = {}

    def _limit(self) -> tuple[asyncio.Semaphore, list[int]]:
        loop = asyncio.get_running_loop()
        got = self._per_loop.get(loop)
        if got is None:
            self._per_loop.clear()
            got = self._per_loop[loop] = (asyncio.Semaphore(self.slots), [0])
        return got

    @contextlib.asynccontextmanager
    async def hold(self, *, wait: bool = False) -> AsyncIterator[None]:
        """A slot for the block. `wait`: never refused, for a caller whose waiters are bounded
        elsewhere (shadow work, whose lanes have their own concurrency); such a waiter takes no
        place in the queue, so it never makes a client's run be refused."""
        sem, waiting = self._limit()
        if not wait and sem.locked() and waiting[0] >= self.queue:
            raise OverloadedError(f"{self.owner}: every sandbox is busy; retry later", retry_after=2.0)
        counted = 0 if wait else 1
        waiting[0] += counted
        try:
            await sem.acquire()
        finally:
            waiting[0] -= counted
        try:
            yield
        finally:
            sem.release()


@contextlib.asynccontextmanager
async def hold_all(*slots: Slots | None) -> AsyncIterator[None]:
    """Hold each of `slots` in the order given (None is no limit); refused by the first that is
    full, releasing what was held."""
    async with contextlib.AsyncExitStack() as stack:
        for s in slots:
            if s is not None:
                await stack.enter_async_context(s.hold())
        yield


def host_sandboxes(settings: SandboxSettings) -> Slots:
    """The host's sandbox slots for one engine or eval run (`[sandbox]`)."""
    return Slots("the host's sandboxes ([sandbox] max_concurrency)", settings.slots, settings.queue)


def verifier_slots(name: str, slots: int, max_queue: int) -> Slots:
    """A verifier's own sandbox slots: `max_queue` 0 is four waiting per slot."""
    return Slots(f"verifier '{name}'", slots, max_queue or 4 * slots)
