"""The `openai` backend against a real OpenAI-compatible server: llama-cpp-python's, on SmolLM2.

The scripted upstream proves the failure policy; this proves the happy path parses what a real
server sends (its logprob and usage shapes, its stream framing), chat and completions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from router.backends.openai import OpenAIBackend
from router.config import OpenAIBackendSettings
from router.generation import Delta, Generation, GenerationRequest, Message
from tests.support.servers import llama_cpp_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server_url(smol_path: Path) -> Iterator[str]:
    with llama_cpp_server(smol_path) as url:
        yield url


async def _backend(url: str) -> OpenAIBackend:
    backend = OpenAIBackend(
        "large",
        OpenAIBackendSettings(base_url=url, model="smol", backoff_initial_s=0.1, backoff_max_s=0.5),
        timeout_s=60,
    )
    await backend.start()
    return backend


async def _stream(backend: OpenAIBackend, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
    async for item in backend.stream(request):
        yield item


@pytest.mark.parametrize(
    "request_",
    [
        GenerationRequest(messages=(Message("user", "Name a colour."),), max_tokens=8),
        GenerationRequest(prompt="The capital of France is", max_tokens=8),
    ],
    ids=["chat", "completions"],
)
async def test_generate_and_stream_parse_a_real_server(server_url: str, request_: GenerationRequest) -> None:
    backend = await _backend(server_url)
    try:
        whole = await backend.generate(request_)
        pieces: list[str] = []
        streamed: Generation | None = None
        async for item in _stream(backend, request_):
            if isinstance(item, Delta):
                pieces.append(item.text)
            else:
                streamed = item
    finally:
        await backend.close()
    assert streamed is not None
    # The server's prompt cache makes even greedy answers differ between calls, so each answer is
    # checked on its own rather than against the other.
    assert whole.text and streamed.text == "".join(pieces)
    assert whole.prompt_tokens > 0 and 0 < whole.completion_tokens <= 8  # from usage
    assert 0 < streamed.completion_tokens <= 8  # this server sends no usage chunk: counted
    assert streamed.ttft_s is not None and streamed.ttft_s <= streamed.latency_s
    for gen in (whole, streamed):
        assert gen.token_logprobs is not None
        assert len(gen.token_logprobs) == gen.completion_tokens
        assert all(lp <= 0.0 for lp in gen.token_logprobs)
    assert backend.stats()["upstream_retries_total"] == 0
