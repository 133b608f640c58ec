"""The backend protocol: turn a typed generation request into text, counts and logprobs.

A backend implements one method, `stream`, an async iterator of `Delta` pieces ending with the
finished `Generation`. `generate` is derived from it. Capabilities are class attributes.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from router.generation import Delta, Generation, GenerationRequest

if TYPE_CHECKING:
    from router.config import Settings, TierSettings


class Backend(abc.ABC):
    gives_logprobs: bool = True
    local: bool = False  # runs on this machine (time-priced, has a queue)

    def __init__(self, name: str) -> None:
        self.name = name

    async def start(self) -> None:
        """Load models / open connections. Called once before the first request."""

    async def close(self) -> None:
        """Release everything start() took."""

    @property
    def ready(self) -> bool:
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


BackendFactory = Callable[["TierSettings", "Settings"], Backend]


def make_backend(tier: TierSettings, settings: Settings) -> Backend:
    """Build the backend a tier's config names. Heavy imports happen only here."""
    if tier.backend == "llamacpp":
        from router.backends.llamacpp import LlamaCppBackend

        return LlamaCppBackend.from_settings(tier, settings)
    if tier.backend == "openai":
        from router.backends.openai import OpenAIBackend

        return OpenAIBackend.from_settings(tier, settings)
    raise ValueError(f"unknown backend {tier.backend!r}")
