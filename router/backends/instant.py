"""A backend that answers at once with a fixed reply: what is left to time is the router itself.

`tierroute bench overhead` puts one behind every tier, so the latency a client sees is what the
HTTP layer, the cascade, the verifiers and the ledger add. It is a real backend, not a test
switch: nothing in the request path knows it is there.

Its fields are true of what it does. It tokenizes by whitespace, so its token counts are word
counts. It can give only one reply, so every token of it has probability 1 and logprob 0.0: a
confidence verifier scores it 1.0, and under the default config the first tier accepts it.
Latency, time to first token and busy time are measured, and come to microseconds.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from router.backends.base import Backend
from router.generation import Delta, Generation, GenerationRequest


class InstantBackend(Backend):
    def __init__(self, name: str, reply: str = "OK.", *, model: str = "instant") -> None:
        super().__init__(name)
        self.reply = reply
        self.model = model

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        started = time.monotonic()
        words = self.reply.split()
        finish = "stop"
        if len(words) > request.max_tokens:
            words, finish = words[: request.max_tokens], "length"
        text = " ".join(words)
        for stop in request.stop:
            if stop and stop in text:
                text, finish = text[: text.index(stop)], "stop"
        tokens = len(text.split())
        if text:
            yield Delta(text)
        elapsed = time.monotonic() - started
        yield Generation(
            text=text,
            finish_reason=finish,  # type: ignore[arg-type]
            prompt_tokens=_prompt_words(request),
            completion_tokens=tokens,
            token_logprobs=(0.0,) * tokens,
            latency_s=elapsed,
            ttft_s=elapsed,
            busy_s=elapsed,
            model=self.model,
        )


def _prompt_words(request: GenerationRequest) -> int:
    if request.messages is not None:
        return sum(len(m.content.split()) for m in request.messages)
    return len((request.prompt or "").split())
