"""The surfaces behind keys, in front of a scripted upstream (one remote tier): count_tokens is a
request against its key's request rate and nothing else; a key sent twice in the two ways
Anthropic's and OpenAI's clients send it is one key whatever the case of its scheme; and a
Responses stream that fails after its text began ends with `response.failed` whose output still
holds the message the client was sent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from router.api.app import create_app
from router.config import load_settings
from tests.support.accounting import auth, read_ledger
from tests.support.budget import budget_config, remote_tier
from tests.support.fault_upstream import FaultUpstream, broken_stream
from tests.support.servers import UvicornThread
from tests.support.surfaces import QUESTION, anthropic_error, ledger_of, named_events

KEYS: dict[str, dict[str, Any]] = {
    "free": {},
    "rpm": {"requests_per_minute": 3},
    "broke": {"usd_per_day": 1e-9},  # too poor for any generation
}
COUNT = {"model": "large", "messages": [{"role": "user", "content": QUESTION}]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    with FaultUpstream() as server:
        yield server


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, upstream: FaultUpstream) -> Iterator[tuple[UvicornThread, dict]]:
    cfg, raw = budget_config(tmp_path_factory.mktemp("keyed"), KEYS, remote_tier("large", upstream.base_url))
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield srv, raw


def test_count_tokens_is_a_request_against_the_rate_and_charges_nothing(
    keyed: tuple[UvicornThread, dict], upstream: FaultUpstream
) -> None:
    srv, raw = keyed
    heard = len(upstream.requests)
    counted = [
        httpx.post(f"{srv.url}/v1/messages/count_tokens", json=COUNT, headers={"x-api-key": raw["rpm"]}, timeout=30)
        for _ in range(4)
    ]
    assert [r.status_code for r in counted] == [200, 200, 200, 429], [r.text for r in counted]
    assert anthropic_error(counted[3])["type"] == "rate_limit_error"
    # the counts spent the rate: a generation after them is refused too, before the upstream hears of it
    body = {**COUNT, "max_tokens": 8}
    r = httpx.post(f"{srv.url}/v1/messages", json=body, headers={"x-api-key": raw["rpm"]}, timeout=30)
    assert r.status_code == 429
    # a budget does not see a count: the key too poor to generate counts freely, and no row is written
    for _ in range(5):
        r = httpx.post(
            f"{srv.url}/v1/messages/count_tokens", json=COUNT, headers={"x-api-key": raw["broke"]}, timeout=30
        )
        assert r.status_code == 200 and r.json()["input_tokens"] > 0, r.text
    assert len(upstream.requests) == heard
    assert not [e for e in read_ledger(ledger_of(srv)).values() if e.key_id in ("rpm", "broke")]


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_same_key_in_both_headers_is_one_key_whatever_its_schemes_case(
    keyed: tuple[UvicornThread, dict], scheme: str
) -> None:
    srv, raw = keyed
    headers = {"authorization": f"{scheme} {raw['free']}", "x-api-key": raw["free"]}
    r = httpx.post(f"{srv.url}/v1/messages/count_tokens", json=COUNT, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    other = {**headers, "x-api-key": raw["rpm"]}
    r = httpx.post(f"{srv.url}/v1/messages/count_tokens", json=COUNT, headers=other, timeout=30)
    assert r.status_code == 401 and "Two different API keys" in r.text


def test_a_failed_responses_stream_keeps_the_message_it_sent(
    keyed: tuple[UvicornThread, dict], upstream: FaultUpstream
) -> None:
    """The upstream's stream breaks after two tokens: the client was sent their text as deltas,
    and the last event's response lists that message (incomplete, with that text)."""
    srv, raw = keyed
    upstream.script(broken_stream(2, "cut"))
    body = {"model": "large", "input": QUESTION, "max_output_tokens": 16, "stream": True}
    r = httpx.post(f"{srv.url}/v1/responses", json=body, headers=auth(raw["free"]), timeout=30)
    events = named_events(r.text)
    sent = "".join(d["delta"] for kind, d in events if kind == "response.output_text.delta")
    assert sent, r.text
    kind, last = events[-1]
    assert kind == "response.failed", r.text
    (message,) = last["response"]["output"]
    assert message["type"] == "message" and message["status"] == "incomplete"
    assert message["content"][0]["text"] == sent
    assert message["id"] == next(d["item"]["id"] for k, d in events if k == "response.output_item.added")
