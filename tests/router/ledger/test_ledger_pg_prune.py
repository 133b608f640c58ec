"""Idle end users' counters on PostgreSQL: pruned, and never at the cost of a budget.

A client names a new end user with every request (`user`), and each is a limit subject of its
own (`limit_keys`, `key_spend`, rate and token events). What must hold, on a real PostgreSQL: a
prune deletes exactly the rows no admission reads again (an idle user's: no request in the last
minute, nothing in flight, nothing spent this month; events past the window; past days' spend),
keeps a user who spent this month or has a request in flight, and, run over and over by another
replica while requests are admitted and settled, loses no spend: every user's budget holds to the
cent and its spend row equals its settled requests. A served replica prunes on its own, every
`ledger.prune_every_s`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from router.admission.limits import Reservation, SharedLimits, day_start, month_start
from router.admission.quota import Quota
from router.errors import QuotaError
from router.ledger.postgres import PostgresStore
from router.ledger.postgres_limits import _PRUNE_LOCK
from tests.support.accounting import running
from tests.support.control import control_config
from tests.support.fault_upstream import FaultUpstream
from tests.support.ledger import attempt, entry

pytestmark = pytest.mark.timeout(180)
DAY = 86400.0


def keep(now: float) -> tuple[float, float]:
    """What a replica keeps: yesterday's and last month's spend rows onward (SharedLimits.pruning)."""
    return day_start(now - DAY), month_start(now - DAY)


def user(name: str, **limits: float) -> Quota:
    return Quota("user", name, team="lab", **limits)  # type: ignore[arg-type]


def reservation(rid: str, name: str, usd: float) -> Reservation:
    return Reservation(rid, time.time(), "k", "auto", usd, 60.0, team="lab", user=name)


def settle(store: PostgresStore, rid: str, name: str, usd: float) -> float:
    """Settle the request at `usd` of generation (plus a tenth of it for verifying); its cost."""
    settled = replace(
        entry(rid, time.time(), key="k", attempts=(attempt(0, "small", cost=usd),)), team="lab", user=name
    )
    store.write(settled)
    return settled.cost_usd


def subjects(db: str, table: str, column: str = "key_id") -> set[str]:
    with psycopg.connect(db) as conn:
        return {r[0] for r in conn.execute(f"SELECT DISTINCT {column} FROM {table}")}


async def test_a_prune_drops_idle_users_and_keeps_the_rest(db: str) -> None:
    store = PostgresStore(db)
    store.open()
    limits = SharedLimits(store, hold_ttl_s=60.0, workers=2)
    try:
        rated = {n: user(n, usd_per_day=1.0, requests_per_minute=100, tokens_per_minute=10_000) for n in "abcd"}
        for i, (name, q) in enumerate(rated.items()):
            await limits.admit([q], replace(reservation(f"r{i}", name, 0.1), reserved_tokens=50), time.time())
        settle(store, "r0", "a", 0.0)  # a: settled at $0, idle once its events leave the window
        settle(store, "r1", "b", 0.25)  # b: spent this month
        settle(store, "r2", "c", 0.0)  # c: settled at $0 but asked again within the minute
        # d: still in flight (its pending row)
        now = time.time()
        with psycopg.connect(db) as conn:
            # the window passes for a, b and d (on the database's clock: their events are 3 minutes old)
            for table, column in (("rate_events", "key_id"), ("token_events", "subject")):
                conn.execute(f"UPDATE {table} SET ts = ts - 180 WHERE {column} <> 'user:lab:c'")
            # spend rows a replica no longer reads: last week's day and a month three months back
            conn.execute(
                "INSERT INTO key_spend (key_id, kind, start, usd) VALUES ('k', 'day', %s, 2.0), "
                "('team:lab', 'month', %s, 5.0), ('user:lab:b', 'day', %s, 1.0)",
                (day_start(now - 7 * DAY), month_start(now - 95 * DAY), day_start(now - DAY)),
            )
        done = store.prune(*keep(now))
        assert done["limit_keys"] == 1 and done["rate_events"] == 3 and done["token_events"] == 3
        assert subjects(db, "limit_keys") == {"user:lab:b", "user:lab:c", "user:lab:d"}
        spend = subjects(db, "key_spend")
        assert "user:lab:a" not in spend and "user:lab:c" not in spend  # $0 rows read as no row
        with psycopg.connect(db) as conn:
            left = conn.execute(
                "SELECT key_id, kind, start, usd FROM key_spend ORDER BY key_id, kind, start"
            ).fetchall()
        assert [s for k, kind, s, _ in left if (k, kind) == ("k", "day")] == [day_start(now)]  # last week's gone
        assert [s for k, kind, s, _ in left if (k, kind) == ("team:lab", "month")] == [month_start(now)]
        assert sorted(s for k, kind, s, _ in left if k == "user:lab:b" and kind == "day") == [
            day_start(now - DAY),  # yesterday's: a request settling late may still add to it
            day_start(now),
        ]
        # the user who spent keeps its budget: $0.25 spent, $0.70 more would pass $1
        with pytest.raises(QuotaError):
            await limits.admit([rated["b"]], reservation("r9", "b", 0.8), time.time())
        # the pruned user comes back as new, its counters from nothing
        await limits.admit([rated["a"]], reservation("r10", "a", 0.9), time.time())
        assert "user:lab:a" in subjects(db, "limit_keys")
        # nothing left to prune; and another replica pruning at once leaves it to the first
        assert not any(store.prune(*keep(now)).values())
        with psycopg.connect(db) as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PRUNE_LOCK,))
            assert store.prune(*keep(now)) == dict.fromkeys(
                ("rate_events", "token_events", "key_spend", "limit_keys"), 0
            )
    finally:
        limits.close()
        store.close()


async def test_a_round_prunes_batch_after_batch_while_batches_come_back_full(db: str) -> None:
    # one batch a round was a fixed rate (5,000 rows a table a minute), which a client naming a new
    # `user` on every request outruns: a round now goes on while a batch comes back full
    store = PostgresStore(db)
    store.open()
    limits = SharedLimits(store, hold_ttl_s=60.0, workers=2)
    try:
        with psycopg.connect(db) as conn:
            for i in range(25):
                conn.execute("INSERT INTO limit_keys (key_id) VALUES (%s) ON CONFLICT DO NOTHING", (f"user:lab:u{i}",))
                conn.execute(
                    "INSERT INTO rate_events (key_id, ts) VALUES (%s, extract(epoch from now()) - 600)",
                    (f"user:lab:u{i}",),
                )
        await limits._prune_round(batch=4, round_s=60.0)
        assert not {s for s in subjects(db, "limit_keys") if s.startswith("user:lab:u")}
        assert not {s for s in subjects(db, "rate_events") if s.startswith("user:lab:u")}
    finally:
        limits.close()
        store.close()


async def test_pruning_over_and_over_beside_admissions_loses_no_spend(db: str) -> None:
    # two replicas admit and settle for six users of budget $1 (requests reserve $0.15 and cost
    # $0.143, or $0 every other time, which leaves a $0 row a prune deletes) while a third replica
    # prunes in a loop: each user's admissions stop exactly where its budget says, and its spend
    # row is the sum of its settled requests
    stores = [PostgresStore(db, pool_size=8) for _ in range(3)]
    for s in stores:
        s.open()
    replicas = [SharedLimits(s, hold_ttl_s=60.0, workers=4) for s in stores[:2]]
    stop = threading.Event()
    prunes: list[dict[str, int]] = []

    def prune_loop() -> None:
        while not stop.is_set():
            prunes.append(stores[2].prune(*keep(time.time())))
            time.sleep(0.005)

    pruner = threading.Thread(target=prune_loop)
    pruner.start()
    try:
        names = [
            f"u{i}" for i in range(6)
        ]  # paying users; f0..f3 spend nothing, so a prune drops them between requests

        async def one_user(name: str) -> list[float]:
            charged: list[float] = []
            for j in range(30):
                rid = f"{name}-{j}"
                try:
                    await replicas[j % 2].admit(
                        [user(name, usd_per_day=1.0)], reservation(rid, name, 0.15), time.time()
                    )
                except QuotaError:
                    continue
                cost = 0.0 if j % 2 == 0 or name.startswith("f") else 0.13
                charged.append(await asyncio.to_thread(settle, stores[j % 2], rid, name, cost))
            return charged

        charged = await asyncio.gather(*(one_user(n) for n in names))
        free = await asyncio.gather(*(one_user(f"f{i}") for i in range(4)))
    finally:
        stop.set()
        pruner.join()
        for r in replicas:
            r.close()
        for s in stores:
            s.close()
    assert sum(p["limit_keys"] for p in prunes) > 0 and sum(p["key_spend"] for p in prunes) > 0  # it did prune
    with psycopg.connect(db) as conn:
        spent: dict[str, float] = dict(
            conn.execute("SELECT key_id, usd FROM key_spend WHERE kind = 'month'").fetchall()
        )
    for name, costs in zip(names, charged, strict=True):
        # every paid request is in the spend row, and the budget held: 6 paid ($0.858) and no 7th
        assert len([c for c in costs if c > 0]) == 6, (name, costs)
        assert spent[f"user:lab:{name}"] == pytest.approx(sum(costs))
    assert [len(costs) for costs in free] == [30] * 4  # each admitted every time, its lock row pruned or not


async def test_a_served_replica_prunes_on_its_own(db: str, tmp_path: Path) -> None:
    now = time.time()
    store = PostgresStore(db)
    store.open()  # the schema, then what a user idle for a week left behind
    store.close()
    with FaultUpstream() as up:
        cfg, _ = control_config(tmp_path, up.base_url, ledger=db)
        cfg.write_text(cfg.read_text().replace("[ledger]\n", "[ledger]\nprune_every_s = 0.2\n"))
        with psycopg.connect(db) as conn:
            conn.execute("INSERT INTO limit_keys (key_id) VALUES ('user:lab:gone')")
            conn.execute("INSERT INTO rate_events (key_id, ts) VALUES ('user:lab:gone', %s)", (now - 7 * DAY,))
            conn.execute(
                "INSERT INTO key_spend (key_id, kind, start, usd) VALUES ('user:lab:gone', 'day', %s, 0.5)",
                (day_start(now - 7 * DAY),),
            )
        async with running(cfg):
            deadline = time.monotonic() + 30
            while "user:lab:gone" in subjects(db, "limit_keys") and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
    assert "user:lab:gone" not in subjects(db, "limit_keys")
    assert not subjects(db, "rate_events") and "user:lab:gone" not in subjects(db, "key_spend")
