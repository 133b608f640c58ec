"""Shadow escalation through the real app on loopback: after the answer, never before it.

The small tier is instant; the shadow target is a scripted backend, slow where the test needs
a client that waited for shadow work to show it. Queue bound, budget and the operator key
are read back from /metrics and the ledger file.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from router.admission.accounting import worst_case_usd
from router.api.app import create_app
from router.backends.base import Backend
from router.backends.instant import InstantBackend
from router.cascade import Tier
from router.cli import main as cli_main
from router.config import SHADOW_KEY, load_settings
from router.errors import ConfigError
from router.generation import Delta, Generation, GenerationRequest, Message
from router.quality import shadow as shadow_module
from router.verification import VerifierSet
from tests.support.accounting import ESCALATE_ON_MARK, MARK, registry
from tests.support.config import smol_config, write_config
from tests.support.model import SMOL
from tests.support.scripted import ScriptedBackend
from tests.support.servers import UvicornThread


def config(
    tmp: Path,
    *,
    rate: float = 1.0,
    usd_per_day: float = 1.0,
    max_concurrency: int = 1,
    max_queue: int = 2,
    store_prompts: bool = False,
    shadow_extra: str = "",
    verifiers: str = ESCALATE_ON_MARK,
) -> Path:
    body = f"""
[server]
allow_unauthenticated = true
[ledger]
path = "{tmp / "ledger.sqlite3"}"
store_prompts = {"true" if store_prompts else "false"}

[[tiers]]
name = "small"
backend = "llamacpp"
max_tokens = 48
[tiers.llamacpp]
model = "{SMOL}"
[tiers.price]
usd_per_1m_input_tokens = 0.05
usd_per_1m_output_tokens = 0.10
[tiers.shadow]
rate = {rate}
usd_per_day = {usd_per_day}
max_concurrency = {max_concurrency}
max_queue = {max_queue}
{shadow_extra}
{verifiers}
[[tiers]]
name = "large"
backend = "llamacpp"
max_tokens = 48
[tiers.llamacpp]
model = "{SMOL}"
[tiers.price]
usd_per_1m_input_tokens = 0.60
usd_per_1m_output_tokens = 2.40
"""
    return write_config(tmp / "config.toml", body)


@contextlib.contextmanager
def serving(cfg: Path, large: Backend) -> Iterator[UvicornThread]:
    app = create_app(
        load_settings(cfg),
        backends={"small": InstantBackend("small", "The answer is 42."), "large": large},
        registry=registry(),
    )
    with UvicornThread(app) as srv:
        srv.app = app  # type: ignore[attr-defined]
        yield srv


def metric(base: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(check, timeout: float = 20.0):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("timed out")


def rows(path: Path, sql: str) -> list[tuple]:  # type: ignore[type-arg]
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def timed(client: openai.AsyncOpenAI, i: int, *, stream: bool) -> float:
    t0 = time.monotonic()
    kwargs = {"model": "auto", "messages": [{"role": "user", "content": f"What is 6*7? ({i})"}], "max_tokens": 16}
    if stream:
        chunks = await client.chat.completions.create(stream=True, **kwargs)  # type: ignore[call-overload]
        text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    else:
        text = (await client.chat.completions.create(**kwargs)).choices[0].message.content  # type: ignore[call-overload]
    assert text == "The answer is 42."
    return time.monotonic() - t0


@pytest.mark.timeout(120)
@pytest.mark.slow  # waits out real timeouts: seconds of wall time
def test_shadow_never_slows_the_client_and_its_queue_is_bounded(tmp_path: Path) -> None:
    # the shadow target never answers while the test runs: a client that waited on it would hang
    large = ScriptedBackend("large", lambda r: "42", delay_s=60.0)
    with serving(config(tmp_path, max_concurrency=1, max_queue=2), large) as srv:
        client = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=30)

        async def run() -> list[float]:
            return [await timed(client, i, stream=i % 2 == 1) for i in range(10)]

        latencies = asyncio.run(run())
        assert max(latencies) < 5.0, latencies  # instant answers, however loaded the machine
        # one shadow runs and two wait: the other seven are dropped, never queued or waited for
        assert metric(srv.url, "tierroute_shadow_sampled_total", tier="small") == 10
        assert metric(srv.url, "tierroute_shadow_dropped_total", tier="small", reason="queue_full") == 7
        assert metric(srv.url, "tierroute_shadow_queue_depth", tier="small") == 2
        assert large.most_in_flight == 1
        metrics = srv.app.state.services.accounting.metrics  # type: ignore[attr-defined]
    # shutting down drops the two waiting and, after a grace, stops the one running
    assert metrics.shadow.dropped.labels("small", "stopped")._value.get() == 2
    assert rows(tmp_path / "ledger.sqlite3", "SELECT COUNT(*) FROM shadow_pairs") == [(0,)]


class Trickle(Backend):
    """A shadow target that streams a word every 50 ms for a minute, counting as it goes (as the
    llama.cpp and OpenAI-compatible backends do): shutdown finds it mid-answer."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.streamed = 0

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        for i in range(1, 1201):
            await asyncio.sleep(0.05)
            self.streamed = i
            yield Delta("word ", prompt_tokens=11, completion_tokens=i, busy_s=0.05 * i)
        raise AssertionError("shutdown should have stopped the shadow long before")


