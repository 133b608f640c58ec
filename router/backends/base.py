"""The backend protocol: turn a typed generation request into text, counts and logprobs.

A backend implements one method, `stream`, an async iterator of `Delta` pieces ending with the
finished `Generation`. `generate` is derived from it. Capabilities are class attributes.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator

from router.generation import Delta, Generation, GenerationRequest


class Backend(abc.ABC):
    def __init__(self, name: str) -> None:
        self.name = name

    async def start(self) -> None:  # noqa: B027 - an optional hook, not an abstract method
        """Load models / open connections. Called once before the first request."""

    async def close(self) -> None:  # noqa: B027 - an optional hook, not an abstract method
        """Release everything start() took."""

    @property
    def ready(self) -> bool:
        """Can serve now (a local model is loaded)."""
        return True

    @property
    def alive(self) -> bool:
        """False once the backend has given up for good (a local engine out of restarts): the
        process should be restarted by its supervisor."""
        return True

    def stats(self) -> dict[str, float]:
        """Gauges for /metrics (queue depth and the like)."""
        return {}

    @abc.abstractmethod
    def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        """Yield text pieces as they are produced, then exactly one Generation."""

    async def generate(self, request: GenerationRequest) -> Generation:
        result: Generation | None = None
        async for item in self.stream(request):
            if isinstance(item, Generation):
                result = item
        if result is None:
            raise RuntimeError(f"backend {self.name} ended its stream without a result")
        return result
