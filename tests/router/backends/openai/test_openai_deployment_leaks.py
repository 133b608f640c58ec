"""What a client is told when a tier's deployments are down, through the HTTP API against upstreams
that are not there (a port nothing listens on): the tier, and a deployment's name where the operator
gave one, never a deployment's address. The address goes to the log, where the operator reads it.

Found by the outside review: a tier of several deployments spoke as `tier large/127.0.0.1:PORT`
(an unnamed deployment's default name is its host and port), so every failure, breaker refusal and
broken stream showed clients where the upstreams live.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import httpx
import pytest

from tests.support.accounting import chat, running
from tests.support.config import write_config
from tests.support.fault_upstream import FaultUpstream
from tests.support.servers import dead_port


def _config(tmp_path: Path, deployments: list[tuple[int, str | None]] | int) -> Path:
    """A keyless server whose one tier `large` is `deployments` (a port and an optional name each),
    or one `base_url` at that port."""
    if isinstance(deployments, int):
        where = f'base_url = "http://127.0.0.1:{deployments}/v1"\n'
    else:
        where = "".join(
            f'[[tiers.openai.deployments]]\nbase_url = "http://127.0.0.1:{port}/v1"\n'
            + (f'name = "{name}"\n' if name else "")
            for port, name in deployments
        )
    text = (
        f'[server]\nallow_unauthenticated = true\n[ledger]\npath = "{tmp_path / "ledger.sqlite3"}"\n'
        '[[tiers]]\nname = "large"\nbackend = "openai"\nmax_tokens = 8\ntimeout_s = 5\n'
        "[tiers.price]\nusd_per_1m_input_tokens = 1.0\nusd_per_1m_output_tokens = 2.0\n"
        '[tiers.openai]\nmodel = "m"\nmax_attempts = 1\nbreaker_failures = 1\nbreaker_cooldown_s = 60\n'
        "backoff_initial_s = 0.01\nbackoff_max_s = 0.05\n" + where
    )
    return write_config(tmp_path / "config.toml", text)


async def _failures(cfg: Path) -> list[httpx.Response]:
    """A plain request, a streamed one, then one more of each once every breaker is open."""
    async with running(cfg) as client:
        got = []
        for _ in range(2):
            got.append(await client.post("/v1/chat/completions", json=chat("Hello?")))
            got.append(await client.post("/v1/chat/completions", json=chat("Hello?", stream=True)))
        return got


def _leaks(responses: list[httpx.Response], ports: list[int]) -> list[str]:
    said = [r.text for r in responses]
    return [s for s in said if "127.0.0.1" in s or "localhost" in s or any(str(p) in s for p in ports)]


@pytest.mark.parametrize("named", [False, True])
async def test_a_client_is_never_told_where_a_failed_deployment_lives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, named: bool
) -> None:
    ports = [dead_port(), dead_port()]
    names = ["eu", "us"] if named else [None, None]
    caplog.set_level(logging.WARNING)
    responses = await _failures(_config(tmp_path, list(zip(ports, names, strict=True))))
    assert [r.status_code >= 500 for r in responses] == [True] * 4, [r.text for r in responses]
    assert _leaks(responses, ports) == []
    messages = [r.json()["error"]["message"] for r in responses]
    assert all(m.startswith("tier large") for m in messages), messages
    if named:  # the operator's names may be said: they are what the operator chose to show
        assert any("large/eu" in m or "large/us" in m for m in messages), messages
    # the operator's log has the whole story, addresses included
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert all(f"127.0.0.1:{p}" in logged for p in ports), logged


async def test_a_single_base_url_is_not_told_either(tmp_path: Path) -> None:
    port = dead_port()
    responses = await _failures(_config(tmp_path, port))
    assert [r.status_code >= 500 for r in responses] == [True] * 4
    assert _leaks(responses, [port]) == []


@pytest.mark.parametrize("named", [False, True])
async def test_an_answer_names_its_deployment_without_its_address(
    tmp_path: Path, upstream: FaultUpstream, second: FaultUpstream, named: bool
) -> None:
    # an answer's `tierroute` object said which deployment answered by its default name, its
    # host:port; clients now see the operator's name or its place in the list, while the ledger
    # (and /metrics, for admin and metrics keys) keep the address
    dead = dead_port()
    names = ["eu", "us"] if named else [None, None]
    cfg = _config(tmp_path, [(dead, names[0]), (upstream.port, names[1])])
    async with running(cfg) as client:
        responses = [
            await client.post("/v1/chat/completions", json=chat("Hello?", stream=stream)) for stream in (False, True)
        ]
    assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
    assert _leaks(responses, [dead, upstream.port]) == []
    ext = responses[0].json()["tierroute"]
    shown = "us" if named else "#2"
    assert ext["deployment"] == shown and [a["deployment"] for a in ext["attempts"]] == [shown]
    assert f'"deployment": "{shown}"' in responses[1].text or f'"deployment":"{shown}"' in responses[1].text
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        kept = {row[0] for row in db.execute("SELECT deployment FROM requests")}
    assert kept == {"us" if named else f"127.0.0.1:{upstream.port}"}
