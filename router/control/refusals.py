"""Refused admin attempts in the audit log, at a bounded rate, so a caller cannot fill it.

A known key that calls an `/admin/` route and is refused (a client key: 403; a revoked or expired
key: 401) is an event an operator wants to see: a leaked client key being tried against the admin
API. Each is recorded as action `admin.refused`, actor the key's name, target the route's template
(`/admin/keys/{name}`, never the path a caller filled in), and in `detail` the method, status and
reason; never the key presented, nor its hash.

Bounded: at most one row per key per minute on each replica. The refusals of that key in the rest
of the minute are counted, not written, and the key's next row carries them in
`detail.suppressed` ("METHOD /route STATUS" -> count); those still counted when the replica stops
are written then, in one row per key. So a key hammering the admin API adds one row a minute per
replica, and no attempt goes uncounted.

An unknown key (a guess, a typo) or no key at all gets no row: anyone can send those, so a row
each would let anyone fill the table. They are counted in `tierroute_admin_refused_total{reason}`
(reasons `no_key`, `unknown_key`, and for known keys `revoked`, `expired`, `not_admin`), which
/metrics shows to admin and metrics keys.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from router.control.store import ControlStore

log = logging.getLogger(__name__)

ACTION = "admin.refused"
EVERY_S = 60.0  # one row per key per this many seconds, per replica


class RefusalLog:
    """Refused admin attempts of this replica: audited per known key at a bounded rate, counted
    by reason. `note` blocks on the database at most once per key per `EVERY_S` (the admin dependency
    calls it for a known key in a worker thread); thread-safe."""

    def __init__(
        self,
        store: ControlStore | None,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store  # None: no ledger database (the admin API is off); counted only
        self.clock = clock
        self.refused = Counter(
            "tierroute_admin_refused",
            "Refused calls to the admin API, by reason (no_key, unknown_key, revoked, expired, not_admin).",
            ["reason"],
            registry=registry,
        )
        self._lock = threading.Lock()
        self._written: dict[str, float] = {}  # key -> when its last row was written (clock)
        self._pending: dict[str, dict[str, int]] = {}  # key -> refusals counted since that row

    def note(self, key: str | None, method: str, route: str, status: int, reason: str) -> None:
        """One refused attempt: `key` is the stored key's name, or None for no key or an unknown one."""
        self.refused.labels(reason).inc()
        if key is None or self.store is None:
            return
        now = self.clock()
        with self._lock:
            last = self._written.get(key)
            if last is not None and now - last < EVERY_S:
                counted = self._pending.setdefault(key, {})
                what = f"{method} {route} {status}"
                counted[what] = counted.get(what, 0) + 1
                return
            self._written[key] = now
            suppressed = self._pending.pop(key, {})
        detail: dict[str, Any] = {"method": method, "status": status, "reason": reason}
        if suppressed:
            detail["suppressed"] = suppressed
        self._write(key, route, detail)

    def flush(self) -> None:
        """Write what is still counted (at the replica's stop): one row per key, target '*'."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for key, suppressed in sorted(pending.items()):
            self._write(key, "*", {"suppressed": suppressed})

    def _write(self, key: str, target: str, detail: dict[str, Any]) -> None:
        if self.store is None:
            return
        try:
            self.store.note(key, ACTION, target, detail)
        except Exception as exc:  # noqa: BLE001 - the caller is refused either way; say it was not recorded
            log.warning("audit: a refused admin attempt by key '%s' was not recorded: %s", key, exc)
