"""One tenant against the others, through the app and honest upstreams on loopback (issue 38).

The app is served in process with its lifespan (engine, ledger), two `openai` tiers: `small`
(one deployment, the `confidence` verifier, which reads the logprobs the tier asks for itself) and
`large` (two deployments). Every upstream is `honest`: it answers as a real server does, shaped by
the request (n choices of max_tokens tokens, each with its logprob entry and alternatives). Two
keys: `tenant`, whose requests must keep their latency and tier, and `attacker`.

- Finding 1: an honest answer over max_response_bytes counted as an upstream failure, so one key
  opened every breaker for everyone, at no charge.
- Finding 2: one refusal in words naming logprobs switched them off for the deployment until a
  restart, and every `auto` request escalated.
- Finding 7: an upstream reporting 0/0 usage for a long answer made it free and invisible to a
  key's token rate.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.plugins import VerifierRegistry
from tests.support.accounting import auth, keys_section, read_ledger, running
from tests.support.config import TOKEN_PRICE, table, tier, write_config
from tests.support.fault_upstream import FaultUpstream, Received, honest, status

KEYS: dict[str, dict[str, Any]] = {"tenant": {}, "attacker": {}, "scraper": {"roles": ["metrics"]}}
LIMIT = 256 * 1024  # max_response_bytes of both tiers
ASK = "Say hello."
REPEAT = "Repeat the line of equals signs, again and again."
LONG = "=" * 60  # a long token, as a repeating prompt makes a model write
# a request whose answer cannot fit, by admission's estimate (about 930 KB against 256 KiB)
TOO_BIG = {"n": 8, "max_tokens": 64, "logprobs": True, "top_logprobs": 20}
# one that fits by the estimate (about 160 KB) but whose honest answer of long tokens does not (550 KB)
LONG_ANSWER = {"n": 4, "max_tokens": 64, "logprobs": True, "top_logprobs": 5}


def token_for(req: Received) -> str:
    """An honest model: a prompt asking it to repeat gets long tokens, any other a short one."""
    text = json.dumps(req.body.get("messages", ""))
    return LONG if "Repeat" in text else " hello"


def engine(**values: object) -> dict[str, object]:
    return {
        "model": "fake",
        "max_attempts": 2,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        "breaker_failures": 3,
        "breaker_cooldown_s": 60,
        "hosted_prompt_tokens": 0,
        "max_response_bytes": LIMIT,
        **values,
    }


def tenants_config(
    tmp: Path, small: str, large: tuple[str, str], keys: dict[str, dict[str, Any]]
) -> tuple[Path, dict[str, str]]:
    body, raw = keys_section(keys)
    text = f"[server]\n{body}\n" + table("ledger", {"path": tmp / "ledger.sqlite3"})
    confidence = '[[tiers.verifiers]]\nname = "confidence"\n'
    text += tier("small", backend="openai", max_tokens=64, timeout_s=10, threshold=0.5, engine=engine(base_url=small),
                 price=TOKEN_PRICE, extra=confidence)  # fmt: skip
    deployments = "".join(
        f'[[tiers.openai.deployments]]\nname = "d{i}"\nbase_url = "{url}"\n' for i, url in enumerate(large)
    )
    text += tier("large", backend="openai", max_tokens=64, timeout_s=10, engine=engine(), price=TOKEN_PRICE,
                 extra=deployments)  # fmt: skip
    return write_config(tmp / "config.toml", text), raw


@contextlib.contextmanager
def upstreams(small: Callable[..., Any] = honest, **small_kwargs: Any) -> Iterator[tuple[FaultUpstream, ...]]:
    with (
        FaultUpstream(default=small(token_for, **small_kwargs)) as s,
        FaultUpstream(default=honest(token_for)) as d0,
        FaultUpstream(default=honest(token_for)) as d1,
    ):
        yield s, d0, d1


@contextlib.asynccontextmanager
async def served(cfg: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with running(cfg, registry=VerifierRegistry.from_entry_points()) as client:
        yield client


async def ask(
    client: httpx.AsyncClient, key: str, content: str = ASK, *, model: str = "auto", **extra: Any
) -> tuple[httpx.Response, float]:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 16, **extra}
    started = time.monotonic()
    response = await client.post("/v1/chat/completions", json=body, headers=auth(key))
    return response, time.monotonic() - started


def tier_of(response: httpx.Response) -> str | None:
    return response.headers.get("x-tierroute-tier") if response.status_code == 200 else None


def attacker_requests(ups: tuple[FaultUpstream, ...]) -> int:
    return sum(1 for u in ups for r in u.requests if r.body.get("n") and r.body["n"] > 1)


# -- finding 1: an honest answer too large for the tier ------------------------------------------


async def test_one_key_cannot_open_the_breakers_for_another(tmp_path: Path) -> None:
    # Found: an honest answer over max_response_bytes was an upstream failure at each deployment,
    # so a few requests of one key opened every breaker: the next requests of another key got 503
    # (or went up a tier), and the attacker's ledger showed nothing. Now the answer that cannot fit
    # is refused at admission (400 naming top_logprobs, nothing sent), and one that fits by the
    # estimate but comes back larger (long tokens) is that request's 400: the breakers hear
    # nothing against the upstream, no other deployment is asked, and the attacker is charged
    # what it asked to be generated.
    with upstreams() as ups:
        cfg, keys = tenants_config(tmp_path, ups[0].base_url, (ups[1].base_url, ups[2].base_url), KEYS)
        async with served(cfg) as client:
            baseline = []
            for _ in range(12):
                r, took = await ask(client, keys["tenant"])
                assert tier_of(r) == "small", r.text
                baseline.append(took)
            refused, cut, during = [], [], []
            for burst in range(2):  # back to back, as an attack would (a success between resets a breaker's count)
                for i in range(3):
                    big, _ = await ask(
                        client, keys["attacker"], REPEAT, **(TOO_BIG if (burst + i) % 2 else LONG_ANSWER)
                    )
                    (refused if (burst + i) % 2 else cut).append(big)
                for _ in range(6):
                    r, took = await ask(client, keys["tenant"])
                    assert (r.status_code, tier_of(r)) == (200, "small"), r.text
                    during.append(took)
            metrics = (await client.get("/metrics", headers=auth(keys["scraper"]))).text
    for r in refused:
        error = r.json()["error"]
        assert (r.status_code, error["param"], error["code"]) == (400, "top_logprobs", "response_too_large")
    for r in cut:
        error = r.json()["error"]
        assert (r.status_code, error["code"]) == (400, "response_too_large"), r.text
    # the answers that could not fit were never asked for; the others once each, at small only
    assert attacker_requests(ups) == len(cut)
    assert attacker_requests(ups[1:]) == 0
    assert 'tierroute_backend_breaker_opens_total{tier="small"} 0.0' in metrics
    assert 'tierroute_backend_consecutive_failures{tier="small"} 0.0' in metrics
    # the other tenant's latency held (median within 2x of its own baseline, as measured here)
    print(
        f"tenant p50: baseline {statistics.median(baseline) * 1e3:.1f} ms, under attack {statistics.median(during) * 1e3:.1f} ms"
    )
    assert statistics.median(during) <= 2 * statistics.median(baseline), (baseline, during)
    # the attacker is charged what the upstream generated: n * max_tokens for each cut answer
    rows = [e for e in read_ledger(tmp_path / "ledger.sqlite3").values() if e.key_id == "attacker"]
    assert len(rows) == len(cut)
    for row in rows:
        assert row.completion_tokens == LONG_ANSWER["n"] * LONG_ANSWER["max_tokens"]
        assert row.cost_usd > 0 and row.attempts[0].tier == "small"


# -- finding 2: refusals in words a client chose ---------------------------------------------------


def strict_schema(token: Callable[[Received], str]) -> Callable[..., Any]:
    """An upstream that refuses a strict schema in OpenAI's words, quoting the schema's name (the
    client's), and answers any other request honestly."""

    async def act(conn: Any, req: Received) -> bool:
        fmt = req.body.get("response_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            name = fmt["json_schema"]["name"]
            message = (
                f"Invalid schema for response_format '{name}': In context=(), 'additionalProperties' is "
                "required to be supplied and to be false."
            )
            return await status(400, message, param="response_format", code_name="invalid_json_schema")(conn, req)
        return await honest(token)(conn, req)

    return lambda *_args, **_kwargs: act


SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "logprobs", "strict": True, "schema": {"type": "object", "properties": {}}},
}


