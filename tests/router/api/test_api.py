"""The HTTP API through the official `openai` client and raw HTTP, against a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from router.admission.auth import hash_key, new_key
from router.api.app import create_app
from router.config import load_settings
from tests.support.config import smol_config
from tests.support.servers import UvicornThread, dead_port

ASK = [{"role": "user", "content": "What is 17 * 3?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[UvicornThread]:
    tmp = tmp_path_factory.mktemp("api")
    # threshold 0 with a real verifier: the small tier always answers, and its scores are reported
    cfg = smol_config(tmp, threshold=0.0, verifiers='[[tiers.verifiers]]\nname = "confidence"\n')
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: UvicornThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_chat_completion(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model="auto", messages=ASK, max_tokens=16)
    r = raw.parse()
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage is not None and 0 < r.usage.completion_tokens <= 16
    ext = r.model_extra["tierroute"]
    assert ext["tier"] == "small" and ext["escalated"] is False
    assert ext["attempts"][0]["scores"]["confidence"]["score"] > 0
    assert ext["cost_usd"] > 0
    assert raw.headers["x-tierroute-tier"] == "small"
    assert raw.headers["x-tierroute-escalated"] == "false"


def test_completion(client: openai.OpenAI) -> None:
    r = client.completions.create(model="small", prompt="The capital of France is", max_tokens=8)
    assert r.object == "text_completion"
    assert r.choices[0].text
    assert r.model_extra["tierroute"]["tier"] == "small"


def test_forcing_a_tier(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="large", messages=ASK, max_tokens=8)
    ext = r.model_extra["tierroute"]
    assert ext["tier"] == "large" and [a["tier"] for a in ext["attempts"]] == ["large"]


def test_streaming_chat_matches_non_streaming(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="auto", messages=ASK, max_tokens=16).choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model="auto", messages=ASK, max_tokens=16, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert last.model_extra["tierroute"]["tier"] == "small"
    assert last.usage is not None and last.usage.completion_tokens > 0


def test_streaming_completion(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="small", prompt="1, 2, 3,", max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_models(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids == ["auto", "small", "large"]


def test_health_and_ready(server: UvicornThread) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{server.url}/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True


# ---- errors ------------------------------------------------------------------------------------


def _post(server: UvicornThread, body: bytes | dict, path: str = "/v1/chat/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.url}{path}", content=content, headers={"content-type": "application/json"})


def _assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "Traceback" not in resp.text
    return err


def test_malformed_json_is_400(server: UvicornThread) -> None:
    err = _assert_openai_error(_post(server, b'{"model": "auto", "messages": ['), 400)
    assert "JSON" in err["message"]


def test_missing_field_is_400_not_422(server: UvicornThread) -> None:
    err = _assert_openai_error(_post(server, {"model": "auto"}), 400)
    assert err["param"] == "messages"


def test_invalid_values_are_400(server: UvicornThread) -> None:
    err = _assert_openai_error(_post(server, {"model": "auto", "messages": ASK, "temperature": 7}), 400)
    assert err["param"] == "temperature"
    _assert_openai_error(_post(server, {"model": "auto", "messages": ASK, "n": 9}), 400)
    _assert_openai_error(_post(server, {"model": "auto", "messages": []}), 400)
    _assert_openai_error(_post(server, {"model": "auto", "messages": [{"role": "wizard", "content": "x"}]}), 400)
    _assert_openai_error(_post(server, {"model": "small", "prompt": ["a", "b"]}, "/v1/completions"), 400)


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-17", messages=ASK)
    assert info.value.code == "model_not_found"


def test_prompt_over_context_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="small", messages=[{"role": "user", "content": "word " * 3000}])
    assert info.value.code == "context_length_exceeded"


def test_oversized_body_is_413(server: UvicornThread) -> None:
    _assert_openai_error(_post(server, b"x" * 1_100_000), 413)


def test_chunked_oversized_body_is_413(server: UvicornThread) -> None:
    def body() -> Iterator[bytes]:
        for _ in range(20):
            yield b" " * 100_000

    resp = httpx.post(f"{server.url}/v1/chat/completions", content=body(), headers={"content-type": "application/json"})
    _assert_openai_error(resp, 413)


def test_unknown_route_is_404_in_openai_shape(server: UvicornThread) -> None:
    _assert_openai_error(httpx.get(f"{server.url}/v1/nothing"), 404)


def test_server_still_serves_after_errors(client: openai.OpenAI) -> None:
    assert client.chat.completions.create(model="auto", messages=ASK, max_tokens=4).choices[0].message.content


# ---- keys and availability ----------------------------------------------------------------------


def test_api_keys_401(tmp_path: Path, smol_path: Path) -> None:
    key = new_key()
    cfg = smol_config(tmp_path, large="none", server=f'[[server.api_keys]]\nname = "ci"\nhash = "{hash_key(key)}"\n')
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        base = f"{srv.url}/v1"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
        missing = httpx.get(f"{base}/models")
        _assert_openai_error(missing, 401)
        ok = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
        assert ok.chat.completions.create(model="auto", messages=ASK, max_tokens=4).choices[0].message.content


def test_unavailable_escalation_target_is_503_with_retry_after(tmp_path: Path, smol_path: Path) -> None:
    dead = f"http://127.0.0.1:{dead_port()}/v1"  # nothing listens here
    cfg = smol_config(
        tmp_path, threshold=1.0, verifiers='[[tiers.verifiers]]\nname = "confidence"\n', large="remote", base_url=dead
    )
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="auto", messages=ASK, max_tokens=8)
        assert info.value.status_code == 503
        assert int(info.value.response.headers["retry-after"]) >= 1


def test_best_effort_returns_the_lower_tier_marked_unverified(tmp_path: Path, smol_path: Path) -> None:
    dead = f"http://127.0.0.1:{dead_port()}/v1"
    cfg = smol_config(
        tmp_path,
        threshold=1.0,
        verifiers='[[tiers.verifiers]]\nname = "confidence"\n',
        large="remote",
        base_url=dead,
        cascade='on_unavailable = "best_effort"',
    )
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(model="auto", messages=ASK, max_tokens=8)
        ext = r.model_extra["tierroute"]
        assert ext["tier"] == "small" and ext["unverified"] is True
        assert ext["attempts"][1]["tier"] == "large" and ext["attempts"][1]["error"]


@pytest.mark.parametrize(
    ("seconds", "header"),
    [(0.2, "1"), (-5, "1"), (7.1, "8"), (1e9, "3600"), (float("inf"), "3600"), (float("nan"), "3600")],
)
def test_retry_after_is_whole_seconds_within_an_hour(seconds: float, header: str) -> None:
    from router.api.errors import error_response
    from router.errors import RateLimitError, UnavailableError

    for exc in (UnavailableError("down", retry_after=seconds), RateLimitError("slow down", seconds)):
        assert error_response(exc).headers["retry-after"] == header
