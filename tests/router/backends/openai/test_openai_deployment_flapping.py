"""A deployment that flaps, up for one probe and down for the next, against fault-injecting upstreams
on loopback: hysteresis keeps traffic off it until it has been good several times in a row, both
for the active probe (`probe_successes`) and for the breaker's half-open probes (`breaker_successes`).

Found by the outside review's question: one good probe re-admitted a deployment at once, so one that
alternated was sent traffic at every other probe, and a breaker closed by one good call took every
request again (its failures never came `breaker_failures` in a row, so it never opened).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from router.backends.openai import OpenAIBackend
from router.config import DeploymentSettings, OpenAIBackendSettings
from router.generation import GenerationRequest, Message
from tests.support.fault_upstream import FaultUpstream, Received, ok, raw, status

CHAT = GenerationRequest(messages=(Message("user", "Say hello."),))
MODELS = raw(200, b'{"object": "list", "data": [{"id": "fake-large", "object": "model"}]}')


@contextlib.asynccontextmanager
async def two(a: FaultUpstream, b: FaultUpstream, **config: Any) -> AsyncIterator[OpenAIBackend]:
    """Deployments `a` then `b` under ordered failover: every request goes to `a` when it may."""
    settings = {
        "model": "fake-large",
        "deployments": [
            DeploymentSettings(base_url=a.base_url, name="a"),
            DeploymentSettings(base_url=b.base_url, name="b"),
        ],
        "strategy": "ordered_failover",
        "max_attempts": 1,
        **config,
    }
    backend = OpenAIBackend("large", OpenAIBackendSettings(**settings), timeout_s=5.0)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


def posts(server: FaultUpstream) -> int:
    return sum(r.method == "POST" for r in server.requests)


async def test_a_deployment_flapping_between_probes_is_not_readmitted_at_each_pass(
    upstream: FaultUpstream, second: FaultUpstream
) -> None:
    flapping = True
    probes = 0

    async def flaps(conn: Any, req: Received) -> bool:
        """Its probe fails, passes, fails, ... while flapping; a request fails while its last probe did."""
        nonlocal probes
        if req.method == "GET":
            probes += 1
            up = not flapping or probes % 2 == 0
            return await (MODELS if up else status(503))(conn, req)
        return await (ok() if not flapping or probes % 2 == 0 else status(503))(conn, req)

    async def healthy(conn: Any, req: Received) -> bool:
        return await (MODELS if req.method == "GET" else ok())(conn, req)

    upstream.default, second.default = flaps, healthy
    async with two(upstream, second, probe_interval_s=0.05) as backend:
        await until(lambda: backend.deployment_stats()["a"]["probe_ok"] == 0.0)  # its first probe failed
        before = posts(upstream)
        answered = []
        while probes < 12:  # six passes, each alone: none re-admits it
            answered.append((await backend.generate(CHAT)).deployment)
            await asyncio.sleep(0.01)
        assert backend.deployment_stats()["a"]["probe_ok"] == 0.0
        during = posts(upstream) - before
        flapping = False  # steady now: two passes in a row re-admit it
        await until(lambda: backend.deployment_stats()["a"]["probe_ok"] == 1.0)
        after = (await backend.generate(CHAT)).deployment
    assert during == 0 and set(answered) == {"b"}, (during, answered)
    assert after == "a"


async def until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.02)


async def test_a_breaker_closes_only_after_good_probes_in_a_row(upstream: FaultUpstream, second: FaultUpstream) -> None:
    # `a` fails three calls (its breaker opens), then alternates: good, bad, good, ... With one good
    # probe closing the breaker, its failures never came three in a row again, so it took every
    # other request for good. Two in a row are needed now: it gets two calls per cool-down.
    calls = 0

    async def flaps(conn: Any, req: Received) -> bool:
        nonlocal calls
        calls += 1
        return await (ok() if calls > 3 and calls % 2 == 0 else status(500))(conn, req)

    async def run(successes: int) -> tuple[int, int, float]:
        """Requests one after another for 1.5 s: how many reached `a`, how many were answered, how long."""
        nonlocal calls
        calls = 0
        upstream.requests.clear()
        upstream.default = flaps
        config = {"breaker_failures": 3, "breaker_cooldown_s": 0.3, "breaker_successes": successes}
        answered = 0
        async with two(upstream, second, **config) as backend:
            started = time.monotonic()
            while time.monotonic() - started < 1.5:
                await backend.generate(CHAT)  # failover answers what `a` fails: it never raises
                answered += 1
                await asyncio.sleep(0.01)
            elapsed = time.monotonic() - started
        return posts(upstream), answered, elapsed

    at_a, _, elapsed = await run(2)
    assert at_a <= 3 + 2 * (elapsed / 0.3 + 1), (at_a, elapsed)  # three to open it, then two per cool-down
    without, answered, _ = await run(1)
    # one good probe closed it, and it stayed closed (its failures never three in a row): after the
    # first cool-down, a fifth of the run, every request went to it first
    assert without >= answered / 2 and without > at_a, (without, answered, at_a)


async def _reopen_and_answer_once(backend: OpenAIBackend, upstream: FaultUpstream) -> str:
    """Open `upstream`'s breaker with one failure, wait out its cool-down, answer one good call there:
    the breaker's state after that call."""
    from router.errors import UpstreamError

    upstream.script(status(500))
    with contextlib.suppress(UpstreamError):
        await backend.generate(CHAT)
    first = backend.pool.deployments[0].breaker
    assert first.state == "open"
    await asyncio.sleep(0.25)  # the cool-down (0.2 s) ends: half-open
    answer = await backend.generate(CHAT)
    assert answer.deployment == backend.pool.deployments[0].name and posts(upstream) == 2, "not the probe"
    return first.state