@pytest.mark.parametrize(
    ("small", "attack"),
    [
        (lambda token, **_: honest(token, max_logprobs=5), {"logprobs": True, "top_logprobs": 10}),
        # a json_schema is checked in the schema worker, a child process: a slow test
        pytest.param(strict_schema(token_for), {"response_format": SCHEMA}, marks=pytest.mark.slow),
    ],
    ids=["top_logprobs-over-max-logprobs", "schema-named-logprobs"],
)
async def test_one_request_cannot_switch_logprobs_off_for_everyone(
    tmp_path: Path, small: Callable[..., Any], attack: dict[str, Any]
) -> None:
    # Found: against a server limiting logprobs (vLLM's --max-logprobs 5), one top_logprobs=10
    # request made the tier log "refuses logprobs; no longer sent": from then on the confidence
    # verifier abstained and every `auto` request of every tenant escalated. So did a strict
    # schema the client named `logprobs`. Now the words decide for that request alone; the
    # deployment stops sending logprobs only when a request of the tier's own is refused with
    # them (a probe, which answers here: the server does take logprobs).
    with upstreams(small) as ups:
        cfg, keys = tenants_config(tmp_path, ups[0].base_url, (ups[1].base_url, ups[2].base_url), KEYS)
        async with served(cfg) as client:
            before, _ = await ask(client, keys["tenant"])
            for _ in range(3):
                await ask(client, keys["attacker"], **attack)
            after = [(await ask(client, keys["tenant"]))[0] for _ in range(5)]
            metrics = (await client.get("/metrics", headers=auth(keys["scraper"]))).text
    assert tier_of(before) == "small"
    assert [tier_of(r) for r in after] == ["small"] * 5, [r.text for r in after]
    assert [r.json()["tierroute"]["escalated"] for r in after] == [False] * 5
    # one probe of the tier's own (one token, nothing of the client's) decided it, and is remembered
    probes = [r for r in ups[0].requests if r.body.get("max_tokens") == 1]
    assert len(probes) == 1 and probes[0].body["messages"] == [{"role": "user", "content": "Say OK."}]
    assert 'tierroute_deployment_refusal_probes_total{deployment="' in metrics


