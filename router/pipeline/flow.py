"""One request from its parsed body to its settled answer, the same on every API surface.

    parse     the surface's body -> the service's GenerationRequest; the plan, made once (404 for
              an unknown model, 403 for one the key may not use, 400 for what the body gets wrong)
    cache     the exact response cache (router.cache): a request whose rate is spent is refused
              before the lookup; a hit is answered whole and recorded at no cost
    stages    the configured request stages, in order (router.pipeline.stages): refuse, rewrite,
              narrow the plan, or answer from a stored answer
    admit     the account opened (router.admission: rate, budget and token reservations, priced
              on the plan the stages left); 429 before any work
    cascade   the tiers, cheapest first (router.cascade)
    after     the stages again, shown the settled answer before it is delivered
    render    the surface's shape (`Shape`): JSON, or SSE (router.pipeline.streaming)
    settle    the ledger row committed before the client sees the answer; limits released; the
              cache offered the answer and shadow escalation started once it is sent

A surface (chat completions, completions, the Responses and Messages APIs) is a parser into the
service's request (its pydantic body's `to_generation`; the Responses and Messages bodies are
read into their chat twin, router.api.surfaces) and a `Shape` out of the cascade's result; the
lifecycle between is this module's, and a route only calls `handle`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from router.api.errors import PermissionDenied
from router.api.schema_checks import verdicts
from router.cascade import Answering, CascadeResult
from router.pipeline import streaming
from router.pipeline.stages import Stage, StageContext
from router.structured.grammars import pinned

if TYPE_CHECKING:
    from router.admission.accounting import Accounting
    from router.admission.auth import Principal
    from router.admission.lifecycle import RequestAccount
    from router.api.requests import BaseRequest
    from router.api.responses import Shape
    from router.cache.answer import CachedAnswer
    from router.cache.service import Lookup, ResponseCache
    from router.engine import Engine
    from router.quality.shadow import ShadowService


def _headers(result_tier: str, escalated: bool, cache: Lookup | None = None) -> dict[str, str]:
    headers = {"x-tierroute-tier": result_tier, "x-tierroute-escalated": "true" if escalated else "false"}
    return headers if cache is None else {**headers, "x-tierroute-cache": cache.status}


@dataclass(frozen=True)
class _Call:
    """What one call of `handle` carries between its steps besides the stages' context."""

    body: BaseRequest
    rid: str
    shape: Shape
    lookup: Lookup | None  # the exact cache's plan for it; None: not cacheable
    wanted: int | None  # logprob alternatives the client asked to see; None: no logprobs
    include_usage: bool  # a stream's last chunk carries usage

    @property
    def cache(self) -> str | None:
        return None if self.lookup is None else self.lookup.status


