"""What the dashboard reads: the ledger's rows of a window, and the budgets with their spend.

The ledger is opened read-only for each page, on the worker thread that asks (a SQLite connection
belongs to the thread that made it; WAL lets it read while the service writes), and read through
the store's own `entries`, `pairs` and `feedback`, the calls `tierroute report` makes, over the
`ts` index. Budgets come from the control plane (`router.control.admin.ControlPlane.spend`, what
GET /admin/keys/NAME/spend answers), for the keys and teams that have a USD budget.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from router.config import Settings
from router.control.admin import ControlPlane
from router.control.records import Limits
from router.dashboard.figures import Window
from router.errors import RequestError
from router.ledger.entries import Feedback, LedgerEntry, LedgerStore, ShadowPair
from router.ledger.stores import open_store
from router.reports.costs import parse_time

LATEST_AHEAD_S = 366 * 86400.0  # the latest time a window may name: a year ahead


def window(since: str | None, until: str | None, default_since: str = "7d") -> Window:
    """The page's window from its query (`since`, `until`: the report's forms, '7d', an ISO date,
    'today'; `since=all` for all time), refused with a 400 that names the parameter."""
    found: list[float | None] = []
    for name, text in (("since", since if since is not None else default_since), ("until", until)):
        if text is None or (name == "since" and text == "all"):
            found.append(None)
            continue
        try:
            at = parse_time(text[:64])
        except (ValueError, OverflowError) as exc:
            raise RequestError(str(exc), param=name, code="invalid_window") from None
        if not 0.0 <= at <= time.time() + LATEST_AHEAD_S:  # before anything is read: a time gmtime can format
            raise RequestError(f"{name}: a time from 1970 to a year ahead", param=name, code="invalid_window")
        found.append(at)
    return Window(found[0], found[1])


@contextmanager
def ledger(settings: Settings) -> Iterator[LedgerStore]:
    if not settings.ledger.enabled:
        raise RequestError("The dashboard reads the ledger: ledger.enabled is false.", code="no_ledger")
    store = open_store(settings.ledger.location, read_only=True, settings=settings.ledger)
    store.open()
    try:
        yield store
    finally:
        store.close()


def entries(settings: Settings, w: Window) -> list[LedgerEntry]:
    with ledger(settings) as store:
        return list(store.entries(w.since, w.until))


def quality_rows(settings: Settings, w: Window) -> tuple[list[LedgerEntry], list[ShadowPair], list[Feedback]]:
    """The requests, shadow pairs and labels `report quality` reads for the window (a label comes
    after its request: those of the window's requests are at or after `since`)."""
    with ledger(settings) as store:
        return list(store.entries(w.since, w.until)), list(store.pairs(w.since, w.until)), list(store.feedback(w.since))


def budgets(plane: ControlPlane | None) -> list[dict[str, Any]]:
    """Each key and team with a USD budget: its limits and its spend today and this month."""
    if plane is None:
        return []
    snapshot = plane.store.snapshot()
    found = []
    for k in sorted(snapshot.keys.values(), key=lambda k: k.name):
        if k.revoked_at is None and (k.limits.usd_per_day is not None or k.limits.usd_per_month is not None):
            found.append(
                {"kind": "key", "name": k.name, "team": k.team, **k.limits.as_dict(), **plane.spend(key=k.name)}
            )
    for t in plane.teams():
        if t.limits.usd_per_day is not None or t.limits.usd_per_month is not None:
            found.append(
                {"kind": "team", "name": t.name, "team": t.name, **t.limits.as_dict(), **plane.spend(team=t.name)}
            )
    return found


def _budgeted(limits: Limits) -> bool:
    return limits.usd_per_day is not None or limits.usd_per_month is not None
