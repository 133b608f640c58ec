"""Hostile requests against the real app serving the real SmolLM2 model.

Each request below is one an attacker or a broken client could send. Every one must get a 4xx in
OpenAI's error shape, or a bounded 200, and never a 5xx other than 503 with Retry-After; and
after each, a normal request to the same process must be answered within 5 s (the engine thread
survived it). One server for the module: the normal request after each case is what proves it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.admission.auth import Authenticator, hash_key, new_key
from router.api.app import create_app
from router.api.requests import ChatCompletionRequest
from router.backends.instant import InstantBackend
from router.config import load_settings
from tests.support.config import smol_config, smol_settings
from tests.support.hostile import CASES, CHAT, Case, chat
from tests.support.servers import UvicornThread


def one_thread_config(tmp: Path) -> Path:
    """The small tier alone, decoding on one thread: the 5 s answer must hold on a busy machine,
    where a second decode thread mostly waits for a core."""
    cfg = smol_config(tmp, large="none")
    return cfg


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[UvicornThread]:
    cfg = one_thread_config(tmp_path_factory.mktemp("hostile"))
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield srv


def send(url: str, case: Case) -> httpx.Response:
    headers = {"content-type": "application/json", **case.headers}
    if isinstance(case.body, bytes):
        content = case.body
    elif case.body is None and case.method == "GET":
        content = None
    else:
        content = json.dumps(case.body).encode()
    return httpx.request(case.method, f"{url}{case.path}", content=content, headers=headers, timeout=60)


def assert_answerable(resp: httpx.Response, ok: frozenset[int]) -> None:
    """A 4xx in OpenAI's shape, a 503 with Retry-After, or a 200 among the expected statuses."""
    assert resp.status_code in ok | {503}, resp.text[:500]
    if resp.status_code == 503:
        assert int(resp.headers["retry-after"]) >= 1
    if resp.status_code >= 400:
        err = resp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert "Traceback" not in resp.text


def assert_still_serving(url: str) -> None:
    t0 = time.monotonic()
    resp = httpx.post(f"{url}{CHAT}", json=chat(max_tokens=2), timeout=5)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] is not None
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_request_is_refused_or_bounded_and_the_service_survives(server: UvicornThread, name: str) -> None:
    case = CASES[name]
    resp = send(server.url, case)
    assert_answerable(resp, case.ok)
    if case.param is not None and resp.status_code == 400:
        assert resp.json()["error"]["param"] == case.param, resp.text
    if resp.status_code == 200 and case.method == "POST" and case.path == CHAT:
        if case.body and b'"stream": true' in (
            case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
        ):
            assert resp.text.rstrip().endswith("data: [DONE]")
        else:
            assert resp.json()["usage"]["completion_tokens"] <= 48  # bounded by the tier's max_tokens
    assert_still_serving(server.url)


def test_there_are_enough_hostile_cases() -> None:
    assert len(CASES) >= 40


def test_errors_name_the_problem(server: UvicornThread) -> None:
    surrogate = send(server.url, CASES["lone surrogate in content"]).json()["error"]
    assert "surrogate" in surrogate["message"]
    nan = send(server.url, CASES["temperature NaN"]).json()["error"]
    assert "NaN" in nan["message"]
    forbidden = send(server.url, CASES["tests without permission"]).json()["error"]
    assert (forbidden["type"], forbidden["param"], forbidden["code"]) == (
        "permission_error",
        "tierroute.tests",
        "tests_not_allowed",
    )
    assert "--allow-tests" in forbidden["message"]
    logprobs = send(server.url, CASES["top_logprobs without logprobs"]).json()["error"]
    assert "logprobs must be set to true" in logprobs["message"]
    legacy = send(server.url, CASES["completions top_logprobs"]).json()["error"]
    assert "use logprobs" in legacy["message"]
    host = send(server.url, CASES["Host not allowed"]).json()["error"]
    assert host["code"] == "host_not_allowed"


def test_keyless_loopback_serves_its_docs_to_loopback_names_only(server: UvicornThread) -> None:
    assert httpx.get(f"{server.url}/openapi.json").status_code == 200
    assert httpx.get(f"{server.url}/docs").status_code == 200
    assert httpx.get(f"{server.url}/openapi.json", headers={"host": "evil.example"}).status_code == 400


def test_an_engine_crash_makes_the_tier_unavailable_then_it_restarts(server: UvicornThread) -> None:
    """A fault in the shared decode step (injected from here, by wrapping the engine's step):
    the request in flight gets 503 with Retry-After, /readyz says 503 while the model reloads, no
    tokenize touches the freed model, and the engine comes back by itself."""
    engine = server.server.config.app.state.services.engine.backends["small"].engine
    real_step = engine._step
    fired = threading.Event()

    def broken_step(running: Any) -> None:
        if not fired.is_set():
            fired.set()
            raise RuntimeError("injected decode failure")
        real_step(running)

    engine._step = broken_step
    try:
        restarts = engine.restarts
        resp = httpx.post(f"{server.url}{CHAT}", json=chat(), timeout=30)
        assert resp.status_code == 503 and int(resp.headers["retry-after"]) >= 1
        assert resp.json()["error"]["code"] == "service_unavailable"
        saw_not_ready = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready = httpx.get(f"{server.url}/readyz")
            if ready.status_code == 503:
                saw_not_ready = True
                during = httpx.post(f"{server.url}{CHAT}", json=chat(), timeout=30)
                assert during.status_code in (200, 503)  # 200 only if it came back in between
            elif saw_not_ready:
                break
            time.sleep(0.05)
        assert saw_not_ready
        assert httpx.get(f"{server.url}/readyz").status_code == 200
        assert httpx.get(f"{server.url}/healthz").status_code == 200
        assert engine.restarts == restarts + 1
        assert_still_serving(server.url)
    finally:
        engine._step = real_step


