"""A key is checked before a body is parsed: a caller with no valid key costs the service a hash,
not a JSON parse of up to `server.max_body_bytes` (the outside review measured about 57 ms of
CPU per MB for every keyless request, twice parsed: by the body guard, then by FastAPI).

What must hold, from outside: a body the guard would refuse (NaN, a lone surrogate, invalid
UTF-8) sent without a key, or with a wrong or revoked one, is a 401, not the guard's 400 (which
proves it was never read as JSON); a revoked admin key so refused is still audited as the admin
API audits refusals; a valid key's bad body is the guard's 400 as before; a keyless server still
guards every body. And on a served process, keyless megabyte bodies cost a fraction of the CPU
that authenticated ones do (the figure is printed)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.accounting import running
from tests.support.config import write_config
from tests.support.control import TIER, bearer, control_config
from tests.support.fault_upstream import FaultUpstream
from tests.support.servers import serve_process

pytestmark = pytest.mark.timeout(300)

BAD_BODIES = (
    b'{"model": "small", "messages": [], "max_tokens": NaN}',
    b'{"model": "small", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"model": "small", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
)
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def upstream() -> Any:
    with FaultUpstream() as up:
        yield up


@pytest.fixture
async def keyed(tmp_path: Path, upstream: FaultUpstream) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    cfg, raw = control_config(tmp_path, upstream.base_url, ledger=str(tmp_path / "ledger.sqlite3"), keys={"ana": {}})
    async with running(cfg) as client:
        r = await client.post("/admin/keys", json={"name": "ops", "roles": ["admin"]}, headers=bearer(raw["root"]))
        raw["ops"] = r.json()["key"]
        assert (await client.post("/admin/keys/ops/revoke", headers=bearer(raw["root"]))).status_code == 200
        yield client, raw


async def test_a_body_from_a_caller_without_a_valid_key_is_never_parsed(
    keyed: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    client, raw = keyed
    for body in BAD_BODIES:
        for headers in ({}, bearer("trk-not-a-key"), bearer(raw["ops"])):
            r = await client.post("/v1/chat/completions", content=body, headers={**JSON, **headers})
            assert r.status_code == 401, (body, headers, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
        r = await client.post("/v1/chat/completions", content=body, headers={**JSON, **bearer(raw["ana"])})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_body", r.text  # the guard, as before
    # the admin API refuses a revoked admin key with its audit row, body or not
    r = await client.post("/admin/teams", content=BAD_BODIES[0], headers={**JSON, **bearer(raw["ops"])})
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    audit = (await client.get("/admin/audit", headers=bearer(raw["root"]))).json()["data"]
    refused = [a for a in audit if a["action"] == "admin.refused" and a["actor"] == "ops"]
    assert refused and refused[0]["target"] == "/admin/teams" and refused[0]["detail"]["reason"] == "revoked"


async def test_a_keyless_server_still_guards_every_body(tmp_path: Path, upstream: FaultUpstream) -> None:
    text = f'[server]\nallow_unauthenticated = true\n[ledger]\npath = "{tmp_path / "l.sqlite3"}"\n'
    cfg = write_config(
        tmp_path / "open.toml",
        text + TIER.format(name="small", base_url=upstream.base_url, price_in=0.1, price_out=0.4),
    )
    async with running(cfg) as client:
        for body in BAD_BODIES:
            r = await client.post("/v1/chat/completions", content=body, headers=JSON)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_body", r.text


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.slow
def test_keyless_megabytes_cost_the_served_process_a_fraction_of_a_parse(
    tmp_path: Path, upstream: FaultUpstream
) -> None:
    cfg, raw = control_config(tmp_path, upstream.base_url, ledger=str(tmp_path / "ledger.sqlite3"), keys={"ana": {}})
    # ~0.95 MB of small objects, the costly shape to parse, under server.max_body_bytes
    big = json.dumps(
        {"model": "small", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}] * 27_000}
    ).encode()
    n = 20
    with (
        serve_process(cfg, log_path=tmp_path / "serve.log", log_level="warning") as (proc, url, _),
        httpx.Client(timeout=120) as client,
    ):
        spent = {}
        for who, headers in (("no key", {}), ("wrong key", bearer("trk-not-a-key")), ("valid key", bearer(raw["ana"]))):
            time.sleep(0.5)  # let start-up and the last round's work settle
            before = _cpu_s(proc.pid)
            for _ in range(n):
                r = client.post(f"{url}/v1/chat/completions", content=big, headers={**JSON, **headers})
                assert r.status_code == (400 if who == "valid key" else 401), r.text[:300]
            spent[who] = (_cpu_s(proc.pid) - before) / n * 1000
    print(f"server CPU per {len(big) / 1e6:.2f} MB request: " + ", ".join(f"{k} {v:.1f} ms" for k, v in spent.items()))
    # a valid key's body is parsed (and refused for max_tokens = 0); a keyless one only read
    assert spent["no key"] < spent["valid key"] / 3 and spent["wrong key"] < spent["valid key"] / 3, spent
