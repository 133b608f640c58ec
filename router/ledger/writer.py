"""The ledger's writer thread: what the service talks to, so that no write blocks the event loop.

A `LedgerStore` (`router.ledger.entries`) is synchronous storage, one transaction per write, with
no knowledge of asyncio: `router.ledger.store.SQLiteStore` is the embedded default,
`router.ledger.postgres.PostgresStore` a database every replica shares, and
`router.ledger.stores.open_store` picks one from the config. `Ledger` owns one writer thread, and
every store call runs on it, so a write never blocks the event loop and the store's single
connection never crosses threads.

A plain request is written once, when its answer settles: its `requests` row and all its
`attempts` rows in one transaction, committed before any byte of the response is sent. A streamed
request's text leaves before its answer settles, so it is written twice: at admission a `pending`
row (the key, and the most the request can cost: its budget reservation) is written ahead, no
byte is sent before it is committed, and the settled rows replace it in one transaction before
the final chunk (the one with the cost) is sent. So there is no delivered answer without a row:
when the settling write fails (a full or failing disk), the pending row stands for the stream at
its worst-case cost, budgets count it at that cost (also after a restart), and the settled entry
is kept in memory and written as soon as a later write succeeds. While writes fail, every new
request gets a pending row first (see `router.admission.accounting`). A kill -9 leaves the pending rows of
the streams in flight, never a half request; the reverse can happen (a row committed, the
process killed before the bytes left), and such a row is a request the client never saw
completed.

The pending write runs on the writer thread while generation starts, so it costs a stream
nothing while the disk is healthy (a first token takes longer than a commit). Shadow pairs
(`router.quality.shadow`) are written through the same thread, best effort; so are feedback labels
(`router.api.routes_feedback`), whose client hears whether the write succeeded.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any, TypeVar

from router.ledger.entries import (
    CacheRow,
    DuplicateEntry,
    Feedback,
    LabelCount,
    LedgerEntry,
    LedgerStore,
    PendingEntry,
    RejectedEntry,
    ShadowPair,
)
from router.telemetry import context, spans

log = logging.getLogger(__name__)
T = TypeVar("T")

# settled entries whose write failed, kept for the next successful write; past this many the
# oldest is logged and dropped (its pending row still stands for it at its worst-case cost)
MAX_UNSETTLED = 10_000


class Ledger:
    """The async face of a store: every call runs on the ledger's own thread (one by default: in order).

    A settled entry whose write fails is kept (in memory) and written again before each later
    write: the pending row stands for it meanwhile. `healthy` says whether the last write
    succeeded; the service refuses to start new work on a ledger known to be failing until a write
    succeeds again.

    `writers` > 1 is for a store whose calls may run at once (PostgreSQL: each takes its own
    connection): a write that waits on the database server (a busy machine may not schedule it
    for milliseconds) then holds up no other request's write. The order that matters, a request's
    pending row before its settled row, is kept by the caller, which waits for the first before
    sending the second."""

    def __init__(self, store: LedgerStore, *, writers: int = 1) -> None:
        self.store = store
        self.writers = writers
        self._pool: ThreadPoolExecutor | None = None
        self._unsettled: collections.deque[LedgerEntry] = collections.deque()
        self._unsettled_lock = threading.Lock()
        self.healthy = True

    async def open(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.writers, thread_name_prefix="tierroute-ledger")
        await self._call(self.store.open)

    def begin(self, pending: PendingEntry) -> asyncio.Future[None]:
        """Write the pending row; the future is done once it is committed (or has failed)."""
        return self._submit(self._begin, pending)

    def drop_after(self, written: asyncio.Future[None], request_id: str) -> None:
        """Once its pending row's write is done, drop that row again: its request ended with
        nothing recorded and nothing spent (a tier refused it before any output). A row that
        cannot be dropped stands at its reservation, as a crashed request's does."""

        def then(done: asyncio.Future[None]) -> None:
            if done.cancelled() or done.exception() is not None or self._pool is None:
                return  # not written, or the ledger closed since: the row, if any, stands
            self._submit(self.store.drop, request_id).add_done_callback(_logged(request_id))

        written.add_done_callback(then)

    async def record(self, entry: LedgerEntry) -> None:
        """Return once the entry is committed; on failure it is kept for a later write."""
        # a span under the request's own (router.telemetry; a no-op when tracing is off)
        span = spans.start(
            "tierroute.ledger.write", context.request_span(), attributes={"tierroute.request_id": entry.request_id}
        )
        try:
            await self._call(self._write, entry)
        except BaseException as exc:
            spans.fail(span, exc)
            raise
        finally:
            span.end()

    @property
    def unsettled(self) -> int:
        """Settled entries waiting for the disk (their pending rows stand for them)."""
        return len(self._unsettled)

    async def spend_by_key(self, since: float) -> dict[str, float]:
        return await self._call(self.store.spend_by_key, since)

    async def entries(self, since: float | None = None, until: float | None = None) -> list[LedgerEntry]:
        return await self._call(lambda: list(self.store.entries(since, until)))

    async def pending(self) -> list[PendingEntry]:
        return await self._call(lambda: list(self.store.pending()))

    async def record_pair(self, pair: ShadowPair, entry: LedgerEntry | None = None) -> None:
        """Write a shadow pair, and with it the shadow generation's row (one write, so shadow work
        takes one turn of the writer thread that clients' records wait on). Best effort: a pair
        lost to a failing disk loses a sample and operator spend, not a client's record, so it is
        never kept for a retry nor marks the ledger unhealthy."""
        await self._call(self.store.write_pair, pair, entry)

    async def pairs(self, since: float | None = None, until: float | None = None) -> list[ShadowPair]:
        return await self._call(lambda: list(self.store.pairs(since, until)))

    async def entry(self, request_id: str) -> LedgerEntry | None:
        return await self._call(self.store.entry, request_id)

    async def record_feedback(self, feedback: Feedback, limit: int | None = None) -> LabelCount:
        """Write one label unless its giver gave the request `limit` already; how many it had
        before, all and the giver's. Not kept for a retry: the client hears the failure (503) and
        may send it again."""
        return await self._call(self.store.write_feedback, feedback, limit)

    async def feedback(
        self, since: float | None = None, until: float | None = None, request_id: str | None = None
    ) -> list[Feedback]:
        return await self._call(lambda: list(self.store.feedback(since, until, request_id)))

    async def cache_get(self, cache_key: str, scope: str, now: float) -> CacheRow | None:
        """The response cache's read (router.cache): on the ledger's thread, as every store call."""
        return await self._call(self.store.cache_get, cache_key, scope, now)

    async def cache_put(self, row: CacheRow, max_entries: int | None, max_per_scope: int | None = None) -> None:
        """Best effort, as shadow pairs: a lost entry costs a later generation, not a record, so it
        is never retried nor marks the ledger unhealthy."""
        await self._call(self.store.cache_put, row, max_entries, max_per_scope)

    async def cache_drop(self, cache_key: str) -> None:
        await self._call(self.store.cache_drop, cache_key)

    async def close(self) -> None:
        """Finish every queued write (and retry the unsettled ones once), then close the store."""
        pool = self._pool
        if pool is None:
            return
        try:
            await self._call(self._flush)
            for entry in self._unsettled:  # the log is all that is left of these
                log.error("ledger: never written (its pending row stands for it): %s", json.dumps(asdict(entry)))
            await self._call(self.store.close)
        finally:
            self._pool = None
            await asyncio.to_thread(pool.shutdown, wait=True)

    # -- on the writer thread --------------------------------------------------------------------

    def _begin(self, pending: PendingEntry) -> None:
        self._flush()
        self._guarded(self.store.begin, pending)

    def _write(self, entry: LedgerEntry) -> None:
        self._flush()
        try:
            self._guarded(self.store.write, entry)
        except (sqlite3.IntegrityError, DuplicateEntry):
            raise  # not the disk: writing it again would fail again
        except RejectedEntry:
            log.error("ledger: the store refuses this entry for good, not retried: %s", json.dumps(asdict(entry)))
            raise
        except Exception:
            with self._unsettled_lock:
                self._unsettled.append(entry)
                lost = self._unsettled.popleft() if len(self._unsettled) > MAX_UNSETTLED else None
            if lost is not None:
                log.error("ledger: too many unwritten entries; dropping %s", json.dumps(asdict(lost)))
            raise

    def _flush(self) -> None:
        while True:
            with self._unsettled_lock:  # taken out while written: another writer does not write it too
                if not self._unsettled:
                    return
                entry = self._unsettled.popleft()
            try:
                self._guarded(self.store.write, entry)
            except (sqlite3.IntegrityError, DuplicateEntry):
                continue  # already there
            except RejectedEntry:  # only a store that changed its mind since: never again
                log.error("ledger: the store refuses this entry for good, dropped: %s", json.dumps(asdict(entry)))
                continue
            except Exception as exc:  # noqa: BLE001 - still failing: keep them for the next write
                with self._unsettled_lock:
                    self._unsettled.appendleft(entry)
                    log.warning("ledger: %d entries still unwritten: %s", len(self._unsettled), exc)
                return

    def _guarded(self, fn: Callable[[T], None], arg: T) -> None:
        try:
            fn(arg)
        except Exception:
            self.healthy = False
            raise
        self.healthy = True

    def _submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        if self._pool is None:
            raise RuntimeError("ledger is not open")
        return asyncio.wrap_future(self._pool.submit(fn, *args))

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._submit(fn, *args)


def _logged(request_id: str) -> Callable[[asyncio.Future[None]], None]:
    def check(done: asyncio.Future[None]) -> None:
        if not done.cancelled() and done.exception() is not None:
            log.warning("ledger: pending row of %s not dropped: %s", request_id, done.exception())

    return check
