"""The real `openai` backend pointed at the scripted upstream, and what the
hostile-upstream tests send through it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from router.backends.openai import OpenAIBackend
from router.backends.openai.breaker import CircuitBreaker
from router.config import OpenAIBackendSettings
from router.generation import Delta, Generation, GenerationRequest
from tests.support.fault_upstream import PROMPT_TOKENS, TOKENS, FaultUpstream


@contextlib.asynccontextmanager
async def backend_for(
    upstream: FaultUpstream,
    *,
    timeout_s: float = 10.0,
    retry_after_s: float = 30.0,
    breaker: CircuitBreaker | None = None,
    **config: Any,
) -> AsyncIterator[OpenAIBackend]:
    settings = {
        "base_url": upstream.base_url,
        "model": "fake-large",
        "max_attempts": 3,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        "breaker_failures": 100,
        **config,
    }
    backend = OpenAIBackend(
        "large", OpenAIBackendSettings(**settings), timeout_s=timeout_s, retry_after_s=retry_after_s, breaker=breaker
    )
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


async def collect(backend: OpenAIBackend, request: GenerationRequest) -> tuple[list[str], Generation]:
    pieces: list[str] = []
    result: Generation | None = None
    async for item in backend.stream(request):
        assert result is None, "nothing may follow the Generation"
        if isinstance(item, Delta):
            pieces.append(item.text)
        else:
            result = item
    assert result is not None
    return pieces, result


TEXT = "".join(TOKENS)


SECRET = "sk-live-0123456789abcdef"
LEAKY = (
    f"upstream pool exhausted; Authorization: Bearer {SECRET} at http://10.0.7.12:9000/internal/v1 "
    'Traceback (most recent call last):\n  File "/srv/vllm/engine.py", line 12, in step'
)


def chat_body(content: Any = TEXT, **changes: Any) -> bytes:
    body: dict[str, Any] = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-large",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": len(TOKENS)},
    }
    body.update(changes)
    return json.dumps(body).encode()
