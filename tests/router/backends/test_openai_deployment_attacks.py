"""A tier of several deployments attacked from outside: hostile upstreams (scripted servers on
loopback) and a hostile config. Each test is a finding of the review that was then fixed; every
test counts what each upstream received or what the client was told."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from router.backends.openai import OpenAIBackend
from router.config import DeploymentSettings, OpenAIBackendSettings
from router.generation import Delta, Generation, GenerationRequest, Message
from tests.support.fault_upstream import TOKENS, FaultUpstream, paused_stream

TEXT = "".join(TOKENS)
CHAT = GenerationRequest(messages=(Message("user", "Say hello."),))


@pytest.fixture
def second() -> Iterator[FaultUpstream]:
    with FaultUpstream() as server:
        yield server


@contextlib.asynccontextmanager
async def tier(*servers: FaultUpstream, timeout_s: float = 4.0, **config: Any) -> AsyncIterator[OpenAIBackend]:
    """A tier whose deployments are `servers` in order (ordered failover: the first gets each
    request first), named d0, d1, ..."""
    settings = {
        "model": "fake-large",
        "deployments": [DeploymentSettings(base_url=s.base_url, name=f"d{i}") for i, s in enumerate(servers)],
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


async def streamed(backend: OpenAIBackend) -> tuple[str, Generation]:
    pieces, final = [], None
    async for item in backend.stream(CHAT):
        if isinstance(item, Delta):
            pieces.append(item.text)
        else:
            final = item
    assert final is not None
    return "".join(pieces), final


# -- a stream, once begun, has the whole deadline ------------------------------------------------


async def test_a_pause_between_tokens_is_not_cut_at_the_first_tries_share(
    upstream: FaultUpstream, second: FaultUpstream
) -> None:
    # Found: with two deployments the first try of a stream may use half the 4 s deadline, and that
    # share went to the HTTP client as its read timeout, so a 2.5 s pause after the first token (a
    # slow decode) ended the stream at 2 s as "deadline passed", 2 s before the deadline. With one
    # deployment the same stream was whole. Once text has reached the client the stream has the
    # whole deadline (router.backends.openai.call: attempt_until is None once a stream has begun).
    upstream.script(paused_stream(2, 2.5))  # the role chunk and one token, then 2.5 s of nothing
    async with tier(upstream, second, timeout_s=4.0) as backend:
        started = time.monotonic()
        text, final = await streamed(backend)
    assert text == TEXT and final.deployment == "d0"
    assert time.monotonic() - started < 4.0
    assert len(second.requests) == 0


# -- the config a tier is read from ----------------------------------------------------------------


@pytest.mark.parametrize("weight", [float("inf"), 1e308])
def test_a_weight_whose_sum_is_not_finite_is_refused_when_the_config_is_read(weight: float) -> None:
    # Found: `weight = inf` (TOML's inf) or two of 1e308 passed validation, and then every request
    # to the tier raised ValueError("Total of weights must be finite") from random.choices, under
    # weighted_random and least_outstanding's tie-break alike: a 500 for every request, not a
    # config error at start.
    with pytest.raises(ValueError, match="weight"):
        OpenAIBackendSettings(
            model="m",
            deployments=[
                DeploymentSettings(base_url="http://127.0.0.1:1/v1", name="a", weight=weight),
                DeploymentSettings(base_url="http://127.0.0.1:2/v1", name="b", weight=weight),
            ],
        )


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "unix:///run/vllm.sock", "ftp://h/v1", "http:///v1", "127.0.0.1:8000/v1", ""]
)
def test_a_base_url_that_http_cannot_reach_is_refused_when_the_config_is_read(url: str) -> None:
    # Found: any string was a base_url. httpx refuses file:// and unix:// (and a URL with no host)
    # only when the first request is sent, so the tier started, failed every try as a "connection
    # failed", opened its breaker and answered 503s, rather than the config saying what was wrong.
    with pytest.raises(ValueError, match="http"):
        DeploymentSettings(base_url=url)
    with pytest.raises(ValueError, match="http"):
        OpenAIBackendSettings(model="m", base_url=url)