# -- finding 7: usage reported as nothing -------------------------------------------------------


async def test_an_answer_reported_as_free_is_charged_and_counted_against_the_token_rate(tmp_path: Path) -> None:
    # Found: an upstream reporting 0 prompt and 0 completion tokens for a 200-token answer was
    # believed: $0 charged, nothing against the key's tokens per minute. Now each count is at
    # least what was sent and delivered must have taken (here one token per logprob entry): the
    # key is charged, and its token rate (400 a minute; each request reserves about 200 and uses
    # 61) runs out by the fifth request, where nothing ever ran out before.
    with (
        FaultUpstream(default=honest(" la", usage={"prompt_tokens": 0, "completion_tokens": 0})) as s,
        FaultUpstream() as d0,
        FaultUpstream() as d1,
    ):
        cfg, keys = tenants_config(
            tmp_path, s.base_url, (d0.base_url, d1.base_url), {**KEYS, "tenant": {"tokens_per_minute": 400}}
        )
        async with served(cfg) as client:
            answers = [(await ask(client, keys["tenant"], model="small", max_tokens=60))[0] for _ in range(6)]
            metrics = (await client.get("/metrics", headers=auth(keys["scraper"]))).text
    codes = [r.status_code for r in answers]
    assert codes[:2] == [200, 200] and 429 in codes, codes
    rows = list(read_ledger(tmp_path / "ledger.sqlite3").values())
    assert rows and all(e.completion_tokens == 60 and e.cost_usd > 0 for e in rows)
    assert 'tierroute_backend_usage_raised_total{tier="small"}' in metrics
