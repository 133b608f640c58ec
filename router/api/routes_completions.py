"""POST /v1/chat/completions and /v1/completions, streaming and not.

Each route is a surface: FastAPI parses the body into its typed request, and the request pipeline
(`router.pipeline.flow`) does the rest, the same for both: the exact cache, the stages, admission,
the cascade, the response in the endpoint's shape (`router.api.responses.CHAT`, `COMPLETION`),
the ledger, the cache offer and shadow escalation.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from router.api.deps import PrincipalDep, ServicesDep, cache_control
from router.api.requests import ChatCompletionRequest, CompletionRequest
from router.api.responses import CHAT, COMPLETION, new_id

router = APIRouter(prefix="/v1")


@router.post("/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, services: ServicesDep, principal: PrincipalDep, http: Request
) -> Any:
    rid = new_id("chatcmpl")
    return await services.pipeline.handle("chat.completions", body, principal, rid, CHAT, cache_control(http))


@router.post("/completions")
async def completions(body: CompletionRequest, services: ServicesDep, principal: PrincipalDep, http: Request) -> Any:
    rid = new_id("cmpl")
    return await services.pipeline.handle("completions", body, principal, rid, COMPLETION, cache_control(http))
