"""Guessed keys against the older salted hashes, from outside: the scan they cost must not stall
the event loop that answers everyone else.

Keys made before digests were unsalted (every key of a database from before December 2026) are
still compared one by one with a key never presented before: 4 microseconds each, 20 ms a guess at
5,000 of them. The route dependencies became coroutines, and the scan with them ran on the event
loop: 16 clients sending random keys took /healthz from a 5 ms median to 935 ms against
`tierroute serve` (5,000 salted keys, a loaded 2-core machine); the scan now runs on one thread of
its own (router.admission.auth), and that median stays near 11 ms.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.admission import auth as auth_module
from router.admission.auth import Authenticator, hash_key, new_key
from router.config import ApiKeyEntry, ServerSettings
from router.control.records import config_snapshot
from router.errors import AuthError, OverloadedError
from tests.support.accounting import auth, running
from tests.support.control import control_config
from tests.support.fault_upstream import FaultUpstream
from tests.support.servers import serve_process

SALTED = 5000


def salted(key: str) -> str:
    return hash_key(key, secrets.token_hex(16))


def with_salted_keys(cfg: Path, n: int, valid: str) -> Path:
    """`cfg` with `n` more config keys in the older salted form, the last one 'valid' (`valid`)."""
    blocks = [f'[[server.api_keys]]\nname = "k{i}"\nhash = "{salted(new_key())}"\n' for i in range(n - 1)]
    blocks.append(f'[[server.api_keys]]\nname = "valid"\nhash = "{salted(valid)}"\n')
    cfg.write_text(cfg.read_text().replace("[ledger]", "".join(blocks) + "[ledger]"))
    return cfg


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    with FaultUpstream() as up:
        yield up


async def test_a_scan_of_salted_keys_never_runs_on_the_event_loop(
    tmp_path: Path, upstream: FaultUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    valid = new_key()
    cfg, _ = control_config(tmp_path, upstream.base_url, ledger=str(tmp_path / "ledger.sqlite3"))
    with_salted_keys(cfg, 20, valid)
    threads: list[str] = []
    real = auth_module._matches

    def recording(key: str, stored: str) -> bool:
        threads.append(threading.current_thread().name)
        return real(key, stored)

    monkeypatch.setattr(auth_module, "_matches", recording)
    async with running(cfg) as client:
        loop_thread = threading.current_thread().name
        # the admin API's check was a plain function: its scans ran on FastAPI's thread pool
        for path in ("/v1/models", "/metrics", "/admin/keys"):
            assert (await client.get(path, headers=auth(new_key()))).status_code == 401
        guess = await client.post("/v1/chat/completions", json={"model": "small"}, headers=auth(new_key()))
        assert guess.status_code == 401
        for _ in range(2):
            assert (await client.get("/v1/models", headers=auth(valid))).status_code == 200
        assert (await client.get("/admin/keys", headers=auth(valid))).status_code == 403
    # four guesses and the valid key scanned on the scanning thread; then the key's own hash
    assert [t.split("_")[0] for t in threads] == ["tierroute-key-scan"] * 5 * 20 + [loop_thread] * 2


def test_guesses_never_make_a_found_salted_key_scan_again(monkeypatch: pytest.MonkeyPatch, compared: list[str]) -> None:
    # the scan's memory was one map for guesses and found keys alike, emptied past SEEN_MAX
    # entries and at each new snapshot: a flood of distinct guesses (or any key change by an
    # admin) sent every salted key's owner back into the scan, behind the guesses
    monkeypatch.setattr(auth_module, "SEEN_MAX", 8)
    known = new_key()
    entries = [ApiKeyEntry(name=f"k{i}", hash=salted(new_key())) for i in range(30)]
    entries.append(ApiKeyEntry(name="known", hash=salted(known)))
    now = {"snapshot": config_snapshot(entries)}
    authenticator = Authenticator(ServerSettings(), keys=lambda: now["snapshot"])
    assert authenticator.authenticate(f"Bearer {known}").key_id == "known"
    for _ in range(50):
        with pytest.raises(AuthError):
            authenticator.authenticate(f"Bearer {new_key()}")
    now["snapshot"] = config_snapshot(entries)  # a new snapshot, the same keys
    compared.clear()
    assert authenticator.authenticate(f"Bearer {known}").key_id == "known"
    assert len(compared) == 1  # its own hash, checked again
    # gone from the snapshot: refused, and its memory with it
    now["snapshot"] = config_snapshot(entries[:-1])
    with pytest.raises(AuthError, match="Incorrect API key"):
        authenticator.authenticate(f"Bearer {known}")


async def _healthz(client: httpx.AsyncClient, until: float) -> list[float]:
    took = []
    while time.monotonic() < until:
        started = time.perf_counter()
        assert (await client.get("/healthz")).status_code == 200
        took.append(time.perf_counter() - started)
        await asyncio.sleep(0.02)
    return took


async def _guesses(client: httpx.AsyncClient, until: float, codes: list[int]) -> None:
    while time.monotonic() < until:
        codes.append((await client.get("/v1/models", headers=auth(new_key()))).status_code)


async def _flood(url: str, attackers: int, seconds: float, valid: str) -> dict[str, Any]:
    codes: list[int] = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        assert (await client.get("/v1/models", headers=auth(valid))).status_code == 200  # found once
        until = time.monotonic() + seconds
        took = (
            await asyncio.gather(_healthz(client, until), *(_guesses(client, until, codes) for _ in range(attackers)))
        )[0]
        assert took is not None
        started = time.perf_counter()
        assert (await client.get("/v1/models", headers=auth(valid))).status_code == 200
        valid_s = time.perf_counter() - started
    return {"healthz_p50_s": statistics.median(took), "guesses": codes, "valid_s": valid_s}


@pytest.mark.slow
def test_a_flood_of_guesses_leaves_healthz_answering_at_once(tmp_path: Path, upstream: FaultUpstream) -> None:
    valid = new_key()
    cfg, _ = control_config(tmp_path, upstream.base_url, ledger=str(tmp_path / "ledger.sqlite3"))
    with_salted_keys(cfg, SALTED, valid)
    with serve_process(cfg, log_path=tmp_path / "serve.log", log_level="warning") as (_, url, _):
        found = asyncio.run(_flood(url, attackers=8, seconds=3.0, valid=valid))
    # each guess is 5,000 salted hashes (about 20 ms here): on the event loop, /healthz waited
    # behind the guesses in flight (a 400-900 ms median with 8-16 clients guessing)
    assert found["guesses"] and set(found["guesses"]) == {401}
    assert found["healthz_p50_s"] < 0.15, found["healthz_p50_s"]
    assert found["valid_s"] < 1.0  # a salted key found before waits behind no scan


async def test_past_its_queue_a_key_that_needs_a_scan_gets_a_503_and_the_others_go_on() -> None:
    # the scanning thread does about 25 guesses a second at 10,000 salted keys: an unbounded queue
    # let a flood hold its connections open and put a salted key's first use behind a minute of them
    known, fresh, unsalted = new_key(), new_key(), new_key()
    entries = [ApiKeyEntry(name=f"k{i}", hash=salted(new_key())) for i in range(20)]
    entries += [
        ApiKeyEntry(name="known", hash=salted(known)),
        ApiKeyEntry(name="fresh", hash=salted(fresh)),
        ApiKeyEntry(name="new", hash=hash_key(unsalted)),
    ]
    authenticator = Authenticator(ServerSettings(api_keys=entries))
    try:
        assert (await authenticator.authenticate_async(f"Bearer {known}")).key_id == "known"  # scanned, found
        authenticator._queued = auth_module.SCAN_QUEUE_MAX  # as if that many guesses were waiting
        for needs_a_scan in (new_key(), fresh):
            with pytest.raises(OverloadedError) as refused:
                await authenticator.authenticate_async(f"Bearer {needs_a_scan}")
            assert refused.value.retry_after >= 1
        # what needs no scan is answered at once: a salted key found before, an unsalted one
        assert (await authenticator.authenticate_async(f"Bearer {known}")).key_id == "known"
        assert (await authenticator.authenticate_async(f"Bearer {unsalted}")).key_id == "new"
        authenticator._queued = 0
        assert (await authenticator.authenticate_async(f"Bearer {fresh}")).key_id == "fresh"
    finally:
        authenticator.close()


def test_a_miss_found_under_an_older_snapshot_is_not_remembered_under_a_newer_one() -> None:
    # the scan runs on its own thread with the snapshot it began with; if the loop moved to a newer
    # one meanwhile (which may hold a salted key with that digest), the miss must not carry over
    late = new_key()
    first = config_snapshot([ApiKeyEntry(name="k0", hash=salted(new_key()))])
    later = config_snapshot(
        [ApiKeyEntry(name="k0", hash=first.keys["k0"].hash), ApiKeyEntry(name="late", hash=salted(late))]
    )
    now = {"snapshot": first}
    authenticator = Authenticator(ServerSettings(), keys=lambda: now["snapshot"])
    authenticator._index_of(first)
    authenticator._index_of(later)  # the loop moved on before the scan of `first` ended
    assert authenticator._lookup(first, late) is None  # the scan of the older snapshot misses it
    now["snapshot"] = later
    assert authenticator.authenticate(f"Bearer {late}").key_id == "late"
