"""Three `tierroute serve` processes on one PostgreSQL, managed through the admin API of any one.

What must hold, checked from outside (HTTP to the replicas, SQL on the database): a key created on
one replica serves on the others within the documented bound (`server.keys_poll_s` plus 1 s: one
poll period, one reload, and room for a loaded machine); a key revoked on one is refused there at
once and everywhere within the bound; a team's budget lowered on one is enforced on the others
within it; a team's
daily budget over four keys holds under 300 concurrent requests spread over the replicas (every
request here costs at most its reservation, so the stated overshoot bound is zero); a key's token
rate is one window for all three; a key limited to `small` gets 403 for `large` and `auto` on
every replica; and the audit table holds every admin action, with no key or hash in it or in any
replica's log.

The tiers are a scripted OpenAI-compatible upstream, so the test measures the control plane, not
a model. Propagation is timed from the moment the admin call is sent (so the change's own
transaction counts against the bound) to each replica's first answer that shows the change,
polling every replica in turn; the measured times are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.control import ask, bearer, control_config, create_key
from tests.support.fault_upstream import FaultUpstream, delayed, ok
from tests.support.servers import serve_process

POLL_S = 0.5  # server.keys_poll_s here
BOUND_S = POLL_S + 1.0  # docs/keys.md's bound: keys_poll_s + 1 s (one poll period, one reload)
WAIT_S = 10.0  # how long a wait for something outside the bound may take (a fresh key before a burst)
TEAM_BUDGET = 2e-4  # the team's daily budget, tens of requests' real cost
TPM = 400  # the token-limited key's tokens per minute


def until(check: Callable[[], bool], deadline_s: float = WAIT_S) -> float:
    """Seconds until `check()` holds (polled every 50 ms); fails past the deadline."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > deadline_s:
            raise AssertionError(f"not within {deadline_s} s")
        time.sleep(0.05)
    return time.monotonic() - started


def propagated(urls: list[str], shows: Callable[[str], bool], since: float) -> dict[str, float]:
    """Seconds from `since` (a monotonic time) until each replica first `shows` the change, polling
    the replicas in turn so a slow one does not delay another's measure; fails past BOUND_S."""
    found: dict[str, float] = {}
    while len(found) < len(urls):
        for u in urls:
            if u not in found and shows(u):
                found[u] = time.monotonic() - since
        elapsed = time.monotonic() - since
        if elapsed > BOUND_S and len(found) < len(urls):
            late = [u for u in urls if u not in found]
            raise AssertionError(f"{late} did not show the change within {BOUND_S} s ({found})")
        time.sleep(0.02)
    assert max(found.values()) <= BOUND_S, found
    return found


def key_state(http: httpx.Client, key: str) -> Callable[[str], int]:
    """A replica's answer to this key, without generating: /v1/models authenticates as completions do."""
    return lambda u: http.get(f"{u}/v1/models", headers=bearer(key)).status_code


@contextlib.contextmanager
def replicas(cfg: Path, tmp: Path, n: int) -> Iterator[list[str]]:
    """n replicas, started at once (as behind a balancer), so the test waits for one start-up."""
    servers = [serve_process(cfg, log_path=tmp / f"serve{i}.log") for i in range(n)]
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(n) as pool:
        started = list(pool.map(lambda s: s.__enter__(), servers))
        for s in servers:
            stack.push(s.__exit__)
        yield [url for _, url, _ in started]


