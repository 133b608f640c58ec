"""A 5xx is the deployment's failure only when the deployment fails a request of the tier's own too.

The outside review of issue 38's fixes: llama-cpp-python's server answers every request it cannot
validate with HTTP 500 (a message of role `developer`, a `response_format` of type `json_schema`,
both OpenAI-standard). Each such 500 counted against the deployment's breaker and was retried:
with default settings two requests of one key opened it, the other tenant got 503 for the
cool-down, and the key paid nothing. Now a probe of the tier's own decides
(`router.backends.openai.outages`): answered, the failure is the request's (502, not retried, no
breaker count, charged); failed too, it is an outage and goes as it always went (the breaker counts
it, the request fails over). Through the app served in process, against the real server and
against scripted upstreams on loopback.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.plugins import VerifierRegistry
from tests.support.accounting import auth, keys_section, read_ledger, running
from tests.support.config import TOKEN_PRICE, table, tier, write_config
from tests.support.fault_upstream import FaultUpstream, Received, broken_stream, hang, ok, sse, status
from tests.support.servers import llama_cpp_server

KEYS: dict[str, dict[str, Any]] = {"tenant": {}, "attacker": {}, "scraper": {"roles": ["metrics"]}}
DEVELOPER = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


def served_config(
    tmp: Path, urls: list[str], *, model: str = "fake", timeout_s: float = 20, **engine: object
) -> tuple[Path, dict[str, str]]:
    """Tier `large` of one deployment per URL (named d0, d1, ...); the engine's settings are the
    defaults unless given."""
    body, raw = keys_section(KEYS)
    text = f"[server]\n{body}\n" + table("ledger", {"path": tmp / "ledger.sqlite3"})
    settings: dict[str, object] = {"model": model, "hosted_prompt_tokens": 0, **engine}
    if len(urls) == 1:
        settings["base_url"] = urls[0]
        extra = None
    else:
        extra = "".join(f'[[tiers.openai.deployments]]\nname = "d{i}"\nbase_url = "{u}"\n' for i, u in enumerate(urls))
    text += tier(
        "large", backend="openai", max_tokens=16, timeout_s=timeout_s, engine=settings, price=TOKEN_PRICE, extra=extra
    )
    return write_config(tmp / "config.toml", text), raw


async def ask(client: httpx.AsyncClient, key: str, **body: Any) -> httpx.Response:
    sent = {"model": "large", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, **body}
    return await client.post("/v1/chat/completions", json=sent, headers=auth(key))


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of /metrics (labels in any order)."""
    for line in text.splitlines():
        found = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if found and all(f'{k}="{v}"' in found.group(1) for k, v in labels.items()):
            return float(found.group(2))
    raise AssertionError(f"no sample {name}{labels}")


def refused(response: httpx.Response) -> bool:
    error = response.json().get("error", {})
    return (
        response.status_code == 502
        and error.get("code") == "upstream_refused_request"
        and "refused this request" in error.get("message", "")
    )


def attacker_rows(tmp: Path) -> list[Any]:
    return [e for e in read_ledger(tmp / "ledger.sqlite3").values() if e.key_id == "attacker"]


@pytest.fixture(scope="module")
def llama_server(smol_path: Path) -> Iterator[str]:
    with llama_cpp_server(smol_path) as url:
        yield url


async def test_a_clients_own_parameter_that_the_real_server_answers_with_500_opens_no_breaker(
    tmp_path: Path, llama_server: str
) -> None:
    # Found: with default settings (5 failures open the breaker, 3 attempts a request), two
    # requests of role `developer` opened it and the other tenant got 503 for 30 s; the
    # attacker's ledger showed nothing. Now each is that request's 502, tried once, charged.
    cfg, keys = served_config(tmp_path, [llama_server], model="smol")
    async with running(cfg, registry=VerifierRegistry.from_entry_points()) as client:
        before = await ask(client, keys["tenant"])
        attacks = [await ask(client, keys["attacker"], messages=DEVELOPER) for _ in range(3)]
        attacks += [await ask(client, keys["attacker"], response_format=SCHEMA) for _ in range(3)]
        after = [await ask(client, keys["tenant"]) for _ in range(3)]
        metrics = (await client.get("/metrics", headers=auth(keys["scraper"]))).text
    assert before.status_code == 200, before.text
    assert all(refused(r) for r in attacks), [r.text for r in attacks]
    assert [r.status_code for r in after] == [200] * 3, [r.text for r in after]
    assert metric(metrics, "tierroute_backend_breaker_opens_total", tier="large") == 0
    assert metric(metrics, "tierroute_backend_consecutive_failures", tier="large") == 0
    # each attack tried once (a retry would only be refused again, at the operator's cost), and
    # one probe of the tier's own decided them all (its verdict is remembered)
    assert metric(metrics, "tierroute_backend_upstream_retries_total", tier="large") == 0
    assert metric(metrics, "tierroute_deployment_outage_probes_total", tier="large") == 1
    rows = attacker_rows(tmp_path)
    assert len(rows) == len(attacks)
    assert all(row.cost_usd > 0 and row.prompt_tokens > 0 for row in rows), rows