@pytest.mark.timeout(120)
def test_shadow_work_stopped_at_shutdown_is_still_charged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shadow_module, "_CLOSE_GRACE_S", 0.5)
    large = Trickle("large")
    with serving(config(tmp_path), large) as srv:
        c = httpx.Client(base_url=srv.url, timeout=30)
        body = {"model": "auto", "messages": [{"role": "user", "content": "6*7?"}], "max_tokens": 8}
        assert c.post("/v1/chat/completions", json=body).json()["tierroute"]["tier"] == "small"
        wait_for(lambda: large.streamed >= 5)
    streamed = large.streamed
    ledger = tmp_path / "ledger.sqlite3"
    (row,) = rows(
        ledger,
        "SELECT r.request_id, r.tier, r.cost_usd, a.decision, a.prompt_tokens, a.completion_tokens, a.finish_reason "
        f"FROM requests r JOIN attempts a ON a.request_id = r.request_id WHERE r.key_id = '{SHADOW_KEY}'",
    )
    request_id, tier, cost, decision, prompt_tokens, completion_tokens, finish = row
    assert request_id.startswith("shadow-") and tier == "large" and decision == "abandoned" and finish == "cancelled"
    assert prompt_tokens == 11 and 5 <= completion_tokens <= streamed
    assert cost == pytest.approx((11 * 0.60 + completion_tokens * 2.40) / 1e6)
    assert rows(ledger, "SELECT COUNT(*) FROM shadow_pairs") == [(0,)]  # no answer, so no pair


@pytest.mark.timeout(120)
def test_shadow_pairs_of_plain_and_streamed_answers_are_stored(tmp_path: Path) -> None:
    large = ScriptedBackend("large", lambda r: "42")
    with serving(config(tmp_path, max_concurrency=1, max_queue=10), large) as srv:
        client = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=30)

        async def run() -> None:
            for i in range(4):
                await timed(client, i, stream=i % 2 == 1)

        asyncio.run(run())
        wait_for(
            lambda: metric(srv.url, "tierroute_shadow_pairs_total", tier="small", target="large", agree="true") == 4
        )
        assert metric(srv.url, "tierroute_shadow_agreement_rate", tier="small", threshold="0.5") == 1.0
        assert metric(srv.url, "tierroute_shadow_agreement_wilson_low", tier="small", threshold="0.5") > 0.4
    ledger = tmp_path / "ledger.sqlite3"
    pairs = rows(
        ledger, "SELECT request_id, shadow_request_id, rule, agree, answer_extracted, prompt_json FROM shadow_pairs"
    )
    assert len(pairs) == 4
    assert all(p[2:] == ("number", 1, "42", None) for p in pairs), pairs  # no prompts unless opted in
    shadow_rows = rows(ledger, f"SELECT request_id, tier FROM requests WHERE key_id = '{SHADOW_KEY}'")
    assert sorted(shadow_rows) == sorted((p[1], "large") for p in pairs)
    client_rows = rows(ledger, f"SELECT request_id FROM requests WHERE key_id != '{SHADOW_KEY}'")
    assert sorted(r[0] for r in client_rows) == sorted(p[0] for p in pairs)


@pytest.mark.timeout(120)
def test_shadow_spend_stays_under_budget_and_shows_under_the_operator_key(tmp_path: Path) -> None:
    large = ScriptedBackend("large", lambda r: "41", delay_s=0.0)
    settings = load_settings(config(tmp_path))
    # the worst case of one shadow request at the large tier, as the sampler estimates it
    request = GenerationRequest(messages=(Message("user", "What is 6*7? (0)"),), max_tokens=16)
    worst = worst_case_usd([Tier(settings.tier("large"), large, VerifierSet([]))], request, verify=False)
    budget = 2.5 * worst
    cfg = config(tmp_path, usd_per_day=budget, max_queue=20, store_prompts=True)
    with serving(cfg, large) as srv:
        client = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0)

        async def run() -> None:
            for i in range(12):
                await timed(client, i, stream=False)
                await asyncio.sleep(0.05)  # let each shadow finish, so the budget is what stops them

        asyncio.run(run())
        ran = wait_for(
            lambda: metric(srv.url, "tierroute_shadow_pairs_total", tier="small", target="large", agree="false")
        )
        assert metric(srv.url, "tierroute_shadow_dropped_total", tier="small", reason="budget") == 12 - ran
        spend = metric(srv.url, "tierroute_shadow_spend_today_usd", tier="small")
    ledger = tmp_path / "ledger.sqlite3"
    (total,) = rows(ledger, f"SELECT SUM(cost_usd) FROM requests WHERE key_id = '{SHADOW_KEY}'")[0]
    assert 2 <= ran < 12
    assert total == pytest.approx(spend) and total <= budget
    pairs = rows(ledger, "SELECT prompt_json, answer_text, shadow_text, rule, agree FROM shadow_pairs")
    assert pairs[0][0] == '{"messages":[{"content":"What is 6*7? (0)","role":"user"}]}'
    assert pairs[0][1:] == ("The answer is 42.", "41", "number", 0)
    # the client's own key never carries shadow cost; the operator key does
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["report", "costs", "--by", "key", "--format", "csv", "--ledger", str(ledger)]) == 0
    by_key = {line.split(",")[0]: line for line in out.getvalue().splitlines()[1:]}
    assert SHADOW_KEY in by_key and "anonymous" in by_key


