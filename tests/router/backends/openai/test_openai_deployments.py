"""An `openai` tier with two deployments, each a scripted upstream on loopback: a failure at one is
answered by the other before the tier counts as failed, and each keeps its own breaker, Retry-After
mark, load and probe. Every test counts the requests each upstream received."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from router.backends.openai import OpenAIBackend
from router.config import DeploymentSettings, OpenAIBackendSettings
from router.errors import CircuitOpenError, DeadlineError, OverloadedError, UpstreamError
from router.generation import Delta, GenerationRequest, Message
from tests.support.fault_upstream import (
    TOKENS,
    FaultUpstream,
    broken_stream,
    delayed,
    hang,
    malformed,
    ok,
    raw,
    reset,
    status,
)

TEXT = "".join(TOKENS)
CHAT = GenerationRequest(messages=(Message("user", "Say hello."),))


@contextlib.asynccontextmanager
async def two(
    a: FaultUpstream, b: FaultUpstream, *, timeout_s: float = 5.0, **config: Any
) -> AsyncIterator[OpenAIBackend]:
    """A tier whose deployments are `a` then `b`, under ordered failover unless told otherwise, so a
    test knows where each request goes first."""
    deployments = [
        DeploymentSettings(base_url=a.base_url, name="a", **config.pop("at_a", {})),
        DeploymentSettings(base_url=b.base_url, name="b", **config.pop("at_b", {})),
    ]
    settings = {
        "model": "fake-large",
        "deployments": deployments,
        "strategy": "ordered_failover",
        "max_attempts": 2,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        "breaker_failures": 100,
        **config,
    }
    backend = OpenAIBackend("large", OpenAIBackendSettings(**settings), timeout_s=timeout_s)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


@pytest.mark.parametrize(
    "fault",
    [status(500), status(503), reset(), malformed(), status(429, headers={"Retry-After": "2"})],
    ids=["500", "503", "reset", "malformed", "429"],
)
async def test_a_failure_at_one_deployment_is_answered_by_the_other_at_once(
    upstream: FaultUpstream, second: FaultUpstream, fault: Any
) -> None:
    upstream.script(fault)
    async with two(upstream, second, backoff_initial_s=1.0, backoff_max_s=1.0) as backend:
        started = time.monotonic()
        gen = await backend.generate(CHAT)
        assert time.monotonic() - started < 0.9  # moved on without the 1 s backoff
    assert (gen.text, gen.deployment) == (TEXT, "b")
    assert (len(upstream.requests), len(second.requests)) == (1, 1)


async def test_a_stream_that_fails_before_its_first_token_moves_invisibly(
    upstream: FaultUpstream, second: FaultUpstream
) -> None:
    upstream.script(broken_stream(0, "cut"))
    async with two(upstream, second) as backend:
        items = [item async for item in backend.stream(CHAT)]
    pieces = [i for i in items if isinstance(i, Delta)]
    assert "".join(p.text for p in pieces) == TEXT  # nothing of the failed attempt reached the caller
    assert {p.deployment for p in pieces} == {"b"} and items[-1].deployment == "b"  # type: ignore[union-attr]


async def test_a_stream_that_fails_after_its_first_token_ends_there(
    upstream: FaultUpstream, second: FaultUpstream
) -> None:
    upstream.script(broken_stream(2, "cut"))
    async with two(upstream, second) as backend:
        pieces: list[Delta] = []
        with pytest.raises(UpstreamError, match="broke after"):
            async for item in backend.stream(CHAT):
                assert isinstance(item, Delta)
                pieces.append(item)
    assert "".join(p.text for p in pieces) == "".join(TOKENS[:2]) and pieces[-1].deployment == "a"
    assert len(second.requests) == 0  # text was sent: another deployment would repeat it


async def test_retry_after_marks_that_deployment_only(upstream: FaultUpstream, second: FaultUpstream) -> None:
    upstream.script(status(429, headers={"Retry-After": "30"}))
    async with two(upstream, second) as backend:
        for _ in range(3):
            assert (await backend.generate(CHAT)).deployment == "b"
        stats = backend.deployment_stats()
        assert stats["a"]["marked"] == 1.0 and stats["b"]["marked"] == 0.0
    assert (len(upstream.requests), len(second.requests)) == (1, 3)  # the marked one was left alone


async def test_an_open_breaker_takes_no_traffic_and_the_other_serves(
    upstream: FaultUpstream, second: FaultUpstream
) -> None:
    upstream.script(status(500), status(500))
    async with two(upstream, second, breaker_failures=2, breaker_cooldown_s=60) as backend:
        for _ in range(2):
            assert (await backend.generate(CHAT)).deployment == "b"
        assert backend.deployment_stats()["a"]["breaker_open"] == 1.0
        for _ in range(3):
            assert (await backend.generate(CHAT)).deployment == "b"
        assert backend.stats()["breaker_open"] == 0.0  # the tier is up while one deployment is
    assert (len(upstream.requests), len(second.requests)) == (2, 5)


async def test_when_every_deployment_fails_the_tier_fails(upstream: FaultUpstream, second: FaultUpstream) -> None:
    upstream.script(*[status(500)] * 2)
    second.script(*[status(502)] * 2)
    async with two(upstream, second) as backend:
        with pytest.raises(UpstreamError, match="gave up after 4 attempts"):
            await backend.generate(CHAT)
    assert (len(upstream.requests), len(second.requests)) == (2, 2)  # each spent its own tries


async def test_every_breaker_open_is_refused_without_a_request(upstream: FaultUpstream, second: FaultUpstream) -> None:
    upstream.script(status(500))
    second.script(status(500))
    async with two(upstream, second, max_attempts=1, breaker_failures=1, breaker_cooldown_s=60) as backend:
        with pytest.raises(UpstreamError):
            await backend.generate(CHAT)
        with pytest.raises(CircuitOpenError):
            await backend.generate(CHAT)
        assert backend.stats()["breaker_open"] == 1.0
    assert (len(upstream.requests), len(second.requests)) == (1, 1)


@pytest.mark.slow  # waits out real timeouts: seconds of wall time
async def test_a_hanging_deployment_leaves_the_other_time_to_answer(
    upstream: FaultUpstream, second: FaultUpstream
) -> None:
    upstream.script(hang(30))
    async with two(upstream, second, timeout_s=4.0) as backend:
        started = time.monotonic()
        gen = await backend.generate(CHAT)
        took = time.monotonic() - started
    assert gen.deployment == "b"
    assert 1.5 < took < 3.5  # half the deadline at the first, then the answer


@pytest.mark.slow  # waits out real timeouts: seconds of wall time
async def test_a_set_attempt_timeout_is_used_while_others_are_untried(
    upstream: FaultUpstream, second: FaultUpstream
) -> None:
    upstream.script(hang(30))
    second.script(hang(30))
    async with two(upstream, second, timeout_s=3.0, attempt_timeout_s=0.5, max_attempts=1) as backend:
        started = time.monotonic()
        with pytest.raises(DeadlineError):
            await backend.generate(CHAT)
        took = time.monotonic() - started
    assert 2.5 < took < 4.0  # 0.5 s at a, then all that was left at b: the last try is not cut short


async def test_max_concurrent_sends_the_overflow_to_the_other(upstream: FaultUpstream, second: FaultUpstream) -> None:
    upstream.default = delayed(0.3, ok())
    async with two(upstream, second, at_a={"max_concurrent": 2}) as backend:
        gens = await asyncio.gather(*(backend.generate(CHAT) for _ in range(5)))
    assert sorted(g.deployment or "" for g in gens) == ["a", "a", "b", "b", "b"]


async def test_every_deployment_full_is_overloaded(upstream: FaultUpstream, second: FaultUpstream) -> None:
    upstream.default = second.default = delayed(0.3, ok())
    async with two(upstream, second, at_a={"max_concurrent": 1}, at_b={"max_concurrent": 1}) as backend:
        results = await asyncio.gather(*(backend.generate(CHAT) for _ in range(3)), return_exceptions=True)
    assert sum(isinstance(r, OverloadedError) for r in results) == 1
    assert (len(upstream.requests), len(second.requests)) == (1, 1)


@pytest.mark.slow  # waits out real timeouts: seconds of wall time
async def test_least_outstanding_keeps_a_slow_deployment_to_its_share(
    upstream: FaultUpstream, second: FaultUpstream
) -> None:
    upstream.default = delayed(0.5, ok())
    async with two(upstream, second, strategy="least_outstanding") as backend:

        async def loop() -> None:
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                await backend.generate(CHAT)

        await asyncio.gather(*(loop() for _ in range(4)))
    # the slow one holds about half the loops at a time; the fast one answers everything else
    assert len(second.requests) > 3 * len(upstream.requests)


async def test_a_deployment_failing_its_probe_takes_no_requests(upstream: FaultUpstream, second: FaultUpstream) -> None:
    models = raw(200, b'{"object": "list", "data": [{"id": "fake-large", "object": "model"}]}')
    answer = ok()

    async def healthy(conn: Any, req: Any) -> bool:  # GET /models for the probe, POST for requests
        return await (models if req.method == "GET" else answer)(conn, req)

    upstream.default, second.default = status(503), healthy
    async with two(upstream, second, probe_interval_s=0.2) as backend:
        for _ in range(100):  # the first probes, however loaded the machine
            stats = backend.deployment_stats()
            if stats["a"]["probe_ok"] == 0.0 and any(r.method == "GET" for r in second.requests):
                break
            await asyncio.sleep(0.05)
        assert (stats["a"]["probe_ok"], stats["b"]["probe_ok"]) == (0.0, 1.0)
        assert (await backend.generate(CHAT)).deployment == "b"  # ordered failover would pick a first
    assert [r.path for r in upstream.requests if r.method == "POST"] == []


async def test_cross_tier_scoring_fails_over_too(upstream: FaultUpstream, second: FaultUpstream) -> None:
    pieces = ("17", " *", " 3")
    positions: list[Any] = [None, {"9": {"logprob": -2.0, "rank": 1, "decoded_token": "q"}}]
    positions += [{str(100 + i): {"logprob": -0.5, "rank": 1, "decoded_token": p}} for i, p in enumerate(pieces)]
    choice = {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}
    body = {"id": "c", "object": "chat.completion", "model": "m", "choices": [choice], "prompt_logprobs": positions}
    upstream.script(reset())
    second.script(raw(200, json.dumps(body).encode()))
    async with two(upstream, second, prompt_logprobs="vllm") as backend:
        scored = await backend.score_continuation(CHAT, "".join(pieces))
    assert scored.token_logprobs == (-0.5, -0.5, -0.5)
    assert (len(upstream.requests), len(second.requests)) == (1, 1)


async def test_each_deployment_is_sent_its_own_model_name(upstream: FaultUpstream, second: FaultUpstream) -> None:
    # `b` names the tier's model as its provider does: that name, not the tier's, is on its wire,
    # and a failover from `a` to `b` changes the name with the deployment, plain and streamed
    upstream.script(status(500), status(500))
    async with two(upstream, second, at_b={"model": "b-own-name"}) as backend:
        plain = await backend.generate(CHAT)
        streamed = [d async for d in backend.stream(CHAT)][-1]
        upstream.default = ok()
        direct = await backend.generate(CHAT)  # ordered failover: `a` first, now that it answers
    assert (plain.deployment, streamed.deployment, direct.deployment) == ("b", "b", "a")  # type: ignore[union-attr]
    assert [r.body["model"] for r in upstream.requests] == ["fake-large"] * 3
    assert [(r.body["model"], r.streaming) for r in second.requests] == [("b-own-name", False), ("b-own-name", True)]


async def test_judge_scoring_fails_over_too(upstream: FaultUpstream, second: FaultUpstream) -> None:
    # the `judge` verifier reaches its tier through the backend: `a` resets, `b` grades the answer
    from tests.support.openai_backend import chat_body
    from tests.support.scripted import gen
    from verifiers.base import VerifierContext
    from verifiers.judge import JudgeVerifier

    upstream.script(reset())
    second.script(raw(200, chat_body("Names Paris, which is right.\nSCORE: 8")))
    async with two(upstream, second) as backend:
        judge = JudgeVerifier(tier="large", ctx=VerifierContext("small", backend, {"large": backend}))
        scored = await judge.score(CHAT, gen("Paris."))
    assert scored.value == pytest.approx(0.8), scored.reason
    assert (len(upstream.requests), len(second.requests)) == (1, 1)
    assert "Paris." in json.dumps(second.requests[0].body["messages"])  # the judge's prompt, answered by `b`


def test_a_tier_lists_base_url_or_deployments_and_names_them_apart() -> None:
    one = DeploymentSettings(base_url="http://127.0.0.1:8001/v1")
    assert one.label == "127.0.0.1:8001"
    assert DeploymentSettings(base_url="https://api.example.com/v1").label == "api.example.com"
    with pytest.raises(ValueError, match="either base_url or"):
        OpenAIBackendSettings(model="m")
    with pytest.raises(ValueError, match="either base_url or"):
        OpenAIBackendSettings(model="m", base_url="http://x/v1", deployments=[one])
    with pytest.raises(ValueError, match="names must differ"):
        OpenAIBackendSettings(model="m", deployments=[one, one])
    tier = OpenAIBackendSettings(
        model="m",
        api_key_env="TIER_KEY",
        deployments=[one, DeploymentSettings(base_url="http://h/v1", name="own", api_key_env="OWN", model="m2")],
    )
    found = tier.resolved_deployments()
    assert [(d.label, d.api_key_env, d.model) for d in found] == [
        ("127.0.0.1:8001", "TIER_KEY", None),
        ("own", "OWN", "m2"),
    ]


@pytest.mark.parametrize("field", ["probe_interval_s", "attempt_timeout_s"])
def test_the_deployment_timings_have_a_floor(field: str) -> None:
    # 1e-9 was accepted: probes back to back, or every try but the last timed out at once
    from pydantic import ValidationError

    from router.config import OpenAIBackendSettings

    with pytest.raises(ValidationError, match=field):
        OpenAIBackendSettings(base_url="http://127.0.0.1:9/v1", model="m", **{field: 1e-9})
    OpenAIBackendSettings(base_url="http://127.0.0.1:9/v1", model="m", **{field: 0.5})
