"""The FastAPI app factory. Settings and the engine are injected; nothing lives in module globals."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.api import errors
from router.auth import Authenticator, Principal
from router.config import Settings
from router.engine import Engine

log = logging.getLogger(__name__)


class Services:
    """Everything a route needs, built once per app."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.auth = Authenticator(settings.server)


def get_services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


ServicesDep = Annotated[Services, Depends(get_services)]


def get_principal(request: Request, services: ServicesDep) -> Principal:
    return services.auth.authenticate(request.headers.get("authorization"))


PrincipalDep = Annotated[Principal, Depends(get_principal)]


class BodyLimit:
    """413 for bodies over the limit, whether announced by Content-Length or streamed chunked."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    await self._reject(send)
                    return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise errors.PayloadTooLarge(f"request body over {self.max_bytes} bytes")
            return message

        await self.app(scope, limited, send)

    async def _reject(self, send: Send) -> None:
        response = errors.error_response(errors.PayloadTooLarge(f"request body over {self.max_bytes} bytes"))
        await send({"type": "http.response.start", "status": 413, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})


def create_app(settings: Settings, *, engine: Engine | None = None, **engine_kwargs: Any) -> FastAPI:
    """Build the app. Pass `engine` to serve an engine built elsewhere (its lifecycle stays the
    caller's); otherwise one is built from settings and started and closed with the app."""
    owned = engine is None
    eng = engine if engine is not None else Engine.from_settings(settings, **engine_kwargs)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if owned or not eng.started:
            await eng.start()
        try:
            yield
        finally:
            if owned:
                await eng.close()

    app = FastAPI(title="tierroute", version="0.1.0", lifespan=lifespan)
    app.state.services = Services(settings, eng)
    errors.install(app)

    from router.api import routes_completions, routes_health, routes_models

    app.include_router(routes_health.router)
    app.include_router(routes_models.router)
    app.include_router(routes_completions.router)
    app.add_middleware(BodyLimit, max_bytes=settings.server.max_body_bytes)
    return app
