"""The backend protocol: turn a typed generation request into text, counts and logprobs.

A backend implements one method, `stream`, an async iterator of `Delta` pieces ending with the
finished `Generation`. `generate` is derived from it, and serves n > 1 as n concurrent samples
(a batching engine shares their prompt's prefill). Capabilities are class attributes.

One optional capability: `score_continuation`, reading a given answer (another tier's candidate)
after the request in one prefill and reporting this model's logprob of each of its tokens and
whether each was its own top choice (the `cross_tier` verifier's signal, and the pass speculative
decoding verifies a draft with). Backends that cannot raise `ScoringUnsupportedError`;
`scoring_support` says so from the tier's settings alone, for `config check`.

Whether its answer can be taken whole: `refuse_oversized`, asked at admission (an `openai` tier
reads at most `max_response_bytes` of an answer, and a request can ask for more than that).

What a generation can be charged for: `prompt_token_limit` and `completion_token_limit`, the
most tokens this backend can count for a request (admission reserves their price, so a key's
budget holds). The defaults are `router.wire`'s bounds on what is sent; a backend that
may count more (a hosted API's own system prompt) or knows a tighter cap (a context size) says so.

Another: `reuses(other)` and `stream_reusing`, answering with a lower tier's rejected answer as
the first draft (a local tier of the same vocabulary keeps the prefix its own model agrees with).
The answer must be the one the backend would give from scratch, so a backend that cannot use the
draft simply ignores it (the default).
"""

from __future__ import annotations

import abc
import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.errors import TierrouteError
from router.generation import Delta, Generation, GenerationRequest, merge_choices
from router.wire import completion_token_bound, prompt_token_bound

if TYPE_CHECKING:
    from router.config import TierSettings


class ScoringUnsupportedError(TierrouteError):
    """This tier cannot score a given continuation (its backend, or its settings, do not allow it)."""


@dataclass(frozen=True)
class ContinuationScore:
    """A model's reading of a given continuation of a request: per continuation token, its logprob
    under the model (finite, <= 0) and whether it was the model's own top choice there."""

    token_logprobs: tuple[float, ...]
    top1: tuple[bool, ...]
    prompt_tokens: int  # tokens prefilled: the rendered request and the continuation
    continuation_tokens: int  # tokens of the continuation scored (len(token_logprobs))
    seconds: float  # compute attributable to the scoring (busy time; wall time for an upstream)

    def __post_init__(self) -> None:
        if len(self.top1) != len(self.token_logprobs) or self.continuation_tokens != len(self.token_logprobs):
            raise ValueError("one logprob and one top-choice flag per continuation token")
        if any(not (math.isfinite(v) and v <= 0.0) for v in self.token_logprobs):
            raise ValueError("logprobs must be finite and at most 0")
        if self.prompt_tokens < self.continuation_tokens or self.seconds < 0:
            raise ValueError("prompt_tokens counts the continuation; seconds is not negative")


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

    def deployment_stats(self) -> dict[str, dict[str, float]]:
        """Gauges for /metrics per deployment of the tier (an `openai` tier's servers); empty for
        a backend that has none."""
        return {}

    def draft_counts(self) -> dict[str, tuple[int, int]]:
        """Speculative decoding so far, per draft source ("model", "rejected", "scored"): (tokens
        drafted, tokens accepted). Counters for /metrics; empty for a backend that never drafts."""
        return {}

    def prompt_token_limit(self, request: GenerationRequest) -> int:
        """The most prompt tokens a generation of `request` here can be counted (and charged) for:
        a token per byte of what is sent, plus a chat template's few (`router.wire`)."""
        return prompt_token_bound(request)

    async def count_prompt_tokens(self, request: GenerationRequest) -> int | None:
        """The prompt tokens a generation of `request` here would read, counted without generating
        (the Messages API's count_tokens); None when this backend cannot count them itself."""
        return None

    def completion_token_limit(self, request: GenerationRequest) -> int:
        """The most completion tokens it can be counted for: `n` choices of `max_tokens`."""
        return completion_token_bound(request)

    def refuse_oversized(self, request: GenerationRequest, *, stream: bool) -> None:  # noqa: B027 - optional
        """Raise `AnswerTooLargeError` (400) when the answer `request` asks for cannot be taken
        from this backend whole (an `openai` tier's max_response_bytes); admission asks before any
        work. A backend with no such limit refuses nothing."""

    def reuses(self, other: Backend) -> bool:
        """Whether an answer of `other` that was rejected can be this backend's first draft."""
        return False

    def stream_reusing(self, request: GenerationRequest, rejected: str) -> AsyncIterator[Delta | Generation]:
        """As `stream`, with `rejected` (a lower tier's rejected answer) as the first draft; the
        answer is the one `stream` gives."""
        return self.stream(request)

    @abc.abstractmethod
    def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        """Yield text pieces as they are produced, then exactly one Generation."""

    @classmethod
    def scoring_support(cls, tier: TierSettings) -> str | None:
        """None when a tier of this backend, so configured, can score continuations; else why not."""
        return f"backend '{tier.backend}' cannot score a given answer"

    async def score_continuation(self, request: GenerationRequest, continuation: str) -> ContinuationScore:
        """Score `continuation` as this model's answer to `request`, by prefill only."""
        raise ScoringUnsupportedError(f"tier '{self.name}' cannot score a given answer")

    async def generate(self, request: GenerationRequest) -> Generation:
        if request.n > 1:
            # n jobs at once: a batching engine decodes them together and shares their prefill
            async with asyncio.TaskGroup() as group:
                jobs = [group.create_task(self.generate(request.sample(i))) for i in range(request.n)]
            return merge_choices([job.result() for job in jobs])
        return await self._collect(self.stream(request))

    async def generate_reusing(self, request: GenerationRequest, rejected: str) -> Generation:
        if request.n > 1:  # each choice samples on its own; a rejected answer drafts for one stream only
            return await self.generate(request)
        return await self._collect(self.stream_reusing(request, rejected))

    async def _collect(self, stream: AsyncIterator[Delta | Generation]) -> Generation:
        result: Generation | None = None
        async for item in stream:
            if isinstance(item, Generation):
                result = item
        if result is None:
            raise RuntimeError(f"backend {self.name} ended its stream without a result")
        return result