@pytest.mark.timeout(120)
def test_a_rejected_answer_is_not_shadowed_and_a_restart_remembers_the_days_spend(tmp_path: Path) -> None:
    large = ScriptedBackend("large", lambda r: "42")
    cfg = config(tmp_path)
    with serving(cfg, large) as srv:
        c = httpx.Client(base_url=srv.url, timeout=30)
        body = {"model": "auto", "messages": [{"role": "user", "content": f"{MARK} 6*7?"}], "max_tokens": 8}
        assert c.post("/v1/chat/completions", json=body).json()["tierroute"]["tier"] == "large"
        body["messages"][0]["content"] = "6*7?"
        assert c.post("/v1/chat/completions", json=body).json()["tierroute"]["tier"] == "small"
        wait_for(lambda: metric(srv.url, "tierroute_shadow_pairs_total", tier="small", target="large", agree="true"))
        assert metric(srv.url, "tierroute_shadow_sampled_total", tier="small") == 1
        spent = metric(srv.url, "tierroute_shadow_spend_today_usd", tier="small")
    assert spent > 0
    with serving(cfg, ScriptedBackend("large", lambda r: "42")) as srv:
        assert metric(srv.url, "tierroute_shadow_spend_today_usd", tier="small") == pytest.approx(spent)


def test_an_unknown_shadow_target_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"shadow.target: no tier named 'huge'"):
        load_settings(config(tmp_path, shadow_extra='target = "huge"'))
    with pytest.raises(ConfigError, match=r"baseline_agree"):
        load_settings(config(tmp_path, shadow_extra="baseline_agree = { maths = 1.5 }"))
    with pytest.raises(ConfigError, match=r"_shadow"):
        load_settings(config(tmp_path, shadow_extra='[[server.api_keys]]\nname = "_shadow"\nhash = "x"'))
    # `config check` shows the section with its defaults filled in
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["--config", str(config(tmp_path, verifiers="")), "config", "check"]) == 0
    shown = json.loads(out.getvalue())["tiers"][0]["shadow"]
    assert shown["rate"] == 1.0 and shown["target"] is None and shown["baseline_n"] == 200


@pytest.mark.timeout(300)
def test_shadow_with_the_real_model_on_both_tiers(tmp_path: Path, smol_path: Path) -> None:
    """SmolLM2 through llama.cpp as both tiers: the pair's hashes are of what was generated, and
    with store_prompts the pair keeps the texts the hashes are of."""
    import hashlib

    cfg = smol_config(tmp_path, threshold=0.0)
    text = cfg.read_text().replace("[ledger]\n", "[ledger]\nstore_prompts = true\n", 1)
    shadow = "[tiers.shadow]\nrate = 1.0\nusd_per_day = 1.0\n"
    text = text.replace('stands_for = "test small tier"\n', 'stands_for = "test small tier"\n' + shadow, 1)
    cfg.write_text(text)
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        body = {"model": "auto", "messages": [{"role": "user", "content": "What is 2+3?"}], "max_tokens": 16}
        answer = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120).json()
        assert answer["tierroute"]["tier"] == "small"
        wait_for(lambda: metric(srv.url, "tierroute_shadow_sampled_total", tier="small") == 1)
        wait_for(lambda: rows(tmp_path / "ledger.sqlite3", "SELECT COUNT(*) FROM shadow_pairs") == [(1,)], 120)
    ((prompt, a, b, ha, hb, hp, cost),) = rows(
        tmp_path / "ledger.sqlite3",
        "SELECT prompt_json, answer_text, shadow_text, answer_sha256, shadow_sha256, prompt_sha256, shadow_cost_usd "
        "FROM shadow_pairs",
    )
    assert a == answer["choices"][0]["message"]["content"] and b
    sha = lambda t: hashlib.sha256(t.encode()).hexdigest()  # noqa: E731
    assert (ha, hb, hp) == (sha(a), sha(b), sha(prompt)) and cost > 0