# ---- keyed serving: docs and client tests behind the keys ----------------------------------------


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A server with keys (an instant backend: these checks are about the HTTP layer)."""
    plain, tester = new_key(), new_key()
    server = (
        "docs = true\n"
        f'[[server.api_keys]]\nname = "plain"\nhash = "{hash_key(plain)}"\n'
        f'[[server.api_keys]]\nname = "tester"\nhash = "{hash_key(tester)}"\nallow_tests = true\n'
    )
    cfg = smol_config(tmp_path_factory.mktemp("keyed"), large="none", server=server)
    app = create_app(load_settings(cfg), backends={"small": InstantBackend("small", "def f(x):\n    return 2 * x")})
    with UvicornThread(app) as srv:
        yield srv.url, {"plain": plain, "tester": tester}


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc"])
def test_docs_need_a_key_when_there_are_keys(keyed: tuple[str, dict[str, str]], path: str) -> None:
    url, keys = keyed
    resp = httpx.get(f"{url}{path}")
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{url}{path}", headers={"authorization": f"Bearer {keys['plain']}"}).status_code == 200


def test_keyed_server_answers_any_host(keyed: tuple[str, dict[str, str]]) -> None:
    # behind a reverse proxy the Host is the public name: with keys there is no rebinding to stop
    url, keys = keyed
    resp = httpx.get(
        f"{url}/v1/models", headers={"host": "api.example.com", "authorization": f"Bearer {keys['plain']}"}
    )
    assert resp.status_code == 200


def test_a_key_without_the_permission_cannot_send_tests(keyed: tuple[str, dict[str, str]]) -> None:
    url, keys = keyed
    body = chat(model="small", tierroute={"tests": "assert f(2) == 4"})
    resp = httpx.post(f"{url}{CHAT}", json=body, headers={"authorization": f"Bearer {keys['plain']}"})
    assert resp.status_code == 403 and resp.json()["error"]["type"] == "permission_error"
    # no tests, or empty ones, are not a request to run code
    for harmless in (chat(model="small"), chat(model="small", tierroute={"tests": ""})):
        ok = httpx.post(f"{url}{CHAT}", json=harmless, headers={"authorization": f"Bearer {keys['plain']}"})
        assert ok.status_code == 200


def test_the_permission_travels_from_the_key_to_the_generation_request(tmp_path: Path) -> None:
    """The permission as the route hands it over: the key's principal to to_generation."""
    tester, plain = new_key(), new_key()
    cfg = smol_config(
        tmp_path,
        large="none",
        server=(
            f'[[server.api_keys]]\nname = "tester"\nhash = "{hash_key(tester)}"\nallow_tests = true\n'
            f'[[server.api_keys]]\nname = "plain"\nhash = "{hash_key(plain)}"\n'
        ),
    )
    auth = Authenticator(load_settings(cfg).server)
    body = ChatCompletionRequest.model_validate(chat(tierroute={"tests": ["assert f(2) == 4"]}))
    allowed = auth.authenticate(f"Bearer {tester}")
    assert body.to_generation(48, may_send_tests=allowed.may_send_tests).metadata == {
        "client_code": True,
        "tests": ["assert f(2) == 4"],
    }
    from router.api.errors import PermissionDenied

    with pytest.raises(PermissionDenied):
        body.to_generation(48, may_send_tests=auth.authenticate(f"Bearer {plain}").may_send_tests)
    with pytest.raises(PermissionDenied):
        body.to_generation(48)  # the default is no permission


def test_keyless_serving_allows_tests_only_behind_its_switch(tmp_path: Path) -> None:
    closed = smol_settings(tmp_path, large="none")
    assert Authenticator(closed.server).authenticate(None).may_send_tests is False
    opened = load_settings(
        smol_config(
            tmp_path, large="none", server="allow_unauthenticated = true\nallow_client_tests_without_keys = true"
        )
    )
    assert Authenticator(opened.server).authenticate(None).may_send_tests is True


def test_tiny_temperatures_are_greedy_and_seeds_pass_through() -> None:
    gen = ChatCompletionRequest.model_validate(chat(temperature=1e-300, seed=-1)).to_generation(48)
    assert gen.temperature == 0.0 and gen.seed == -1
    kept = ChatCompletionRequest.model_validate(chat(temperature=0.5, top_p=None)).to_generation(48)
    assert (kept.temperature, kept.top_p) == (0.5, 1.0)


@pytest.mark.slow
def test_a_key_with_the_permission_gets_its_tests_run(tmp_path: Path) -> None:
    """End to end over HTTP: a key created with --allow-tests sends tests, they run in the sandbox
    against the answer, and the response reports counts, never the sandbox's output."""
    tester = new_key()
    server = f'[[server.api_keys]]\nname = "tester"\nhash = "{hash_key(tester)}"\nallow_tests = true\n'
    cfg = smol_config(tmp_path, large="none", server=server, verifiers='[[tiers.verifiers]]\nname = "code_tests"\n')
    app = create_app(load_settings(cfg), backends={"small": InstantBackend("small", "def f(x):\n    return 2 * x")})
    with UvicornThread(app) as srv:
        for tests, expected in (("assert f(2) == 4", 1.0), ("assert f(2) == 5", 0.0)):
            body = chat(model="small", max_tokens=32, tierroute={"tests": tests})
            resp = httpx.post(f"{srv.url}{CHAT}", json=body, headers={"authorization": f"Bearer {tester}"}, timeout=60)
            assert resp.status_code == 200, resp.text
            score = resp.json()["tierroute"]["attempts"][0]["scores"]["code_tests"]
            assert score["score"] == expected
            assert "Traceback" not in json.dumps(score)
