"""The PostgreSQL ledger on a real PostgreSQL server: the same records as the SQLite store,
versioned migrations, budgets and rate limits that two replicas (two stores on one database)
share, reservations that expire, and a 503 when the database is gone."""

from __future__ import annotations

import asyncio
import csv
import io
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest

from router.admission.limits import Reservation, SharedLimits
from router.config import ApiKeyEntry, load_settings
from router.errors import ConfigError, QuotaError, RateLimitError, UnavailableError
from router.ledger import schema
from router.ledger.entries import DuplicateEntry, Feedback, LabelCount, PendingEntry, ShadowPair
from router.ledger.postgres import PostgresStore
from router.ledger.postgres_migrations import MIGRATIONS
from router.ledger.store import SQLiteStore
from router.ledger.stores import open_store
from tests.support.accounting import auth, chat, config_with_keys, running, tierroute_of
from tests.support.ledger import attempt, entry
from tests.support.servers import TIERROUTE

if TYPE_CHECKING:
    from tests.support.pg import PostgresServer


@pytest.fixture
def store(db: str) -> Iterator[PostgresStore]:
    s = PostgresStore(db)
    s.open()
    yield s
    s.close()


def pg_config(cfg: Path, url: str) -> Path:
    """A test config with its ledger moved to PostgreSQL."""
    cfg.write_text(cfg.read_text().replace("[ledger]\n", f'[ledger]\nurl = "{url}"\n', 1))
    return cfg


def pair(rid: str, ts: float) -> ShadowPair:
    return ShadowPair(
        rid, f"{rid}-shadow", ts, "small", "large", "math", 0.8, 0.5, {"v": 0.8}, True, "number",
        "equal", "4", "4", "p" * 64, "a" * 64, "s" * 64, 1e-5,
    )  # fmt: skip


# ---- the store ----------------------------------------------------------------------------------


def test_records_read_back_exactly_as_the_sqlite_store_reads_them(store: PostgresStore, tmp_path: Path) -> None:
    lite = SQLiteStore(tmp_path / "l.sqlite3")
    lite.open()
    written = [entry("r1", 1.0), entry("r2", 2.0, key="bob", attempts=(attempt(0, "small"),))]
    written[1] = written[1].__class__(**{**written[1].to_dict(), "attempts": written[1].attempts, "user": "end-7"})
    labels = [
        Feedback("fb-1", "r1", 4.0, "alice", 1.0),
        Feedback("fb-2", "r2", 4.0, "bob", 0.0, label="thumbs_down", comment="wrong unit"),
        Feedback("fb-3", "r2", 5.0, "bob", 0.75, label="partly"),
    ]
    for s in (store, lite):
        s.begin(PendingEntry("r1", 1.0, "alice", "auto", 0.5))
        s.begin(PendingEntry("r9", 1.5, "alice", "auto", 0.25))
        for e in written:
            s.write(e)
        s.write_pair(pair("r1", 3.0))
        s.write_pair(pair("r1", 3.0))  # a second pair for a request replaces the first
        for fb in labels:
            s.write_feedback(fb)
    assert list(store.entries()) == list(lite.entries()) == written
    assert store.entry("r2") == lite.entry("r2") == written[1] and store.entry("r3") is None
    # several labels of one request, in the order received, the same from either store
    assert list(store.feedback()) == list(lite.feedback()) == labels
    assert list(store.feedback(request_id="r2")) == list(lite.feedback(request_id="r2")) == labels[1:]
    assert list(store.feedback(since=4.5, request_id="r2")) == labels[2:]
    with pytest.raises(DuplicateEntry):
        store.write_feedback(labels[0])
    with pytest.raises(psycopg.errors.ForeignKeyViolation):  # no label without its request
        store.write_feedback(Feedback("fb-x", "nope", 9.0, "alice", 1.0))
    assert list(store.entries(since=1.5)) == written[1:]
    assert list(store.pairs()) == list(lite.pairs()) == [pair("r1", 3.0)]
    assert [p.request_id for p in store.pending()] == ["r9"]  # r1's row replaced its pending row
    assert store.spend_by_key(0.0) == pytest.approx(lite.spend_by_key(0.0))
    assert list(store.entries())[1].user == "end-7"
    with pytest.raises(DuplicateEntry):
        store.write(written[0])
    with pytest.raises(sqlite3.IntegrityError):
        lite.write(written[0])
    lite.close()