def fails_developer(then: Any = None) -> Any:
    """An upstream that fails any request with a `developer` message (as llama-cpp-python's server
    does, or mid-stream with an error event when `then` says so) and answers others."""

    async def act(conn: Any, req: Received) -> bool:
        if "developer" in json.dumps(req.body.get("messages", [])):
            return await (then or status(500, "Input should be 'system'"))(conn, req)
        return await ok()(conn, req)

    return act


def developer_requests(*ups: FaultUpstream) -> int:
    return sum("developer" in json.dumps(r.body.get("messages", [])) for u in ups for r in u.requests)


async def test_a_request_the_upstream_fails_alone_is_not_failed_over_nor_counted(tmp_path: Path) -> None:
    # two deployments: the attacker's 500s moved to the other one (repeating them) and counted
    # against both breakers; now neither hears of them and the other deployment is never asked
    with (
        FaultUpstream(default=fails_developer(), outage_probe=None) as d0,
        FaultUpstream(default=fails_developer(), outage_probe=None) as d1,
    ):
        cfg, keys = served_config(tmp_path, [d0.base_url, d1.base_url], breaker_failures=2, max_attempts=2)
        async with running(cfg, registry=VerifierRegistry.from_entry_points()) as client:
            attacks = [await ask(client, keys["attacker"], messages=DEVELOPER) for _ in range(4)]
            streamed = await ask(client, keys["attacker"], messages=DEVELOPER, stream=True)
            after = [await ask(client, keys["tenant"]) for _ in range(4)]
            metrics = (await client.get("/metrics", headers=auth(keys["scraper"]))).text
    assert all(refused(r) for r in [*attacks, streamed]), [r.text for r in [*attacks, streamed]]
    assert [r.status_code for r in after] == [200] * 4
    assert developer_requests(d0, d1) == len(attacks) + 1  # each once, at one deployment
    for name in ("d0", "d1"):
        assert metric(metrics, "tierroute_deployment_breaker_opens_total", deployment=name) == 0
        assert metric(metrics, "tierroute_deployment_consecutive_failures", deployment=name) == 0
    probes = [r for u in (d0, d1) for r in u.requests if r.outage_probe]
    # at most one per kind (plain, streamed) at each deployment; nothing of the client's in them
    assert 1 <= len(probes) <= 4 and all("developer" not in json.dumps(p.body) for p in probes)
    assert len(attacker_rows(tmp_path)) == len(attacks) + 1


async def test_a_real_outage_still_opens_the_breaker_and_fails_over(tmp_path: Path) -> None:
    # d0 fails everything, the tier's own probe too: its 500s are its own, counted; every request
    # is answered by d1, and d0's breaker opens after breaker_failures (2) of them
    with (
        FaultUpstream(default=status(500, "down"), outage_probe=None) as d0,
        FaultUpstream() as d1,
    ):
        cfg, keys = served_config(tmp_path, [d0.base_url, d1.base_url], breaker_failures=2, strategy="ordered_failover")
        async with running(cfg, registry=VerifierRegistry.from_entry_points()) as client:
            answers = [await ask(client, keys["tenant"]) for _ in range(4)]
            metrics = (await client.get("/metrics", headers=auth(keys["scraper"]))).text
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
    assert [r.json()["tierroute"]["attempts"][0]["deployment"] for r in answers] == ["d1"] * 4
    assert metric(metrics, "tierroute_deployment_breaker_open", deployment="d0") == 1
    assert metric(metrics, "tierroute_deployment_breaker_opens_total", deployment="d0") == 1
    assert metric(metrics, "tierroute_deployment_outage_probes_total", deployment="d0") >= 1


