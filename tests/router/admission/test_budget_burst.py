"""A burst against a nearly spent budget, on a fresh process: every request reserves its worst case
at admission, so however many arrive before any settles, the key's spend stays within its budget,
and the rest are refused with OpenAI's 429 `insufficient_quota`.

The tiers are instant backends (a real backend that answers at once), behind a real uvicorn server,
driven by the official `openai` client."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from router.admission.accounting import worst_case_usd
from router.api.app import create_app
from router.backends.instant import InstantBackend
from router.cascade import Tier
from router.config import load_settings
from router.generation import GenerationRequest, Message
from router.ledger.entries import LedgerEntry
from router.ledger.store import SQLiteStore
from router.wire import prompt_token_bound
from tests.support.accounting import auth, keys_section, read_ledger
from tests.support.config import write_config
from tests.support.model import SMOL
from tests.support.servers import UvicornThread
from verifiers.base import Registry, VerifierSet

BUDGET = 1.0
LEFT = 0.01  # what the key has left when the process starts
REPLY = " ".join(["word"] * 600)  # longer than max_tokens: every answer costs all it may
MAX_TOKENS = 512

TIERS = f"""
[[tiers]]
name = "small"
backend = "llamacpp"
max_tokens = {MAX_TOKENS}
timeout_s = 30
[tiers.llamacpp]
model = "{SMOL}"
[tiers.price]
usd_per_hour = 0.10

[[tiers]]
name = "large"
backend = "llamacpp"
max_tokens = {MAX_TOKENS}
timeout_s = 30
[tiers.llamacpp]
model = "{SMOL}"
[tiers.price]
usd_per_1m_input_tokens = 0.60
usd_per_1m_output_tokens = 2.40
"""


def config(tmp: Path) -> tuple[Path, dict[str, str]]:
    keys, raw = keys_section({"k": {"usd_per_day": BUDGET}, "rich": {"roles": ["client", "metrics"]}})
    # max_in_flight above the burst: this is about the budget, not shedding (tests/router/api/test_shedding.py)
    body = f'[server]\nmax_in_flight = 1000\n{keys}\n[ledger]\npath = "{tmp / "ledger.sqlite3"}"\n{TIERS}'
    return write_config(tmp / "config.toml", body), raw


def test_worst_case_covers_every_planned_tier(tmp_path: Path) -> None:
    s = load_settings(write_config(tmp_path / "c.toml", f"[server]\nallow_unauthenticated = true\n{TIERS}"))
    tiers = [Tier(t, InstantBackend(t.name), VerifierSet([])) for t in s.tiers]
    req = GenerationRequest(messages=(Message("user", "héllo there"),), max_tokens=100)
    bound = prompt_token_bound(req)
    assert bound >= len("héllo there".encode())  # at least a token per byte
    small = 0.10 * 30 / 3600  # a time-priced tier: its whole timeout
    large = (bound * 0.60 + 100 * 2.40) / 1e6  # the request's max_tokens, under the tier's cap
    assert worst_case_usd(tiers, req) == pytest.approx(small + large)
    assert worst_case_usd(tiers[1:], req.with_(max_tokens=10_000)) == pytest.approx(
        (bound * 0.6 + MAX_TOKENS * 2.4) / 1e6
    )


def seed_spend(path: Path, key: str, usd: float) -> None:
    store = SQLiteStore(path)
    store.open()
    try:
        store.write(LedgerEntry("seed", time.time(), key, "large", "large", False, False, 0.0, usd, usd))
    finally:
        store.close()


async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, Any]:
    kwargs: dict[str, Any] = {
        "model": "large",
        "messages": [{"role": "user", "content": f"Say something, {i}."}],
        "max_tokens": MAX_TOKENS,
    }
    try:
        if i % 2:
            stream = await client.chat.completions.create(stream=True, **kwargs)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            return "ok", text
        r = await client.chat.completions.create(**kwargs)
        return "ok", r.choices[0].message.content
    except openai.RateLimitError as exc:
        return "429", exc


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_burst_cannot_pass_a_nearly_spent_budget(tmp_path: Path) -> None:
    cfg, keys = config(tmp_path)
    ledger = tmp_path / "ledger.sqlite3"
    seed_spend(ledger, "k", BUDGET - LEFT)
    settings = load_settings(cfg)
    backends = {t.name: InstantBackend(t.name, REPLY) for t in settings.tiers}
    app = create_app(settings, backends=backends, registry=Registry())
    with UvicornThread(app) as srv:
        client = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=keys["k"], max_retries=0, timeout=120)
        outcomes = await asyncio.gather(*(one(client, i) for i in range(500)))
        rich = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=keys["rich"], max_retries=0)
        assert (await rich.chat.completions.create(model="large", messages=[{"role": "user", "content": "Hi"}])).choices
        gauge = [
            line
            for line in httpx.get(f"{srv.url}/metrics", headers=auth(keys["rich"])).text.splitlines()
            if line.startswith("tierroute_requests_in_flight ")
        ]
    served = [o for o in outcomes if o[0] == "ok"]
    refused = [o[1] for o in outcomes if o[0] == "429"]
    assert len(served) + len(refused) == 500  # nothing else: no 5xx, no hang
    assert served and all(text for _, text in served)
    for exc in refused:  # OpenAI's shape, as the SDK reads it
        assert exc.status_code == 429 and exc.code == "insufficient_quota"
        assert exc.body["type"] == "insufficient_quota" and "may cost up to" in exc.body["message"]
    assert gauge == ["tierroute_requests_in_flight 0.0"]  # every request released

    rows = [e for e in read_ledger(ledger).values() if e.key_id == "k"]
    assert len(rows) == 1 + len(served)  # every served request is recorded, and nothing else
    spent = math.fsum(e.cost_usd for e in rows)
    # the bound the README states: without verifier work, a key never spends past its budget
    assert spent <= BUDGET
    # and the reservation is not so loose that it wastes the budget: what is left cannot pay
    # for one more of these answers at its actual cost
    one_cost = rows[-1].cost_usd
    assert BUDGET - spent < one_cost * 2
    assert len(served) <= math.floor(LEFT / one_cost)
