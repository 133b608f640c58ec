"""POST /v1/responses: OpenAI's Responses API as a surface of the one request pipeline.

The body is read into its chat twin (router.api.surfaces.responses_protocol) and served by the
pipeline as any chat request is, rendered as a response (router.api.surfaces.responses_shape). A
refusal the twin makes names the field of this body that it came from.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request

from router.api.deps import PrincipalDep, ServicesDep, cache_control
from router.api.errors import openapi_errors
from router.api.surfaces.responses_protocol import ResponsesRequest
from router.api.surfaces.responses_shape import ResponsesShape
from router.errors import RequestError

router = APIRouter(prefix="/v1")


@router.post("/responses", responses=openapi_errors("openai"))
async def responses(body: ResponsesRequest, services: ServicesDep, principal: PrincipalDep, http: Request) -> Any:
    chat, renames = body.to_chat()
    rid = f"resp_{uuid.uuid4().hex}"
    try:
        return await services.pipeline.handle(
            body.surface, chat, principal, rid, ResponsesShape(body), cache_control(http)
        )
    except RequestError as exc:
        raise renames.rename(exc) from None
