"""The cache's two moments in a request: the lookup before any work, the store after the answer.

`plan` decides, from the request alone, whether it is cacheable (deterministic, unless the
operator opts in to others), its key and scope, and what the client's `Cache-Control` allows.
`get` reads the entry through the ledger's thread and checks it (`router.cache.answer`); a row
that fails is answered as a miss and dropped, and a database that cannot be read is a miss too:
the cache can only ever cost a generation, never an answer. `offer` stores a settled answer in
the background, after its ledger row is committed and off the client's path; the store also
drops expired entries and, every `evict_every` stores, evicts the oldest past `max_entries`,
all replicas' together (so the table holds at most `max_entries` plus `evict_every` - 1 per
replica, `evict_every` being 1% of `max_entries`).

The global bound alone let one tenant flush every other's entries by sending many distinct
requests, so each tenant's scope also has its own share (`cache.max_entries_per_scope`): every
`scope_every` stores of one scope (1% of its share) evict that scope's oldest past the share,
and no one else's. So a tenant over its share evicts only itself; the global bound still evicts
the oldest of all when many tenants together fill the table.

Counted in /metrics: `tierroute_cache_lookups_total{result}` (hit, miss, invalid, error, bypass,
skip; a hit once it is served, so one refused by a rate limit is none) and
`tierroute_cache_stores_total{result}` (stored, truncated, unverified, too_large, error).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel

from router.admission.auth import Principal
from router.cache import answer, keys
from router.cache.answer import CachedAnswer, InvalidEntry
from router.cascade import CascadeResult
from router.config import Settings
from router.ledger.entries import CacheRow
from router.ledger.writer import Ledger

log = logging.getLogger(__name__)

SCOPES_COUNTED = 4096  # scopes whose stores a process counts (see `ResponseCache.scope_every`)


@dataclass(frozen=True)
class Lookup:
    """One request's place in the cache. `status` is what the client is told when it is not a
    hit: miss (looked up, not there), bypass (its Cache-Control said not to look), skip (not
    cacheable: sampled without a seed)."""

    status: str
    key: str | None  # None: not cacheable
    scope: str
    shape: str
    read: bool
    store: bool
    share: bool = False  # its scope is held to its own share of the entries (`keys.has_share`)


class ResponseCache:
    """The exact-match cache of one app: off unless `cache.enabled`."""

    def __init__(
        self,
        settings: Settings,
        ledger: Ledger | None,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings.cache
        self.ledger = ledger if settings.cache.enabled else None
        self.policy = keys.policy_version(settings)
        self.tiers = frozenset(t.name for t in settings.tiers)
        self.clock = clock
        # eviction walks the newest max_entries of the created index, so it runs once per 1% of
        # max_entries stores (every store below 100): a store costs O(100) index entries, not
        # O(max_entries), and a replica adds at most that many entries past the bound between two
        self.evict_every = max(1, settings.cache.max_entries // 100)
        self._puts = 0
        # the same per scope, against its share: each scope's stores counted in this process. A
        # scope forgotten past SCOPES_COUNTED starts again at 0, and a scope's count of 0 evicts,
        # so forgetting costs an extra walk, never a late one: a replica stores at most
        # `scope_every` - 1 entries of a scope past its share between two of its evictions
        self.scope_share = settings.cache.scope_share
        self.scope_every = max(1, self.scope_share // 100)
        self._scope_puts: OrderedDict[str, int] = OrderedDict()
        self._storing: set[asyncio.Task[None]] = set()
        self.lookups = Counter(
            "tierroute_cache_lookups",
            "Response cache lookups: hit, miss, invalid (a stored row failed its checks), error (the "
            "database could not be read), bypass (Cache-Control), skip (not cacheable).",
            ["result"],
            registry=registry,
        )
        self.stores = Counter(
            "tierroute_cache_stores",
            "Answers offered to the response cache: stored, or why not (truncated, unverified, too_large, error).",
            ["result"],
            registry=registry,
        )

    @property
    def enabled(self) -> bool:
        return self.ledger is not None

    def plan(self, body: BaseModel, shape: str, principal: Principal, cache_control: str | None) -> Lookup | None:
        """The request's lookup and store, or None when the cache is off."""
        if self.ledger is None:
            return None
        scope = keys.scope_of(principal, self.settings.scope)
        if not (self.settings.allow_nondeterministic or keys.deterministic(body)):
            self.lookups.labels("skip").inc()
            return Lookup("skip", None, scope, shape, read=False, store=False)
        read, store = keys.directives(cache_control)
        key = keys.cache_key(body, shape=shape, policy=self.policy, scope=scope, client_code=principal.may_send_tests)
        if not read:
            self.lookups.labels("bypass").inc()
        share = keys.has_share(principal, self.settings.scope)
        return Lookup("miss" if read else "bypass", key, scope, shape, read=read, store=store, share=share)

    async def get(self, lookup: Lookup) -> CachedAnswer | None:
        """The checked entry for this lookup, or None (a miss, whatever the reason)."""
        if self.ledger is None or lookup.key is None or not lookup.read:
            return None
        try:
            row = await self.ledger.cache_get(lookup.key, lookup.scope, self.clock())
        except Exception as exc:  # noqa: BLE001 - whatever the store raised, the request is served by generating
            self.lookups.labels("error").inc()
            log.warning("cache: lookup failed, answering by generating: %s", exc)
            return None
        if row is None:
            self.lookups.labels("miss").inc()
            return None
        try:
            found = answer.decode(
                row,
                cache_key=lookup.key,
                scope=lookup.scope,
                shape=lookup.shape,
                max_bytes=self.settings.max_entry_bytes,
                tiers=self.tiers,
            )
        except InvalidEntry as exc:
            self.lookups.labels("invalid").inc()
            log.warning("cache: entry %s refused (%s); dropped, answering by generating", lookup.key[:16], exc)
            self._background(self.ledger.cache_drop(lookup.key), "drop")
            return None
        return found  # counted as a hit once it is served (`served`): admission may still refuse it

    def served(self) -> None:
        """Count a hit that was admitted and answered (a 429 after the lookup is not a hit)."""
        self.lookups.labels("hit").inc()

    def offer(self, lookup: Lookup | None, payload: Mapping[str, Any], result: CascadeResult) -> None:
        """Store a settled answer in the background, unless it must not be stored."""
        if self.ledger is None or lookup is None or lookup.key is None or not lookup.store:
            return
        why = answer.unstorable(payload, result)
        body = answer.encode(lookup.shape, payload, result) if why is None else ""
        if why is None and len(body.encode("utf-8")) > self.settings.max_entry_bytes:
            why = "too_large"
        if why is not None:
            self.stores.labels(why).inc()
            return
        now = self.clock()
        row = CacheRow(
            cache_key=lookup.key,
            scope=lookup.scope,
            policy=self.policy,
            shape=lookup.shape,
            tier=result.final.tier,
            request_id=str(payload["id"]),
            created=now,
            expires_at=now + self.settings.ttl_s,
            size=len(body.encode("utf-8")),
            body=body,
            digest=answer.digest(lookup.key, lookup.scope, body),
        )
        self._puts += 1
        evict = self._puts % self.evict_every == 0
        own = self._scope_due(lookup.scope) if lookup.share else False
        self._background(
            self._put(row, self.settings.max_entries if evict else None, self.scope_share if own else None), "store"
        )

    def _scope_due(self, scope: str) -> bool:
        """Whether this store of `scope` evicts its oldest past its share (every `scope_every`)."""
        count = self._scope_puts.pop(scope, 0)
        self._scope_puts[scope] = count + 1  # the most recent last: the least recent is forgotten first
        if len(self._scope_puts) > SCOPES_COUNTED:
            self._scope_puts.popitem(last=False)
        return count % self.scope_every == 0

    async def _put(self, row: CacheRow, max_entries: int | None, max_per_scope: int | None) -> None:
        assert self.ledger is not None
        await self.ledger.cache_put(row, max_entries, max_per_scope)
        self.stores.labels("stored").inc()

    def _background(self, work: Any, what: str) -> None:
        task = asyncio.ensure_future(self._guard(work, what))
        self._storing.add(task)
        task.add_done_callback(self._storing.discard)

    async def _guard(self, work: Any, what: str) -> None:
        try:
            await work
        except Exception as exc:  # noqa: BLE001 - best effort: a lost entry costs a later generation only
            if what == "store":
                self.stores.labels("error").inc()
            log.warning("cache: %s failed: %s", what, exc)

    async def close(self) -> None:
        """Wait for the stores in flight (before the ledger closes)."""
        if self._storing:
            await asyncio.gather(*self._storing, return_exceptions=True)
