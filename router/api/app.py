"""The FastAPI app factory. Settings and the engine are injected; nothing lives in module globals."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.accounting import Accounting, Ticket
from router.api import errors
from router.auth import Authenticator, Principal
from router.cascade import CascadeResult, Tier
from router.config import Settings
from router.engine import Engine
from router.generation import GenerationRequest
from router.metrics import ResponseCounter

log = logging.getLogger(__name__)


class Services:
    """Everything a route needs, built once per app."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.auth = Authenticator(settings.server)
        self.accounting = Accounting(settings, engine)

    def admit(
        self, principal: Principal, request_id: str, request: GenerationRequest, plan: Sequence[Tier], model: str,
        *, stream: bool,
    ) -> Ticket:
        """Budget and rate checks before any generation; returns a ticket to release at the end."""
        return self.accounting.admit(principal, request_id, request, plan, model, stream=stream)

    async def record(self, principal: Principal, ticket: Ticket, result: CascadeResult) -> None:
        """Commit a settled request to the ledger, charge its key, count its metrics."""
        await self.accounting.record(principal, ticket, result)


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
        # read the body here (at most max_bytes of it), so an over-long chunked body is refused
        # before any parser sees it, then replay it to the app
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            body = message.get("body", b"")
            seen += len(body)
            if seen > self.max_bytes:
                await self._reject(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
        await self.app(scope, _replay(replay, receive), send)

    async def _reject(self, send: Send) -> None:
        response = errors.error_response(errors.PayloadTooLarge(f"request body over {self.max_bytes} bytes"))
        await send({"type": "http.response.start", "status": 413, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    queue = list(messages)

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        if then is not None:
            return await then()  # after the body: wait for the disconnect like the server would
        return {"type": "http.disconnect"}

    return receive


def create_app(settings: Settings, *, engine: Engine | None = None, **engine_kwargs: Any) -> FastAPI:
    """Build the app. Pass `engine` to serve an engine built elsewhere (its lifecycle stays the
    caller's); otherwise one is built from settings and started and closed with the app."""
    owned = engine is None
    eng = engine if engine is not None else Engine.from_settings(settings, **engine_kwargs)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if owned or not eng.started:
            await eng.start()
        accounting = app.state.services.accounting
        try:
            await accounting.start()
            yield
        finally:
            await accounting.close()  # after the server has drained: every answered request is in
            if owned:
                await eng.close()

    app = FastAPI(title="tierroute", version="0.1.0", lifespan=lifespan)
    app.state.services = Services(settings, eng)
    errors.install(app)

    from router.api import routes_completions, routes_health, routes_models

    app.include_router(routes_health.router)
    app.include_router(routes_models.router)
    app.include_router(routes_completions.router)
    _add_metrics_route(app, settings)
    app.add_middleware(BodyLimit, max_bytes=settings.server.max_body_bytes)
    app.add_middleware(
        ResponseCounter,
        metrics=app.state.services.accounting.metrics,
        routes=lambda: [*app.openapi()["paths"], "/metrics"],
    )
    return app


def _add_metrics_route(app: FastAPI, settings: Settings) -> None:
    """Prometheus metrics, behind the API keys unless server.metrics_public."""

    def render(services: Services) -> Response:
        metrics = services.accounting.metrics
        return Response(metrics.render(), media_type=metrics.content_type)

    if settings.server.metrics_public:

        @app.get("/metrics", include_in_schema=False)
        async def metrics_public(services: ServicesDep) -> Response:
            return render(services)

    else:

        @app.get("/metrics", include_in_schema=False)
        async def metrics_private(services: ServicesDep, principal: PrincipalDep) -> Response:
            return render(services)
