"""vLLM killed under load (SIGKILL to its whole process group: a crash, an OOM kill) in a tier of
two deployments, vLLM first (`ordered_failover`) and llama-cpp-python's server on SmolLM2 second.

A request in flight when vLLM dies is answered by the second deployment; a stream that had
already sent text cannot be spliced onto another model's answer, so its client hears the error
(what it was sent stays sent) and the next requests, plain and streamed, go to the second
deployment. Both are in flight at the one kill. The test kills the session's server: it runs last
(conftest.py), and a test after it would start a new one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.errors import UnavailableError
from router.generation import Delta, Generation, GenerationRequest, Message
from tests.support.servers import llama_cpp_server
from tests.support.vllm_server import KEY_ENV, VllmServer, backend

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

LONG = GenerationRequest(
    messages=(Message("user", "Count from 1 to 200, one number a line."),), max_tokens=400, temperature=0.0
)
SHORT = GenerationRequest(messages=(Message("user", "Say hello."),), max_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def llama_url(smol_path: Path) -> Iterator[str]:
    with llama_cpp_server(smol_path) as url:
        yield url


def _deployments(vllm: VllmServer, llama_url: str) -> list[dict[str, object]]:
    return [
        {"name": "vllm", "base_url": vllm.base_url, "api_key_env": KEY_ENV},
        {"name": "llama", "base_url": llama_url, "model": "smol"},
    ]


async def _stream(b: object, request: GenerationRequest) -> tuple[list[str], Generation]:
    pieces: list[str] = []
    result: Generation | None = None
    async for item in b.stream(request):  # type: ignore[attr-defined]
        if isinstance(item, Delta):
            pieces.append(item.text)
        else:
            result = item
    assert result is not None
    return pieces, result


async def test_kill_mid_stream_and_mid_request_then_the_second_deployment_answers(
    vllm: VllmServer, llama_url: str
) -> None:
    """One kill, two requests in flight on vLLM: a plain one, which fails over and is answered by
    llama's server, and a stream that had sent text, which ends with the error. (One kill, not one
    a case: each kill costs the next test a vLLM start, most of these tests' time.)"""
    async with backend(vllm, deployments=_deployments(vllm, llama_url), strategy="ordered_failover") as b:
        warm = await b.generate(SHORT)
        assert warm.deployment == "vllm"
        in_flight = asyncio.create_task(b.generate(LONG.with_(max_tokens=200)))
        pieces: list[str] = []
        with pytest.raises(UnavailableError):
            async for item in b.stream(LONG):
                if isinstance(item, Delta):
                    pieces.append(item.text)
                    if len(pieces) == 5:
                        assert not in_flight.done()  # still decoding on vLLM (a few tokens a second here)
                        await asyncio.to_thread(vllm.kill)
        assert len(pieces) >= 5  # the text sent before the kill reached the client
        answered = await in_flight
        plain = await b.generate(SHORT)
        _, streamed = await _stream(b, SHORT)
        health = b.deployment_stats()
    assert answered.deployment == "llama" and answered.text
    assert plain.deployment == "llama" and plain.text
    assert streamed.deployment == "llama" and streamed.text
    assert health["llama"]["consecutive_failures"] == 0
