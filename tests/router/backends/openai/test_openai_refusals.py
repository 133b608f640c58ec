"""A refusal in words naming an optional parameter decides for that request alone; the deployment
stops sending the parameter only when a probe of the tier's own is refused with it
(`router.backends.openai.refusals`). The upstream is the scripted server on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

from router.generation import GenerationRequest, Message
from tests.support.fault_upstream import FaultUpstream, Received, delayed, honest, ok, status
from tests.support.openai_backend import backend_for, collect

CHAT = GenerationRequest(messages=(Message("user", "Pick one."),), max_tokens=8)


def probes(upstream: FaultUpstream) -> list[Received]:
    return [r for r in upstream.requests if r.body.get("max_tokens") == 1]


async def test_a_top_logprobs_over_the_servers_limit_is_that_requests_alone(upstream: FaultUpstream) -> None:
    # vLLM with --max-logprobs 5: top_logprobs=10 is refused in words naming logprobs
    upstream.default = honest(" a", max_logprobs=5)
    async with backend_for(upstream) as backend:
        greedy = await backend.generate(CHAT.with_(top_logprobs=10))
        again = await backend.generate(CHAT.with_(top_logprobs=10))
        plain = await backend.generate(CHAT)
        assert backend.gives_logprobs
        assert backend.deployment_stats()[backend.pool.deployments[0].name]["refusal_probes_total"] == 1
    assert greedy.token_logprobs is None and again.token_logprobs is None  # those two went without
    assert plain.token_logprobs is not None and len(plain.token_logprobs) == 8
    # one probe: the tier's own one-token request, with logprobs, answered (and remembered)
    assert [p.body.get("logprobs") for p in probes(upstream)] == [True]
    assert probes(upstream)[0].body["top_logprobs"] == 0


async def test_concurrent_refusals_wait_for_one_probe(upstream: FaultUpstream) -> None:
    async def slow_probe(conn: Any, req: Received) -> bool:
        if req.body.get("max_tokens") == 1:
            return await delayed(0.3, ok())(conn, req)
        return await honest(" a", max_logprobs=5)(conn, req)

    upstream.default = slow_probe
    async with backend_for(upstream) as backend:
        answers = await asyncio.gather(*(backend.generate(CHAT.with_(top_logprobs=10)) for _ in range(5)))
        assert backend.gives_logprobs
    assert all(a.token_logprobs is None for a in answers)
    assert len(probes(upstream)) == 1


async def test_a_probe_that_gets_no_answer_teaches_nothing(upstream: FaultUpstream) -> None:
    async def failing_probe(conn: Any, req: Received) -> bool:
        if req.body.get("max_tokens") == 1:
            return await status(503)(conn, req)
        return await honest(" a", max_logprobs=5)(conn, req)

    upstream.default = failing_probe
    async with backend_for(upstream) as backend:
        answer = await backend.generate(CHAT.with_(top_logprobs=10))
        later = await backend.generate(CHAT)
        assert backend.gives_logprobs
    assert answer.token_logprobs is None and later.token_logprobs is not None


async def test_a_stream_refused_in_words_naming_stream_options_goes_without_them_alone(upstream: FaultUpstream) -> None:
    # a refusal that names stream_options in a client's own words (its stop string, echoed back)
    async def echoing(conn: Any, req: Received) -> bool:
        if req.body.get("stop"):
            return await status(400, f"invalid stop sequence {req.body['stop'][0]!r}")(conn, req)
        return await ok()(conn, req)

    upstream.default = echoing
    async with backend_for(upstream) as backend:
        pieces, _ = await collect(backend, CHAT)
        assert "stream_options" not in backend.pool.deployments[0].refused
        try:
            await collect(backend, CHAT.with_(stop=("stream_options",)))
        except Exception as exc:  # noqa: BLE001 - the client's stop is refused: its 400
            refused = exc
        assert "stream_options" not in backend.pool.deployments[0].refused
    assert pieces and type(refused).__name__ == "RequestError"
    streamed = [r for r in upstream.requests if r.streaming and r.body.get("max_tokens") != 1]
    assert ["stream_options" in r.body for r in streamed] == [True, True, False]
