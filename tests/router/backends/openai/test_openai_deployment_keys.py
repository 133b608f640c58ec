"""A deployment whose key's environment variable is not set, through the HTTP API and `tierroute
serve`: the tier starts without it and serves from the others, loudly; a tier none of whose
deployments has its key refuses to start, naming each deployment and variable (docs/deployments.md).

Found by the outside review: one deployment's missing variable stopped the whole router at start,
every other tier and deployment with it.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from router.errors import ConfigError
from tests.support.accounting import chat, running
from tests.support.config import write_config
from tests.support.fault_upstream import FaultUpstream
from tests.support.metrics import samples, value
from tests.support.servers import TIERROUTE, free_port


def _config(tmp_path: Path, east: FaultUpstream, west: FaultUpstream) -> Path:
    text = (
        f'[server]\nallow_unauthenticated = true\n[ledger]\npath = "{tmp_path / "ledger.sqlite3"}"\n'
        '[[tiers]]\nname = "large"\nbackend = "openai"\nmax_tokens = 8\ntimeout_s = 10\n'
        "[tiers.price]\nusd_per_1m_input_tokens = 1.0\nusd_per_1m_output_tokens = 2.0\n"
        '[tiers.openai]\nmodel = "fake-large"\nmax_attempts = 1\nstrategy = "weighted_random"\n'
        f'[[tiers.openai.deployments]]\nbase_url = "{east.base_url}"\nname = "east"\napi_key_env = "TR_EAST_KEY"\n'
        f'[[tiers.openai.deployments]]\nbase_url = "{west.base_url}"\nname = "west"\napi_key_env = "TR_WEST_KEY"\n'
    )
    return write_config(tmp_path / "config.toml", text)


async def test_a_deployment_without_its_key_is_down_and_the_tier_serves_from_the_others(
    tmp_path: Path,
    upstream: FaultUpstream,
    second: FaultUpstream,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("TR_EAST_KEY", "sk-east")
    monkeypatch.delenv("TR_WEST_KEY", raising=False)
    caplog.set_level(logging.WARNING)
    async with running(_config(tmp_path, upstream, second)) as client:
        answers = [
            await client.post("/v1/chat/completions", json=chat(f"Hi {i}.", model="large", stream=i % 2 == 1))
            for i in range(8)
        ]
        metrics = samples((await client.get("/metrics")).text)
    assert [r.status_code for r in answers] == [200] * 8
    plain = [r.json()["tierroute"]["deployment"] for r in answers[::2]]
    assert plain == ["east"] * 4  # weighted_random would have sent about half to west
    assert len(upstream.requests) == 8 and second.requests == []
    assert {r.headers["authorization"] for r in upstream.requests} == {"Bearer sk-east"}
    assert value(metrics, "tierroute_deployment_key_missing", tier="large", deployment="west") == 1
    assert value(metrics, "tierroute_deployment_key_missing", tier="large", deployment="east") == 0
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR and "TR_WEST_KEY" in r.getMessage()]
    assert len(loud) == 1 and "west" in loud[0].getMessage() and "DOWN" in loud[0].getMessage()


async def test_a_tier_none_of_whose_deployments_has_its_key_refuses_to_start(
    tmp_path: Path, upstream: FaultUpstream, second: FaultUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TR_EAST_KEY", raising=False)
    monkeypatch.setenv("TR_WEST_KEY", "")  # set but empty: no key either
    with pytest.raises(ConfigError) as refused:
        async with running(_config(tmp_path, upstream, second)):
            pass
    said = str(refused.value)
    assert all(word in said for word in ("tier large", "east", "TR_EAST_KEY", "west", "TR_WEST_KEY")), said
    assert upstream.requests == second.requests == []


@pytest.mark.slow  # starts `tierroute serve`
def test_tierroute_serve_says_which_keys_are_missing_and_exits(
    tmp_path: Path, upstream: FaultUpstream, second: FaultUpstream
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TR_EAST_KEY", "TR_WEST_KEY")}
    cfg = _config(tmp_path, upstream, second)
    done = subprocess.run(
        [TIERROUTE, "--config", str(cfg), "serve", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode != 0
    assert "TR_EAST_KEY" in done.stdout + done.stderr and "TR_WEST_KEY" in done.stdout + done.stderr