async def test_one_good_call_closes_a_single_base_url_tier_as_before(upstream: FaultUpstream) -> None:
    # the audit's finding: the default of 2 made half-open need two good calls on every tier, so a
    # one-base_url config answered 503 for longer than it did before deployments existed
    from tests.support.openai_backend import backend_for

    config = {"breaker_failures": 1, "breaker_cooldown_s": 0.2, "max_attempts": 1}
    async with backend_for(upstream, **config) as backend:
        assert await _reopen_and_answer_once(backend, upstream) == "closed"
    upstream.requests.clear()
    async with backend_for(upstream, breaker_successes=2, **config) as backend:  # set, it is honoured
        assert await _reopen_and_answer_once(backend, upstream) == "half_open"


async def test_several_deployments_need_two_good_calls_by_default(
    upstream: FaultUpstream, second: FaultUpstream
) -> None:
    config = {"breaker_failures": 1, "breaker_cooldown_s": 0.2}
    async with two(upstream, second, **config) as backend:
        assert await _reopen_and_answer_once(backend, upstream) == "half_open"
        await backend.generate(CHAT)
        assert backend.pool.deployments[0].breaker.state == "closed"
    upstream.requests.clear()
    async with two(upstream, second, breaker_successes=1, **config) as backend:
        assert await _reopen_and_answer_once(backend, upstream) == "closed"


def test_the_breaker_successes_default_follows_the_tier_shape() -> None:
    one = DeploymentSettings(base_url="http://127.0.0.1:9/v1", name="a")
    other = DeploymentSettings(base_url="http://127.0.0.1:10/v1", name="b")
    assert OpenAIBackendSettings(model="m", base_url=one.base_url).resolved_breaker_successes == 1
    assert OpenAIBackendSettings(model="m", deployments=[one]).resolved_breaker_successes == 1
    assert OpenAIBackendSettings(model="m", deployments=[one, other]).resolved_breaker_successes == 2
    assert OpenAIBackendSettings(model="m", base_url=one.base_url, breaker_successes=3).resolved_breaker_successes == 3
