"""POST /v1/chat/completions and /v1/completions, streaming and not.

With the response cache on (router.cache), a cacheable request is looked up before admission
(a hit is admitted by the key's rate limit alone, since it costs nothing; a request whose rate
is already spent is refused before the lookup, so it reads nothing) and, on a hit,
answered whole from the stored answer, streamed as any whole answer when asked; an answer that
was generated is offered to the cache once its ledger row is committed and its last byte sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from router.admission.auth import Principal
from router.api.deps import PrincipalDep, Services, ServicesDep
from router.api.errors import PermissionDenied, error_response
from router.api.requests import BaseRequest, ChatCompletionRequest, CompletionRequest
from router.api.responses import CHAT, COMPLETION, Shape, new_id, shown_tokens, tool_answer_chunks
from router.api.schema_checks import verdicts
from router.cache.answer import CachedAnswer
from router.cache.service import Lookup
from router.cascade import Answering, CascadeResult, Final, Tier
from router.generation import Delta, GenerationRequest, TokenLogprob
from router.structured import tools
from router.structured.grammars import pinned

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1")


def _headers(result_tier: str, escalated: bool, cache: Lookup | None = None) -> dict[str, str]:
    headers = {"x-tierroute-tier": result_tier, "x-tierroute-escalated": "true" if escalated else "false"}
    return headers if cache is None else {**headers, "x-tierroute-cache": cache.status}


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


async def _prepare(services: Services, body: BaseRequest, principal: Principal) -> tuple[GenerationRequest, list[Tier]]:
    # a key held to some models: 403 for any other name, before it is looked up, so the refusal
    # says neither whether that model exists nor what else is served (only what the key may use)
    if not principal.may_use(body.model):
        allowed = principal.visible(services.engine.cascade.model_names())
        raise PermissionDenied(
            f"Key '{principal.key_id}' may not use the model '{body.model}'; it may use: "
            f"{', '.join(allowed) or 'none of the models served here'}.",
            param="model",
            code="model_not_allowed",
        )
    plan = services.engine.cascade.plan(body.model)  # 404 for an unknown model, before any work
    default_max = max(t.settings.max_tokens for t in plan)
    # 403 for tests from a caller the operator has not allowed to send them
    make = functools.partial(body.to_generation, default_max, may_send_tests=principal.may_send_tests)  # type: ignore[attr-defined]
    # a schema not checked before costs up to a second of CPU: checked in a worker, never on the loop
    new = body.new_schemas()
    if not new:
        return make(), plan
    with pinned(await verdicts(new)):
        return make(), plan


class _Stream(StreamingResponse):
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


async def _respond(
    services: Services,
    principal: Principal,
    body: BaseRequest,
    rid: str,
    shape: Shape,
    cache_control: str | None = None,
) -> Any:
    request, plan = await _prepare(services, body, principal)
    wanted = body.logprobs_wanted()  # checked by _prepare: None, or the alternatives to show
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    lookup = services.cache.plan(body, shape.object, principal, cache_control)
    if lookup is not None and lookup.read:
        # a rate that would refuse even a hit refuses before the lookup: a refused request reads
        # nothing (401, 403 and 400 are refused before this point; a budget only after a miss)
        services.accounting.refuse_spent_rate(principal, body.user)
        hit = await services.cache.get(lookup)
        if hit is not None:
            return await _replayed(services, principal, body, rid, shape, request, plan, hit, include_usage)
    cache = None if lookup is None else lookup.status
    # 429 before any work; the account is entered once and left on every way out
    # (router.admission.lifecycle: ready, written, record, spent work, release)
    account = services.accounting.open(
        principal, rid, request, plan, body.model, stream=bool(body.stream), user=body.user
    )
    cascade = services.engine.cascade
    # n > 1 is answered whole (the cascade judges the request once its n choices exist), so its
    # stream is the finished answer in OpenAI's chunks, choice by choice
    if not body.stream or request.n > 1:
        async with account:  # a failing ledger: 503 before any work
            result = await cascade.run(request, body.model, spent=account.spent)
            await account.record(result)  # committed before the client sees it
        payload = shape.response(rid, request, result, wanted, cache)
        services.cache.offer(lookup, payload, result)  # in the background: its row is committed
        # shadow escalation starts once the response is sent: never on the client's path
        after = BackgroundTask(services.shadow.offered, rid, request, result)
        headers = _headers(result.final.tier, result.escalated, lookup)
        if body.stream:
            return StreamingResponse(
                _replay(shape, payload, include_usage),
                media_type="text/event-stream",
                headers={**headers, "cache-control": "no-cache"},
                background=after,
            )
        return JSONResponse(payload, headers=headers, background=after)

    events = cascade.stream(request, body.model, spent=account.spent).__aiter__()
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(account)
        # left in reverse: the cascade's slot freed (a client gone mid-answer fills spent), then the account
        stack.push_async_callback(events.aclose)  # type: ignore[attr-defined]
        first = await events.__anext__()  # errors before any output are plain HTTP errors
        await account.written()  # no byte of an answer before its request has a ledger row
        way_out = stack.pop_all()  # the stream owns the way out from here

    settling: list[asyncio.Task[None]] = []

    async def settle() -> None:
        """The one way out of a stream: every caller (the body's end, the response's) waits for
        the same single run of it."""
        if not settling:
            settling.append(asyncio.ensure_future(way_out.aclose()))
        await asyncio.shield(settling[0])

    assert isinstance(first, Answering)

    async def sse() -> AsyncIterator[bytes]:
        tier = first.tier
        opening = shape.opening(rid, tier)
        if opening is not None:
            yield _sse(opening)
        sent = 0  # characters of text streamed so far
        pending: list[TokenLogprob] = []  # tokens whose text has not been streamed yet
        pending_at = 0  # where the first of them begins
        # with tools offered, text that may be a call is held back and read whole at the end
        # (router.structured.tools: the calls a client gets are the ones that were verified)
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
                        yield _sse(shape.delta(rid, tier, text, logprobs))
                elif isinstance(event, Final):
                    result = event.result
                    found = None
                    if content is not None:
                        found = tools.answer(request, result.generation)
                        for extra in tool_answer_chunks(rid, tier, found, result.generation.text, sent):
                            yield _sse(extra)
                    final = shape.final(rid, tier, result, found, include_usage=include_usage, cache=cache)
                    # committed before its finish_reason and cost are sent: a failed write ends the
                    # stream with an error event instead, and no [DONE]
                    await account.record(result)
                    yield _sse(final)
            yield _sse("[DONE]")
            if result is not None:  # resumed after [DONE] was sent: the client has it all
                services.shadow.offer(rid, request, result)
                services.cache.offer(lookup, shape.response(rid, request, result, wanted, cache), result)
        except Exception as exc:  # output has begun: report in-band, the status is already sent
            log.warning("stream %s failed mid-way: %s", rid, exc)
            yield _sse(json.loads(bytes(error_response(exc).body)))
        finally:
            await settle()

    return _Stream(
        sse(),
        settle,
        media_type="text/event-stream",
        headers={**_headers(first.tier, first.escalated, lookup), "cache-control": "no-cache"},
    )


async def _replayed(
    services: Services,
    principal: Principal,
    body: BaseRequest,
    rid: str,
    shape: Shape,
    request: GenerationRequest,
    plan: list[Tier],
    hit: CachedAnswer,
    include_usage: bool,
) -> Any:
    """A cache hit: admitted by the rate limit alone, its zero-cost row committed, then the stored
    answer sent whole (a stream: in OpenAI's chunks, as any whole answer)."""
    # not a stream to the accounting: the answer is settled before its first byte
    account = services.accounting.open(
        principal, rid, request, plan, body.model, stream=False, user=body.user, cached=True
    )
    async with account:
        await account.record_replayed(hit)
    services.cache.served()
    payload = shape.cached(rid, hit)
    headers = {**_headers(hit.tier, False), "x-tierroute-cache": "hit"}
    if body.stream:
        return StreamingResponse(
            _replay(shape, payload, include_usage),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )
    return JSONResponse(payload, headers=headers)


async def _replay(shape: Shape, payload: dict[str, Any], include_usage: bool) -> AsyncIterator[bytes]:
    for chunk in shape.replay(payload, include_usage):
        yield _sse(chunk)
    yield _sse("[DONE]")


def _cache_control(http: Request) -> str | None:
    """The client's Cache-Control, every line of it: HTTP reads repeated lines as one list (RFC
    9110, 5.3), and a `no-store` on the second line must count as much as on the first."""
    return ", ".join(http.headers.getlist("cache-control")) or None


@router.post("/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, services: ServicesDep, principal: PrincipalDep, http: Request
) -> Any:
    return await _respond(services, principal, body, new_id("chatcmpl"), CHAT, _cache_control(http))


@router.post("/completions")
async def completions(body: CompletionRequest, services: ServicesDep, principal: PrincipalDep, http: Request) -> Any:
    return await _respond(services, principal, body, new_id("cmpl"), COMPLETION, _cache_control(http))