class Pipeline:
    """The request lifecycle over the services built once per app (`router.api.deps.Services`
    builds it with them)."""

    def __init__(
        self,
        engine: Engine,
        accounting: Accounting,
        cache: ResponseCache,
        shadow: ShadowService,
        stages: Sequence[Stage] = (),
    ) -> None:
        self.engine = engine
        self.accounting = accounting
        self.cache = cache
        self.shadow = shadow
        self.stages = list(stages)
        # a stage that must see an answer before any of it is sent: streams are answered whole
        self.holds_streams = any(s.inspects_output for s in self.stages)

    async def handle(
        self,
        surface: str,
        body: BaseRequest,
        principal: Principal,
        rid: str,
        shape: Shape,
        cache_control: str | None = None,
    ) -> Any:
        ctx = await self._parse(surface, body, principal)
        lookup = self.cache.plan(body, shape.object, principal, cache_control)
        call = _Call(
            body=body,
            rid=rid,
            shape=shape,
            lookup=lookup,
            wanted=body.logprobs_wanted(),  # checked by _parse: None, or the alternatives to show
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
        )
        if (lookup is not None and lookup.read) or self.stages:
            # a rate that would refuse even a hit refuses before the lookup and before the stages:
            # a refused request reads nothing and costs the service no stage's work (401, 403 and
            # 400 are refused before this point; a budget only after a miss, once the plan is final)
            self.accounting.refuse_spent_rate(principal, body.user)
        if lookup is not None and lookup.read:
            hit = await self.cache.get(lookup)
            if hit is not None:
                return await self._replayed(ctx, call, hit, from_cache=True)
        try:
            for stage in self.stages:
                stored = await stage.before(ctx)
                if stored is not None:
                    stored = dataclasses.replace(stored, source=f"stored answer from stage {stage.name}")
                    return await self._replayed(ctx, call, stored, from_cache=False)
        finally:
            self._count(ctx, 0)  # a refusal too: /metrics says which stage refused, and on what kind
        if ctx.request.tenant != principal.tenant:  # a stage rewrites what is generated, never for whom
            ctx.request = ctx.request.with_(tenant=principal.tenant)
        # n > 1 is answered whole (the cascade judges the request once its n choices exist), so its
        # stream is the finished answer in OpenAI's chunks, choice by choice; so is every stream
        # when a stage must see answers before they are sent
        if not body.stream or ctx.request.n > 1 or self.holds_streams:
            return await self._whole(ctx, call)
        return await self._live(ctx, call)

    async def prompt_tokens(self, surface: str, body: BaseRequest, principal: Principal, call_id: str) -> int:
        """The prompt tokens of a request at the first tier it would reach (the Messages API's
        count_tokens): parsed and checked as a request is (404, 403, 400), then counted as one
        request against its key's (and team's) request rate, 429 when that is spent: a count
        renders and tokenizes the prompt on a local tier, work a key held to a rate must not
        have for free. Budgets and token rates do not see it (nothing is generated or charged;
        `Accounting.admit_call`). A tier that cannot count its own (a remote one) gives the bound
        its admission reserves (router.wire)."""
        ctx = await self._parse(surface, body, principal)
        await self.accounting.admit_call(principal, call_id)
        backend = ctx.plan[0].backend
        counted = await backend.count_prompt_tokens(ctx.request)
        return counted if counted is not None else backend.prompt_token_limit(ctx.request)

    async def _parse(self, surface: str, body: BaseRequest, principal: Principal) -> StageContext:
        # a key held to some models: 403 for any other name, before it is looked up, so the refusal
        # says neither whether that model exists nor what else is served (only what the key may use)
        if not principal.may_use(body.model):
            allowed = principal.visible(self.engine.cascade.model_names())
            raise PermissionDenied(
                f"Key '{principal.key_id}' may not use the model '{body.model}'; it may use: "
                f"{', '.join(allowed) or 'none of the models served here'}.",
                param="model",
                code="model_not_allowed",
            )
        plan = self.engine.cascade.plan(body.model)  # 404 for an unknown model, before any work
        default_max = max(t.settings.max_tokens for t in plan)
        # 403 for tests from a caller the operator has not allowed to send them; the tenant goes with
        # the request to every tier and verifier, so that what it leaves behind is kept as its own
        make = functools.partial(
            body.to_generation,  # type: ignore[attr-defined]
            default_max,
            may_send_tests=principal.may_send_tests,
            tenant=principal.tenant,
        )
        # a schema not checked before costs up to a second of CPU: checked in a worker, never on the loop
        new = body.new_schemas()
        if new:
            with pinned(await verdicts(new)):
                request = make()
        else:
            request = make()
        return StageContext(
            surface=surface,
            principal=principal,
            model=body.model,
            request=request,
            plan=tuple(plan),
            detect=self.engine.cascade.detect,
        )

    def _open(self, ctx: StageContext, call: _Call, *, stream: bool, cached: bool = False) -> RequestAccount:
        """The request's account (router.admission.lifecycle), priced on the plan as it stands;
        429 before any work. It is entered once and left on every way out."""
        body = call.body
        return self.accounting.open(
            ctx.principal,
            call.rid,
            ctx.request,
            list(ctx.plan),
            body.model,
            stream=stream,
            user=body.user,
            cached=cached,
            surface=ctx.surface,
        )

    async def _after(self, ctx: StageContext, result: CascadeResult) -> None:
        before = len(ctx.actions)
        try:
            for stage in self.stages:
                await stage.after(ctx, result)
        finally:
            self._count(ctx, before)
        result.stages = ctx.notes

    def _count(self, ctx: StageContext, since: int) -> None:
        """What the stages did from `since` on, in /metrics (`tierroute_stage_actions_total`)."""
        counter = self.accounting.metrics.stage_actions
        for a in ctx.actions[since:]:
            counter.labels(a.stage, a.action, a.kind, a.where).inc()

    async def _whole(self, ctx: StageContext, call: _Call) -> Any:
        """Answered whole, then sent as JSON or, when a stream was asked for, in OpenAI's chunks."""
        body, shape = call.body, call.shape
        account = self._open(ctx, call, stream=bool(body.stream))
        async with account:  # a failing ledger: 503 before any work
            result = await self.engine.cascade.run(
                ctx.request, body.model, spent=account.spent, plan=ctx.plan, task=ctx.detected
            )
            await account.record(result)  # committed before the client sees it
        await self._after(ctx, result)  # a refusal here: the answer is not sent, its cost is recorded
        stored = shape.response(call.rid, ctx.request, result, call.wanted, call.cache)
        # in the background: its row is committed; never an answer a stage found data in
        self.cache.offer(call.lookup if ctx.cacheable else None, stored, result)
        payload = shape.shown(stored)
        # shadow escalation starts once the response is sent: never on the client's path
        after = BackgroundTask(self.shadow.offered, call.rid, ctx.request, result) if ctx.shadowable else None
        headers = _headers(result.final.tier, result.escalated, call.lookup)
        if body.stream:
            return StreamingResponse(
                streaming.replay(shape, payload, call.include_usage),
                media_type="text/event-stream",
                headers={**headers, "cache-control": "no-cache"},
                background=after,
            )
        return JSONResponse(payload, headers=headers, background=after)

    async def _live(self, ctx: StageContext, call: _Call) -> Any:
        """Streamed as the answering tier generates (router.pipeline.streaming)."""
        account = self._open(ctx, call, stream=True)
        events = self.engine.cascade.stream(
            ctx.request, call.body.model, spent=account.spent, plan=ctx.plan, task=ctx.detected
        )
        iterator = events.__aiter__()
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(account)
            # left in reverse: the cascade's slot freed (a client gone mid-answer fills spent), then the account
            stack.push_async_callback(iterator.aclose)  # type: ignore[attr-defined]
            first = await iterator.__anext__()  # errors before any output are plain HTTP errors
            await account.written()  # no byte of an answer before its request has a ledger row
            way_out = stack.pop_all()  # the stream owns the way out from here
        assert isinstance(first, Answering)
        settle = streaming.once(way_out.aclose)

        async def delivered(result: CascadeResult) -> None:
            if ctx.shadowable:
                self.shadow.offer(call.rid, ctx.request, result)
            if ctx.cacheable:
                self.cache.offer(
                    call.lookup, call.shape.response(call.rid, ctx.request, result, call.wanted, call.cache), result
                )

        content = streaming.live_events(
            rid=call.rid,
            shape=call.shape,
            request=ctx.request,
            first=first,
            events=iterator,
            wanted=call.wanted,
            include_usage=call.include_usage,
            cache=call.cache,
            record=account.record,
            after=functools.partial(self._after, ctx),
            delivered=delivered,
            settle=settle,
        )
        return streaming.SettledStream(
            content,
            settle,
            media_type="text/event-stream",
            headers={**_headers(first.tier, first.escalated, call.lookup), "cache-control": "no-cache"},
        )

    async def _replayed(self, ctx: StageContext, call: _Call, hit: CachedAnswer, *, from_cache: bool) -> Any:
        """A stored answer (an exact-cache hit, or one a stage returned): admitted by the rate limit
        alone, its zero-cost row committed, then sent whole (a stream: in OpenAI's chunks)."""
        # not a stream to the accounting: the answer is settled before its first byte
        account = self._open(ctx, call, stream=False, cached=True)
        async with account:
            await account.record_replayed(hit)
        if from_cache:
            self.cache.served()
        payload = call.shape.shown(call.shape.cached(call.rid, hit, ctx.notes))
        headers = {**_headers(hit.tier, False), "x-tierroute-cache": "hit" if from_cache else "stage"}
        if call.body.stream:
            return StreamingResponse(
                streaming.replay(call.shape, payload, call.include_usage),
                media_type="text/event-stream",
                headers={**headers, "cache-control": "no-cache"},
            )
        return JSONResponse(payload, headers=headers)