async def burst(urls: list[str], keys: list[str], n: int) -> list[httpx.Response]:
    """n requests at once, key and replica round-robin."""
    limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        body = {"model": "small", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
        return list(
            await asyncio.gather(
                *(
                    client.post(
                        f"{urls[i % len(urls)]}/v1/chat/completions", json=body, headers=bearer(keys[i % len(keys)])
                    )
                    for i in range(n)
                )
            )
        )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_three_replicas_share_keys_teams_and_limits_through_the_admin_api(tmp_path: Path, db: str) -> None:
    with FaultUpstream(default=delayed(0.02, ok())) as upstream:
        cfg, raw = control_config(tmp_path, upstream.base_url, ledger=db, poll_s=POLL_S)
        root = raw["root"]
        with replicas(cfg, tmp_path, 3) as urls, httpx.Client(timeout=60) as http:
            made: list[str] = []  # every key the admin API printed: none may appear in the audit or a log

            # ---- created on one replica, served by the others within the bound -----------------------
            sent = time.monotonic()
            new = create_key(http, urls[0], root, name="fresh")
            made.append(new["key"])
            assert ask(http, urls[0], new["key"]).status_code == 200  # at once where it was made
            seen = propagated(urls[1:], lambda u: key_state(http, new["key"])(u) == 200, sent)
            assert all(ask(http, u, new["key"]).status_code == 200 for u in urls[1:])  # and it generates
            print(f"a new key known on every replica after {max(seen.values()):.2f} s (poll {POLL_S} s)")

            # ---- revoked on one: refused there at once, everywhere within the bound -----------------
            sent = time.monotonic()
            r = http.post(f"{urls[1]}/admin/keys/fresh/revoke", headers=bearer(root))
            assert r.status_code == 200
            assert ask(http, urls[1], new["key"]).status_code == 401
            gone = propagated([urls[0], urls[2]], lambda u: ask(http, u, new["key"]).status_code == 401, sent)
            print(f"a revoked key refused on every replica after {max(gone.values()):.2f} s")

            # ---- a team's budget lowered on one: enforced on the others within the bound -------------
            r = http.post(f"{urls[2]}/admin/teams", json={"name": "paced"}, headers=bearer(root))
            assert r.status_code == 201
            paced = create_key(http, urls[2], root, name="paced0", team="paced")
            made.append(paced["key"])
            for u in urls:
                until(lambda u=u: ask(http, u, paced["key"]).status_code == 200)
            sent = time.monotonic()
            r = http.patch(f"{urls[2]}/admin/teams/paced", json={"usd_per_day": 1e-9}, headers=bearer(root))
            assert r.status_code == 200

            def over_budget(u: str) -> bool:
                r = ask(http, u, paced["key"])
                if r.status_code == 200:
                    return False
                assert r.status_code == 429 and r.headers["x-tierroute-limit"] == "team.usd_per_day", r.text
                return True

            assert over_budget(urls[2])  # at once where it was changed
            held = propagated(urls[:2], over_budget, sent)
            print(f"a lowered team budget enforced on every replica after {max(held.values()):.2f} s")

            # ---- a key limited to small: 403 for large and auto on every replica ---------------------
            small = create_key(http, urls[2], root, name="smallonly", models=["small"])
            made.append(small["key"])
            for u in urls:
                until(lambda u=u: ask(http, u, small["key"]).status_code == 200)
                for model in ("large", "auto"):
                    r = ask(http, u, small["key"], model=model)
                    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"

            # ---- a team budget over four keys, 300 concurrent requests on three replicas -------------
            r = http.post(f"{urls[0]}/admin/teams", json={"name": "shared", "usd_per_day": TEAM_BUDGET}, headers=bearer(root))  # fmt: skip
            assert r.status_code == 201
            team = [create_key(http, urls[i % 3], root, name=f"team{i}", team="shared")["key"] for i in range(4)]
            made += team
            for key in team:  # each key known to every replica before the burst
                for u in urls:
                    until(lambda u=u, key=key: http.get(f"{u}/v1/models", headers=bearer(key)).status_code == 200)
            outcomes = asyncio.run(burst(urls, team, 300))
            codes = [o.status_code for o in outcomes]
            assert set(codes) <= {200, 429}, set(codes)
            assert 0 < codes.count(200) < 300  # some served, then the team's budget refused the rest
            refused = [o for o in outcomes if o.status_code == 429]
            assert all(o.headers["x-tierroute-limit"] == "team.usd_per_day" for o in refused)
            assert all("team 'shared'" in o.json()["error"]["message"] for o in refused)
            with psycopg.connect(db) as conn:
                rows = conn.execute("SELECT cost_usd, team FROM requests WHERE key_id LIKE 'team%'").fetchall()
            assert len(rows) == codes.count(200) and {t for _, t in rows} == {"shared"}
            spent = math.fsum(c for c, _ in rows)
            assert spent <= TEAM_BUDGET  # never exceeded: the bound is zero when no cost passes its reservation
            sent = math.fsum(o.json()["tierroute"]["cost_usd"] for o in outcomes if o.status_code == 200)
            assert sent == pytest.approx(spent, abs=1e-12)
            spend = http.get(f"{urls[2]}/admin/teams/shared/spend", headers=bearer(root)).json()
            assert spend["usd_today"] == pytest.approx(spent, abs=1e-12)
            print(f"team budget ${TEAM_BUDGET}: {codes.count(200)} of 300 served, ${spent:.6f} spent")

            # ---- a token rate across replicas ---------------------------------------------------------
            tok = create_key(http, urls[1], root, name="tokens", tokens_per_minute=TPM)
            made.append(tok["key"])
            for u in urls:
                until(lambda u=u: http.get(f"{u}/v1/models", headers=bearer(tok["key"])).status_code == 200)
            served: list[dict[str, Any]] = []
            limited: list[httpx.Response] = []
            for i in range(60):  # one at a time, round-robin: each settles at its real count
                r = ask(http, urls[i % 3], tok["key"])
                if r.status_code == 200:
                    served.append(r.json())
                else:
                    assert r.status_code == 429, r.text
                    limited.append(r)
            both = asyncio.run(burst(urls, [tok["key"]], 30))  # and at once
            served += [r.json() for r in both if r.status_code == 200]
            limited += [r for r in both if r.status_code == 429]
            used = sum(s["usage"]["prompt_tokens"] + s["usage"]["completion_tokens"] for s in served)
            assert served and limited
            assert used <= TPM  # one window for all three (all of this runs well within a minute)
            assert all(r.json()["error"]["type"] == "tokens" for r in limited)
            assert all(r.headers["x-tierroute-limit"] == "key.tokens_per_minute" for r in limited)
            assert {int(r.headers["retry-after"]) for r in limited} <= set(range(1, 61))
            print(f"tokens per minute {TPM}: {len(served)} served ({used} tokens), {len(limited)} refused")

            # ---- the audit: every admin action, no secret --------------------------------------------
            logs = " ".join((tmp_path / f"serve{i}.log").read_text(errors="replace") for i in range(3))
        with psycopg.connect(db) as conn:
            audit = conn.execute("SELECT actor, action, target, detail FROM audit ORDER BY ts").fetchall()
            hashes = [h for (h,) in conn.execute("SELECT hash FROM api_keys")]
    actions = [(actor, action, target) for actor, action, target, _ in audit]
    assert actions == [
        ("config", "key.import", "root"),
        ("root", "key.create", "fresh"),
        ("root", "key.revoke", "fresh"),
        ("root", "team.create", "paced"),
        ("root", "key.create", "paced0"),
        ("root", "team.update", "paced"),
        ("root", "key.create", "smallonly"),
        ("root", "team.create", "shared"),
        *(("root", "key.create", f"team{i}") for i in range(4)),
        ("root", "key.create", "tokens"),
    ]
    text = " ".join(" ".join(map(str, row)) for row in audit)
    for secret in [*made, *raw.values(), *hashes]:
        assert secret not in text and secret not in logs
