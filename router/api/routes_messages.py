"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API as a surface of the
one request pipeline.

The body is read into its chat twin (router.api.surfaces.messages_protocol) and served by the
pipeline as any chat request is, rendered as an Anthropic message
(router.api.surfaces.messages_shape); errors are in Anthropic's shape (router.api.errors picks it
by path), and keys come as `x-api-key` or `Authorization: Bearer` (router.api.deps). count_tokens
parses and checks the request the same way and counts its prompt at the first tier it would reach,
one request against the key's request rate (never its budgets: nothing is charged).
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request

from router.api.deps import PrincipalDep, ServicesDep, cache_control
from router.api.errors import openapi_errors
from router.api.surfaces.messages_protocol import CountTokensRequest, MessagesRequest
from router.api.surfaces.messages_shape import MessagesShape, count_response
from router.errors import RequestError

router = APIRouter(prefix="/v1")


@router.post("/messages", responses=openapi_errors("anthropic"))
async def messages(body: MessagesRequest, services: ServicesDep, principal: PrincipalDep, http: Request) -> Any:
    chat, renames = body.to_chat()
    rid = f"msg_{uuid.uuid4().hex}"
    try:
        return await services.pipeline.handle(body.surface, chat, principal, rid, MessagesShape(), cache_control(http))
    except RequestError as exc:
        raise renames.rename(exc) from None


@router.post("/messages/count_tokens", responses=openapi_errors("anthropic"))
async def count_tokens(body: CountTokensRequest, services: ServicesDep, principal: PrincipalDep) -> dict[str, int]:
    chat, renames = body.to_chat()
    try:
        counted = await services.pipeline.prompt_tokens(body.surface, chat, principal, f"count_{uuid.uuid4().hex}")
        return count_response(counted)
    except RequestError as exc:
        raise renames.rename(exc) from None
