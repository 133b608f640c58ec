"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from router.api.app import ServicesDep

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(services: ServicesDep) -> JSONResponse:
    tiers = {name: b.ready for name, b in services.engine.backends.items()}
    ready = services.engine.ready
    return JSONResponse({"ready": ready, "tiers": tiers}, status_code=200 if ready else 503)
