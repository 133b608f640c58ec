"""Liveness and readiness.

Readiness (/readyz) is 503 while any tier cannot take work: loading, or restarting after its
engine failed. Liveness (/healthz) is 503 only when a tier is down for good (its engine gave up
restarting): nothing but a new process helps then, which is what a supervisor's liveness probe is for.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from router.api.deps import ServicesDep

router = APIRouter()


@router.get("/healthz")
async def healthz(services: ServicesDep) -> JSONResponse:
    down = sorted(name for name, b in services.engine.backends.items() if not b.alive)
    if down:
        return JSONResponse({"status": "down", "tiers_down": down}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(services: ServicesDep) -> JSONResponse:
    tiers = {name: b.ready for name, b in services.engine.backends.items()}
    ready = services.engine.ready
    return JSONResponse({"ready": ready, "tiers": tiers}, status_code=200 if ready else 503)