async def test_a_real_outage_of_one_deployment_is_503_after_its_retries(tmp_path: Path) -> None:
    # one deployment, down for everyone: the client hears 503 as before, after max_attempts tries
    with FaultUpstream(default=status(500, "down"), outage_probe=None) as d0:
        cfg, keys = served_config(tmp_path, [d0.base_url], breaker_failures=2, max_attempts=2, backoff_initial_s=0.01)
        async with running(cfg, registry=VerifierRegistry.from_entry_points()) as client:
            first = await ask(client, keys["tenant"])
            second = await ask(client, keys["tenant"])
    assert first.status_code == 503 and first.json()["error"]["code"] == "service_unavailable"
    assert second.status_code == 503
    # the first request's two tries count once (one verdict), the second's first try opens it
    assert len([r for r in d0.requests if not r.outage_probe]) == 3


async def test_an_error_event_mid_stream_is_the_requests_when_the_tier_is_answered(tmp_path: Path) -> None:
    # a request whose own parameter makes the upstream fail mid-answer (an error event after two
    # tokens, as vLLM sends when a request's grammar or tool parser fails): the breaker hears
    # nothing and the key is charged what was streamed; the same event on every stream, the
    # tier's own too, is an outage and is counted
    with (
        FaultUpstream(default=fails_developer(broken_stream(2, "error")), outage_probe=None) as alone,
        FaultUpstream(default=broken_stream(2, "error"), outage_probe=None) as down,
    ):
        for up, name in ((alone, "alone"), (down, "down")):
            tmp = tmp_path / name
            tmp.mkdir()
            cfg, keys = served_config(tmp, [up.base_url], breaker_failures=5, max_attempts=1)
            async with running(cfg, registry=VerifierRegistry.from_entry_points()) as client:
                r = await ask(client, keys["attacker"], messages=DEVELOPER, stream=True)
                metrics = (await client.get("/metrics", headers=auth(keys["scraper"]))).text
            assert r.status_code == 200 and '"error"' in r.text, r.text
            failures = metric(metrics, "tierroute_backend_consecutive_failures", tier="large")
            if name == "alone":
                assert "refused this request" in r.text and failures == 0, (r.text, failures)
            else:
                assert "refused this request" not in r.text and failures == 1, (r.text, failures)
            rows = attacker_rows(tmp)
            assert len(rows) == 1 and rows[0].completion_tokens >= 1 and rows[0].cost_usd > 0, rows


def drops_after_an_empty_stream() -> Any:
    """llama-cpp-python's server on a streamed prompt over its context: a whole, empty 200 event
    stream, after which it closes the connection. The close races the next request sent on that
    pooled connection, here every time: the next request it carries gets no answer."""
    dropping: set[int] = set()

    async def act(conn: Any, req: Received) -> bool:
        if id(conn.writer) in dropping:
            return False  # closed without a word: "Server disconnected without sending a response"
        if req.streaming and "word word" in json.dumps(req.body.get("messages", [])):
            await sse(done=False)(conn, req)
            dropping.add(id(conn.writer))
            return True
        return await ok()(conn, req)

    return act


async def test_a_probe_on_the_connection_the_failed_request_left_is_no_outage(tmp_path: Path) -> None:
    # Found (fourth review): the probe went out at once on the pooled connection of the request it
    # judges, which llama-cpp-python's server was closing; "Server disconnected without sending a
    # response" was taken for an outage, remembered 10 s, and five such requests of one key (3,000
    # words, streamed) opened the breaker for every tenant, with no ledger row for any of them. The
    # probe's own connection failing before any answer says nothing of the deployment: it is asked
    # once more, on a new connection.
    long = "word " * 3000
    with FaultUpstream(default=drops_after_an_empty_stream(), outage_probe=None) as d0:
        cfg, keys = served_config(tmp_path, [d0.base_url])  # defaults: 5 failures open it, 3 attempts
        async with running(cfg, registry=VerifierRegistry.from_entry_points()) as client:
            attacks = []
            for _ in range(5):
                attacks.append(
                    await ask(client, keys["attacker"], stream=True, messages=[{"role": "user", "content": long}])
                )
            after = await ask(client, keys["tenant"])
            metrics = (await client.get("/metrics", headers=auth(keys["scraper"]))).text
    assert all(r.status_code == 502 and "upstream_refused_request" in r.text for r in attacks), [
        r.text for r in attacks
    ]
    assert after.status_code == 200, after.text
    assert metric(metrics, "tierroute_backend_breaker_opens_total", tier="large") == 0
    assert metric(metrics, "tierroute_backend_consecutive_failures", tier="large") == 0
    rows = attacker_rows(tmp_path)
    assert len(rows) == 5 and all(row.prompt_tokens > 3000 and row.cost_usd > 0 for row in rows), rows


