"""A hostile upstream behind the whole service: what the client sees over HTTP, through the official
`openai` client, and what the ledger records. The service runs for real on loopback with one
`openai` tier pointed at the scripted upstream (no local model is loaded)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from router.api.app import create_app
from router.config import load_settings
from tests.support.fault_upstream import TOKENS, FaultUpstream, chat_chunk, ok, raw, sse, status
from tests.support.openai_backend import LEAKY, SECRET, chat_body
from tests.support.servers import UvicornThread

ASK = [{"role": "user", "content": "Say hello."}]
TIMEOUT_S = 5


def config(tmp: Path, base_url: str) -> Path:
    path = tmp / "config.toml"
    path.write_text(f"""
[server]
allow_unauthenticated = true
[cascade]
retry_after_s = 20
[ledger]
path = "{tmp / "ledger.sqlite3"}"
[[tiers]]
name = "large"
backend = "openai"
max_tokens = 32
timeout_s = {TIMEOUT_S}
[tiers.openai]
base_url = "{base_url}"
model = "fake-large"
max_attempts = 2
backoff_initial_s = 0.01
backoff_max_s = 0.05
breaker_failures = 1000
[tiers.price]
usd_per_1m_input_tokens = 0.60
usd_per_1m_output_tokens = 2.40
""")
    return path


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    with FaultUpstream() as server:
        yield server


@pytest.fixture(scope="module")
def service(upstream: FaultUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UvicornThread, Path]]:
    tmp = tmp_path_factory.mktemp("hostile-upstream")
    with UvicornThread(create_app(load_settings(config(tmp, upstream.base_url)))) as srv:
        yield srv, tmp / "ledger.sqlite3"


@pytest.fixture
def client(service: tuple[UvicornThread, Path], upstream: FaultUpstream) -> Iterator[openai.OpenAI]:
    upstream.default = ok()
    yield openai.OpenAI(base_url=f"{service[0].url}/v1", api_key="x", max_retries=0)
    upstream.default = ok()


def refused(client: openai.OpenAI, *, stream: bool) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as info:
        if stream:
            list(client.chat.completions.create(model="large", messages=ASK, stream=True))  # type: ignore[arg-type]
        else:
            client.chat.completions.create(model="large", messages=ASK)  # type: ignore[arg-type]
    return info.value


@pytest.mark.parametrize("value", ["inf", "1e9", "nan", "-3", "Fri, 31 Dec 9999 23:59:59 GMT", None])
def test_a_failing_upstream_is_503_with_one_bounded_retry_after_and_no_leak(
    client: openai.OpenAI, upstream: FaultUpstream, value: str | None
) -> None:
    upstream.default = status(503, LEAKY, headers={"Retry-After": value} if value is not None else None)
    plain = refused(client, stream=False)
    streamed = refused(client, stream=True)
    for error in (plain, streamed):
        assert error.status_code == 503
        assert SECRET not in error.response.text and "10.0.7.12" not in error.response.text
        assert error.response.json()["error"]["code"] == "service_unavailable"
    seconds = int(plain.response.headers["retry-after"])
    assert seconds == int(streamed.response.headers["retry-after"])
    assert 1 <= seconds <= 20  # the tier's timeout, or retry_after_s when the upstream said nothing
    if value is None or value == "nan":
        assert seconds == 20


def test_a_leaky_rejection_is_400_without_the_upstream_words(client: openai.OpenAI, upstream: FaultUpstream) -> None:
    upstream.default = status(400, LEAKY, param=f"see http://10.0.7.12/{SECRET}")
    error = refused(client, stream=False)
    assert error.status_code == 400
    assert SECRET not in error.response.text and "Traceback" not in error.response.text
    assert error.response.json()["error"]["param"] is None


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_negative_usage_never_reaches_the_ledger(
    client: openai.OpenAI, upstream: FaultUpstream, service: tuple[UvicornThread, Path], stream: bool
) -> None:
    usage = {"prompt_tokens": -(10**9), "completion_tokens": -5}
    if stream:
        upstream.default = sse(
            *[chat_chunk(t) for t in TOKENS], chat_chunk(finish="stop"), {"id": "u", "choices": [], "usage": usage}
        )
        chunks = list(
            client.chat.completions.create(
                model="large", messages=ASK, stream=True, stream_options={"include_usage": True}
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        final = chunks[-1]
        extension = final.model_extra["tierroute"]
        assert final.usage is not None
        counts = (final.usage.prompt_tokens, final.usage.completion_tokens)
    else:
        upstream.default = raw(200, chat_body(usage=usage))
        answer = client.chat.completions.create(model="large", messages=ASK)
        text = answer.choices[0].message.content or ""
        extension = answer.model_extra["tierroute"]
        assert answer.usage is not None
        counts = (answer.usage.prompt_tokens, answer.usage.completion_tokens)
    assert text == "".join(TOKENS)
    assert min(counts) >= 0 and extension["cost_usd"] > 0
    with sqlite3.connect(service[1]) as db:
        row = db.execute(
            "SELECT min(cost_usd), min(prompt_tokens), min(completion_tokens) FROM requests WHERE request_id = ?",
            (extension["request_id"],),
        ).fetchone()
    assert row is not None and row[0] > 0 and row[1] >= 0 and row[2] >= 0


def test_after_hostile_answers_the_service_still_answers(
    client: openai.OpenAI, upstream: FaultUpstream, service: tuple[UvicornThread, Path]
) -> None:
    upstream.script(raw(200, b"[" * 200_000), raw(200, b"[" * 200_000), raw(500, b"x" * (5 * 1024 * 1024)))
    refused(client, stream=False)
    refused(client, stream=True)
    assert client.chat.completions.create(model="large", messages=ASK).choices[0].message.content == "".join(TOKENS)
    assert httpx.get(f"{service[0].url}/readyz").status_code == 200


@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), -5.0, 0.2])
def test_the_retry_after_header_is_always_whole_seconds(seconds: float) -> None:
    from router.api.errors import error_response
    from router.errors import UpstreamError

    response = error_response(UpstreamError("tier large: down", retry_after=seconds))
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
