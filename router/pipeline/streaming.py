"""A cascade's events as Server-Sent Events: the body of a live-streamed answer.

Only the answering tier streams live (`router.cascade`); its text is relayed as it comes, with
the logprobs of the tokens it completes, through the surface's stream writer (`Shape.writer`:
OpenAI's chunks, or the Responses and Messages APIs' named events). With tools offered, text that
may be a call is held back and read whole at the end (router.structured.tools: the calls a client gets are the ones that
were verified). The ledger row is committed before the last chunk (the finish reason and cost) is
sent: a failed write, or an after-generation stage that refuses, ends the stream with an error
event instead (the surface's: OpenAI's `data: {"error": ...}` and no [DONE], a Responses
`response.failed`, a Messages `error` event).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from router.api.responses import Shape, shown_tokens
from router.cascade import Answering, CascadeResult, Final
from router.generation import Delta, GenerationRequest, TokenLogprob
from router.structured import tools

log = logging.getLogger(__name__)


async def replay(shape: Shape, payload: dict[str, Any], include_usage: bool) -> AsyncIterator[bytes]:
    """A whole answer streamed as the surface streams one (OpenAI's chunks then [DONE], or the
    surface's named events)."""
    for event in shape.replay_events(payload, include_usage):
        yield event


class SettledStream(StreamingResponse):
    """A stream whose request is settled however the response ends, even when its body is never
    iterated (the client left before the first byte)."""

    def __init__(self, content: AsyncIterator[bytes], settle: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._settle = settle

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._settle()


def once(close: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """The one way out of a stream: every caller (the body's end, the response's) waits for the
    same single run of `close`."""
    settling: list[asyncio.Task[None]] = []

    async def settle() -> None:
        if not settling:
            settling.append(asyncio.ensure_future(close()))
        await asyncio.shield(settling[0])

    return settle


async def live_events(
    *,
    rid: str,
    shape: Shape,
    request: GenerationRequest,
    first: Answering,
    events: AsyncIterator[Any],
    wanted: int | None,
    include_usage: bool,
    cache: str | None,
    record: Callable[[CascadeResult], Awaitable[None]],
    after: Callable[[CascadeResult], Awaitable[None]],
    delivered: Callable[[CascadeResult], Awaitable[None]],
    settle: Callable[[], Awaitable[None]],
) -> AsyncIterator[bytes]:
    """The SSE body. At the answer's end `record` commits its ledger row, then `after` runs the
    after-generation stages (their notes reach the last chunk), then the last chunk is sent;
    `delivered` runs once [DONE] is sent (the client has it all: shadow, the cache offer)."""
    tier = first.tier
    writer = shape.writer(rid, tier, request)
    for out in writer.opening():
        yield out
    sent = 0  # characters of text streamed so far
    pending: list[TokenLogprob] = []  # tokens whose text has not been streamed yet
    pending_at = 0  # where the first of them begins
    content = tools.ContentFilter() if request.offers_tools else None
    result: CascadeResult | None = None
    try:
        async for event in events:
            if isinstance(event, Delta):
                text = event.text if content is None else content.feed(event.text)
                sent += len(text)
                logprobs = None
                if wanted is not None and event.top_logprobs is not None:
                    # tokens of held-back text wait in `pending` until their text is sent
                    shown, pending = shown_tokens([*pending, *event.top_logprobs], pending_at, sent)
                    pending_at += sum(len(t.token) for _, t in shown)
                    logprobs = shape.logprobs(shown, wanted)
                if text or not event.text:
                    for out in writer.text(text, logprobs):
                        yield out
            elif isinstance(event, Final):
                result = event.result
                found = None
                if content is not None:
                    found = tools.answer(request, result.generation)
                    for out in writer.held(found, result.generation.text, sent):
                        yield out
                await record(result)
                await after(result)
                for out in writer.final(result, found, include_usage=include_usage, cache=cache):
                    yield out
        for out in writer.done():
            yield out
        if result is not None:  # resumed after the last event was sent: the client has it all
            await delivered(result)
    except Exception as exc:  # output has begun: report in-band, the status is already sent
        log.warning("stream %s failed mid-way: %s", rid, exc)
        for out in writer.failed(exc):
            yield out
    finally:
        await settle()