async def test_n_the_real_server_does_not_honour_is_the_requests_400_and_charged(
    tmp_path: Path, llama_server: str
) -> None:
    # llama-cpp-python's server ignores n and answers one choice: counted as a malformed answer,
    # two such requests opened the breaker (the third review). Now each is a 400 naming n, tried
    # once, charged the choice that came, and the breaker hears the deployment as alive.
    cfg, keys = served_config(tmp_path, [llama_server], model="smol")
    async with running(cfg, registry=VerifierRegistry.from_entry_points()) as client:
        attacks = [await ask(client, keys["attacker"], n=2, temperature=0.8) for _ in range(3)]
        after = await ask(client, keys["tenant"])
        metrics = (await client.get("/metrics", headers=auth(keys["scraper"]))).text
    for r in attacks:
        error = r.json()["error"]
        assert r.status_code == 400 and (error["code"], error["param"]) == ("n_not_supported", "n"), r.text
    assert after.status_code == 200, after.text
    assert metric(metrics, "tierroute_backend_consecutive_failures", tier="large") == 0
    assert metric(metrics, "tierroute_backend_upstream_retries_total", tier="large") == 0
    rows = attacker_rows(tmp_path)
    assert len(rows) == 3 and all(r.completion_tokens >= 1 and r.cost_usd > 0 for r in rows), rows


async def until(check: Any, seconds: float) -> None:
    """Wait, a tenth of a second at a time, until `check()` (a deadline cut is judged after the
    request has ended)."""
    for _ in range(int(seconds * 10)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("not within the time")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_deadline_cut_is_charged_and_judged_by_the_probe(tmp_path: Path, stream: bool) -> None:
    # A request cut at its deadline was charged nothing and counted against the breaker: one
    # whose own length (max_tokens with end-of-text suppressed) passes the tier's timeout_s is the
    # request's doing. Now it is charged its prompt and, plain, n * max_tokens (the server goes on
    # generating for a reader that left), and the breaker hears of it only once the tier's own
    # probe says: answered here, so the deployment is alive, and nothing counts.
    with FaultUpstream(outage_probe=None) as d0:
        d0.script(hang(10))
        cfg, keys = served_config(tmp_path, [d0.base_url], timeout_s=1.5)
        async with running(cfg, registry=VerifierRegistry.from_entry_points()) as client:
            cut = await ask(client, keys["attacker"], stream=stream)

            async def judged() -> bool:
                text = (await client.get("/metrics", headers=auth(keys["scraper"]))).text
                return metric(text, "tierroute_deployment_outage_probes_total", tier="large") >= 1

            await until(judged, 8)
            after = await ask(client, keys["tenant"])
            metrics = (await client.get("/metrics", headers=auth(keys["scraper"]))).text
    assert cut.status_code == 503 and cut.headers["retry-after"] == "1", cut.text
    assert "deadline" in cut.json()["error"]["message"]
    assert after.status_code == 200, after.text
    assert metric(metrics, "tierroute_backend_consecutive_failures", tier="large") == 0
    [row] = attacker_rows(tmp_path)
    assert row.prompt_tokens > 0 and row.cost_usd > 0, row
    assert row.completion_tokens == (0 if stream else 4), row  # the max_tokens asked (`ask`), n = 1


async def test_a_deadline_cut_on_a_deployment_that_answers_nothing_counts_against_it(tmp_path: Path) -> None:
    # the other side: the probe gets no answer either (a hung deployment), so the cut counts
    with FaultUpstream(default=hang(30), outage_probe=None) as d0:
        cfg, keys = served_config(tmp_path, [d0.base_url], timeout_s=1.5)
        async with running(cfg, registry=VerifierRegistry.from_entry_points()) as client:
            cut = await ask(client, keys["attacker"])

            async def counted() -> bool:
                text = (await client.get("/metrics", headers=auth(keys["scraper"]))).text
                return metric(text, "tierroute_backend_consecutive_failures", tier="large") == 1

            await until(counted, 10)
    assert cut.status_code == 503, cut.text
