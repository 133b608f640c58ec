"""A scripted backend: a test double that answers with chosen texts, so a verifier's arithmetic
over samples and judge replies can be checked exactly. Real-model runs live in the integration
tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from router.backends.base import Backend
from router.cascade import Tier
from router.config import PriceSettings, TierSettings
from router.engine import load_prerouter
from router.generation import Delta, Generation, GenerationRequest
from verifiers.base import VerifierContext, VerifierSet, WeightedVerifier
from verifiers.format import make_format

HOUR = PriceSettings(usd_per_hour=3.6)  # $0.001 per second of busy time


class ScriptedBackend(Backend):
    def __init__(
        self,
        name: str,
        reply: Callable[[GenerationRequest], str],
        *,
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
        busy_s: float | None = 0.25,
        delay_s: float = 0.0,
    ) -> None:
        super().__init__(name)
        self.reply = reply
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.busy_s = busy_s
        self.delay_s = delay_s
        self.requests: list[GenerationRequest] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        self.requests.append(request)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            text = self.reply(request)  # may raise: a failing upstream
        finally:
            self.in_flight -= 1
        yield Delta(text)
        yield Generation(
            text=text,
            finish_reason="stop",
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            token_logprobs=None,
            latency_s=self.delay_s + 0.5,
            busy_s=self.busy_s,
        )


def gen(text: str, logprobs: tuple[float, ...] | None = None, finish_reason: str = "stop") -> Generation:
    """A candidate answer as a backend would return it."""
    return Generation(
        text=text,
        finish_reason=finish_reason,  # type: ignore[arg-type]
        prompt_tokens=12,
        completion_tokens=len(logprobs) if logprobs else 7,
        token_logprobs=logprobs,
        latency_s=0.1,
    )


def tier(
    name: str,
    backend: Backend,
    *,
    threshold: float = 0.5,
    regex: str | None = None,
    price=HOUR,
    prerouter: dict | None = None,
) -> Tier:
    """A tier as Engine.from_settings builds one, with a format check as its verifier if `regex`."""
    settings = TierSettings(
        name=name,
        backend="llamacpp",
        llamacpp={"model": "x.gguf"},
        price=price,
        threshold=threshold,
        prerouter=prerouter,
    )
    members = []
    if regex is not None:
        members.append(WeightedVerifier(make_format({"regex": regex}, VerifierContext(tier=name)), 1.0))
    return Tier(settings, backend, VerifierSet(members), load_prerouter(settings))