def test_labels_raced_from_two_replicas_stop_at_the_cap(store: PostgresStore, db: str) -> None:
    # the count and the insert share one transaction holding the request's row: 40 labels sent
    # at once through two stores (two replicas) leave exactly the cap, and each saw a distinct count
    other = PostgresStore(db)
    other.open()
    store.write(entry("raced", 1.0))
    seen: list[int] = []
    barrier = threading.Barrier(40)

    def send(i: int) -> None:
        barrier.wait()
        s = store if i % 2 else other
        seen.append(s.write_feedback(Feedback(f"fb-race-{i}", "raced", 2.0 + i, "alice", 1.0), limit=10).giver)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other.close()
    assert len(list(store.feedback(request_id="raced"))) == 10
    assert sorted(seen)[:10] == list(range(10)) and all(n == 10 for n in sorted(seen)[10:])
    # the cap is per giver: a reviewer's label still lands beside the client's ten
    reviewed = Feedback("fb-root", "raced", 99.0, "root", 0.0, role="admin")
    assert store.write_feedback(reviewed, limit=10) == LabelCount(request=10, giver=0)
    assert [f.key_id for f in store.feedback(request_id="raced")].count("root") == 1


def test_migrations_are_versioned_applied_once_and_by_one_replica_at_a_time(db: str) -> None:
    stores = [PostgresStore(db) for _ in range(4)]
    threads = [threading.Thread(target=s.open) for s in stores]  # replicas starting together
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(v for s in stores for v in s.migrated) == [v for v, _, _ in MIGRATIONS]
    with psycopg.connect(db) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
        columns = {
            r[0]
            for r in conn.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'requests'")
        }
    assert versions == list(range(1, schema.latest("postgres") + 1)) and "user" in columns
    for s in stores:
        s.close()
    out = subprocess.run(
        [TIERROUTE, "ledger", "migrate", "--ledger", db], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "none (up to date)" in out and f"schema version {schema.latest('postgres')}" in out


@pytest.mark.slow
def test_a_sqlite_ledger_of_schema_4_gains_the_user_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    s = SQLiteStore(path)
    s.open()
    s.write(entry("r1", 1.0))
    s.close()
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE requests DROP COLUMN user")
    ro = SQLiteStore(path, read_only=True)  # a report on the old file reads `user` as NULL
    ro.open()
    assert [e.user for e in ro.entries()] == [None]
    ro.close()
    out = subprocess.run([TIERROUTE, "ledger", "migrate", "--ledger", f"sqlite:{path}"], capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
    assert f"schema version {schema.latest('sqlite')}" in out
    with sqlite3.connect(path) as conn:
        assert "user" in {r[1] for r in conn.execute("PRAGMA table_info(requests)")}


def _pg_catalog(url: str) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """A database's columns (table, column, type, nullable) and constraints and indexes, by name."""
    with psycopg.connect(url) as conn:
        columns = conn.execute(
            "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text "
            "FROM information_schema.columns WHERE table_schema = 'public' AND table_name <> 'schema_migrations' "
            "ORDER BY table_name, ordinal_position"
        ).fetchall()
        keys = conn.execute(
            "SELECT conrelid::regclass::text, conname::text, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE connamespace = 'public'::regnamespace AND conrelid::regclass::text <> 'schema_migrations' "
            "UNION ALL SELECT tablename::text, indexname::text, indexdef FROM pg_indexes "
            "WHERE schemaname = 'public' AND tablename <> 'schema_migrations' ORDER BY 1, 2, 3"
        ).fetchall()
    return [tuple(r) for r in columns], [tuple(r) for r in keys]


def test_a_migrated_database_is_the_description_and_has_the_sqlite_files_columns(
    db: str, pg: PostgresServer, tmp_path: Path
) -> None:
    store = PostgresStore(db)
    store.open()  # the released migrations, as they were written
    store.close()
    whole = pg.create_database()
    with psycopg.connect(whole) as conn:
        conn.execute(schema.postgres_ddl())  # the description's schema, in one script
    columns, keys = _pg_catalog(db)
    assert (columns, keys) == _pg_catalog(whole)
    assert any(name == "attempts_request_id_fkey" for _, name, _ in keys)  # constraints compared too
    lite = SQLiteStore(tmp_path / "l.sqlite3")
    lite.open()
    lite.close()
    kinds = {"text": "TEXT", "double precision": "REAL", "integer": "INTEGER"}
    with sqlite3.connect(tmp_path / "l.sqlite3") as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name <> 'meta'")]
        in_sqlite = {
            (t, col, kind, "YES" if not notnull and not pk else "NO")
            for t in tables
            for _, col, kind, notnull, _, pk in conn.execute(f"PRAGMA table_info({t})")
        }
    in_postgres = {(t, col, kinds[kind], null) for t, col, kind, null in columns if t in tables}
    # the same tables and columns, but PostgreSQL's own (the shared limits, a reservation's expiry)
    assert in_postgres - in_sqlite == {("pending", "expires_at", "REAL", "NO")}
    assert in_sqlite == in_postgres - {("pending", "expires_at", "REAL", "NO")}
    assert {t for t, *_ in columns} - set(tables) == {"limit_keys", "key_spend", "rate_events", "token_events"}


def test_credentials_never_in_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, _ = config_with_keys(tmp_path, {"k": {}}, large="none")
    pg_config(cfg, "postgresql://router:hunter2@db.internal:5432/ledger")
    with pytest.raises(ConfigError, match="must not carry a password.*password_env"):
        load_settings(cfg)
    cfg.write_text(cfg.read_text().replace("router:hunter2@", "router@").replace("[ledger]\n", '[ledger]\npassword_env = "TR_PG_TEST_PW"\n', 1))  # fmt: skip
    settings = load_settings(cfg)
    monkeypatch.delenv("TR_PG_TEST_PW", raising=False)
    with pytest.raises(ConfigError, match="TR_PG_TEST_PW is not set"):
        open_store(settings.ledger.location, settings=settings.ledger)
    monkeypatch.setenv("TR_PG_TEST_PW", "hunter2")
    unreachable = open_store(
        settings.ledger.location, settings=settings.ledger.model_copy(update={"connect_timeout_s": 1.0})
    )
    with pytest.raises(ConfigError, match="ledger.url: cannot open") as err:
        unreachable.open()
    assert "hunter2" not in str(err.value)


# ---- limits shared by replicas ------------------------------------------------------------------


def _replicas(db: str, n: int, *, ttl: float = 60.0, **limits: float | int) -> tuple[list[SharedLimits], ApiKeyEntry]:
    key = ApiKeyEntry(name="k", hash="sha256$" + "0" * 64, **limits)  # type: ignore[arg-type]
    out = []
    for _ in range(n):
        s = PostgresStore(db)
        s.open()
        out.append(SharedLimits(s, [key], hold_ttl_s=ttl, workers=4))
    return out, key


def _close(replicas: list[SharedLimits]) -> None:
    for r in replicas:
        r.close()
        r.counter.close()  # type: ignore[attr-defined]


def _reservation(i: int, usd: float, ttl: float = 60.0) -> Reservation:
    return Reservation(f"r{i}", time.time(), "k", "auto", usd, ttl)


async def _try(r: SharedLimits, key: ApiKeyEntry, res: Reservation) -> str:
    try:
        await r.admit(key, res, time.time())
    except QuotaError:
        return "quota"
    except RateLimitError:
        return "rate"
    return "ok"


async def test_a_budget_holds_across_replicas_under_a_concurrent_burst(db: str) -> None:
    replicas, key = _replicas(db, 3, usd_per_day=1.0)
    try:
        # 30 requests of $0.15 at once, spread over three replicas: six fit in $1, never seven
        outcomes = await asyncio.gather(*(_try(replicas[i % 3], key, _reservation(i, 0.15)) for i in range(30)))
        assert outcomes.count("ok") == 6 and outcomes.count("quota") == 24
        store = replicas[0].counter
        assert isinstance(store, PostgresStore)
        assert store.live_reservations() == {"k": pytest.approx(0.9)}
        # settling one at its (smaller) cost frees the rest of its reservation for the others
        first = next(i for i, o in enumerate(outcomes) if o == "ok")
        store.write(entry(f"r{first}", time.time(), key="k", attempts=(attempt(0, "small", cost=0.05),)))
        assert await _try(replicas[1], key, _reservation(100, 0.15)) == "ok"
        assert await _try(replicas[2], key, _reservation(101, 0.15)) == "quota"
        replicas[1].drop("r100")  # a request that ended without a record gives its reservation back
        await asyncio.sleep(0.5)
        assert await _try(replicas[2], key, _reservation(102, 0.15)) == "ok"
    finally:
        _close(replicas)


async def test_a_rate_limit_is_one_window_for_every_replica(db: str) -> None:
    replicas, key = _replicas(db, 3, requests_per_minute=5)
    try:
        outcomes = await asyncio.gather(*(_try(replicas[i % 3], key, _reservation(i, 0.0)) for i in range(12)))
        assert outcomes.count("ok") == 5 and outcomes.count("rate") == 7
        with pytest.raises(RateLimitError) as err:
            await replicas[0].admit(key, _reservation(50, 0.0), time.time())
        assert 50 <= err.value.retry_after <= 60  # type: ignore[attr-defined]
    finally:
        _close(replicas)


async def test_a_reservation_stops_counting_at_its_expiry(db: str) -> None:
    replicas, key = _replicas(db, 2, usd_per_day=1.0)
    try:
        # a replica admits and then dies: its reservation is never settled nor dropped
        assert await _try(replicas[0], key, _reservation(1, 0.9, ttl=1.0)) == "ok"
        assert await _try(replicas[1], key, _reservation(2, 0.9)) == "quota"
        await asyncio.sleep(1.2)
        assert await _try(replicas[1], key, _reservation(3, 0.9)) == "ok"
        store = replicas[1].counter
        assert isinstance(store, PostgresStore)
        assert store.live_reservations() == {"k": pytest.approx(0.9)}
    finally:
        _close(replicas)


async def test_a_lost_database_refuses_new_work_with_503(
    pg: PostgresServer, db: str, smol_path: Path, tmp_path: Path
) -> None:
    cfg, keys = config_with_keys(tmp_path, {"k": {"usd_per_day": 5.0}, "free": {}}, large="none")
    cfg.write_text(cfg.read_text().replace("[ledger]\n", f'[ledger]\nurl = "{db}"\nconnect_timeout_s = 1.0\n', 1))
    async with running(cfg) as client:
        ok = await client.post("/v1/chat/completions", json={**chat("Hi.", max_tokens=4), "user": "u-42"}, headers=auth(keys["k"]))  # fmt: skip
        assert ok.status_code == 200
        # a stream of a limited key: admitted through the database (its pending row), then settled
        streamed = await client.post("/v1/chat/completions", json=chat("Hi.", max_tokens=4, stream=True), headers=auth(keys["k"]))  # fmt: skip
        ext = tierroute_of(streamed.text, stream=True)
        assert streamed.status_code == 200 and ext is not None
        name = db.rsplit("/", 1)[1]
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false")
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        try:
            for stream in (False, True):
                r = await client.post("/v1/chat/completions", json=chat("Hi.", max_tokens=4, stream=stream), headers=auth(keys["k"]))  # fmt: skip
                assert r.status_code == 503, r.text
                assert r.json()["error"]["type"] in ("server_error", "service_unavailable")
                assert "retry-after" in r.headers
            # a key without limits is not admitted through the database: its record cannot be written
            free = await client.post("/v1/chat/completions", json=chat("Hi.", max_tokens=4), headers=auth(keys["free"]))
            assert free.status_code == 503 and free.json()["error"]["code"] == "service_unavailable"
        finally:
            with psycopg.connect(pg.url(), autocommit=True) as conn:
                conn.execute(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true")
        # it recovers by itself once the database answers (the pool reconnects with a backoff)
        deadline = time.monotonic() + 30
        while True:
            back = await client.post("/v1/chat/completions", json=chat("Hi.", max_tokens=4), headers=auth(keys["k"]))
            if back.status_code != 503 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert back.status_code == 200
    store = PostgresStore(db, read_only=True)
    store.open()
    rows = list(store.entries())
    pending = list(store.pending())
    store.close()
    assert [e.user for e in rows] == ["u-42", None, None, None]
    assert [e.key_id for e in rows] == ["k", "k", "free", "k"]
    # the free key's request was generated, then its record failed (503): kept in memory and
    # written by the first write that succeeded once the database was back
    assert [rows[i].request_id for i in (0, 1, 3)] == [ok.json()["id"], ext["request_id"], back.json()["id"]]
    assert rows[1].cost_usd == ext["cost_usd"]
    # nothing reserved is left: settled rows replaced their reservations, refused ones wrote none
    assert pending == []


def _report(*args: str) -> dict[str, dict[str, str]]:
    out = subprocess.run(
        [TIERROUTE, "report", "costs", "--format", "csv", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    reader = csv.DictReader(io.StringIO(out))
    group = reader.fieldnames[0]  # type: ignore[index]
    return {row[group]: row for row in reader}


def test_ledger_copy_from_sqlite_then_report_costs_reads_postgres(db: str, tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    lite = SQLiteStore(path)
    lite.open()
    for i in range(20):
        lite.write(entry(f"r{i}", 100.0 + i, key="alice" if i % 2 else "bob"))
    lite.write_pair(pair("r1", 130.0))
    labels = [
        Feedback("fb-1", "r1", 131.0, "alice", 0.0, label="thumbs_down"),
        Feedback("fb-2", "r1", 132.0, "alice", 1.0),
    ]
    for fb in labels:
        lite.write_feedback(fb)
    lite.begin(PendingEntry("p1", 140.0, "bob", "auto", 0.1))
    lite.close()
    copy = [TIERROUTE, "ledger", "copy", "--from", f"sqlite:{path}", "--to", db]
    out = subprocess.run(copy, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "copied 20 requests (0 already there), 1 shadow pairs, 2 feedback labels and 1 pending rows" in out
    again = subprocess.run(copy, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "copied 0 requests (20 already there)" in again  # an interrupted copy can be rerun
    assert "0 feedback labels" in again  # labels already there are not copied twice
    store = PostgresStore(db, read_only=True)
    store.open()
    try:
        assert list(store.feedback()) == labels
    finally:
        store.close()
    assert _report("--by", "key", "--ledger", db) == _report("--by", "key", "--ledger", str(path))


async def test_unavailable_is_what_an_unreachable_admission_raises(db: str) -> None:
    replicas, key = _replicas(db, 1, usd_per_day=1.0)
    store = replicas[0].counter
    assert isinstance(store, PostgresStore)
    store.close()  # no pool: every admission fails
    try:
        with pytest.raises(UnavailableError):
            await replicas[0].admit(key, _reservation(1, 0.1), time.time())
    finally:
        replicas[0].close()


async def test_feedback_through_the_app_on_postgresql(db: str, tmp_path: Path) -> None:
    # the route on the shared store: a key labels its own request, and only its own
    from router.backends.instant import InstantBackend

    cfg, keys = config_with_keys(tmp_path, {"alice": {}, "bob": {}})
    pg_config(cfg, db)
    backends = {"small": InstantBackend("small", "4"), "large": InstantBackend("large", "4")}
    async with running(cfg, backends=backends) as client:
        r = await client.post("/v1/chat/completions", json=chat("2+2?"), headers=auth(keys["alice"]))
        ext = tierroute_of(r.text, False)
        assert ext is not None
        rid = ext["request_id"]
        for score in (True, 0.25):
            ok = await client.post(
                "/v1/feedback", json={"request_id": rid, "score": score}, headers=auth(keys["alice"])
            )
            assert ok.status_code == 200, ok.text
        foreign = await client.post("/v1/feedback", json={"request_id": rid, "score": 1}, headers=auth(keys["bob"]))
        assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "request_not_found"
        nul = await client.post(
            "/v1/feedback", json={"request_id": rid, "score": 1, "comment": "a\x00b"}, headers=auth(keys["alice"])
        )
        assert nul.status_code == 400  # PostgreSQL's TEXT takes no NUL: refused before it gets there
    store = PostgresStore(db, read_only=True)
    store.open()
    try:
        assert [(f.request_id, f.key_id, f.score) for f in store.feedback()] == [
            (rid, "alice", 1.0),
            (rid, "alice", 0.25),
        ]
    finally:
        store.close()


async def test_a_row_the_database_refuses_for_good_is_not_kept_before_every_later_write(store: PostgresStore) -> None:
    # a NUL in text (here `user`) is refused by PostgreSQL for ever; kept for a retry, that row
    # stood before every later write and nothing behind it could ever be written
    from router.ledger.entries import LedgerEntry, RejectedEntry
    from router.ledger.writer import Ledger

    bad = entry("nul", 1.0)
    bad = LedgerEntry(**{**bad.to_dict(), "attempts": bad.attempts, "user": "a\x00b"})
    with pytest.raises(RejectedEntry):
        store.write(bad)
    ledger = Ledger(store)
    await ledger.open()
    try:
        with pytest.raises(RejectedEntry):
            await ledger.record(bad)
        await ledger.record(entry("after", 2.0))  # written, with nothing retried before it
        assert [e.request_id for e in store.entries()] == ["after"]
        assert ledger.healthy  # the last write succeeded
        assert not ledger._unsettled
    finally:
        await ledger.close()
