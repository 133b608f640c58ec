"""The FastAPI app factory. Settings and the engine are injected; nothing lives in module globals.

Before any route sees a request, two gates run on the raw ASGI messages: the Host allowlist
(a keyless loopback server answers only loopback names, so a web page cannot drive it through the
browser by DNS rebinding) and the body guard (size, and JSON that every later step can handle:
valid UTF-8, no lone surrogates, no NaN or Infinity, not nested past the parser's depth). A body
the guard refuses gets a 400 in its surface's error shape (OpenAI's, or Anthropic's under
/v1/messages) instead of failing wherever the bad text lands.
The guard parses a body only when its request presents a valid key; without one the route sees
no body and answers 401, so a caller without a key cannot make the service parse megabytes.
"""

from __future__ import annotations

import asyncio
import email.message
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Response
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.admission.auth import allowed_hosts, credentials, docs_enabled
from router.api import (
    errors,
    routes_admin,
    routes_completions,
    routes_feedback,
    routes_health,
    routes_messages,
    routes_models,
    routes_responses,
    routes_ui,
)
from router.api.deps import AnyPrincipalDep, MetricsReaderDep, Services, ServicesDep
from router.api.shedding import InFlightLimit
from router.config import Settings
from router.engine import Engine
from router.errors import RequestError, TierrouteError, UnavailableError
from router.metrics import ResponseCounter, RouteTemplates
from router.pipeline.stages import StageRegistry
from router.telemetry import setup as telemetry
from router.telemetry.middleware import RequestTelemetry

log = logging.getLogger(__name__)


API_VERSION = "0.1.0"  # the OpenAPI schema's version (scripts/gen_admin_openapi.py writes it too)


class HostAllowlist:
    """400 for a request whose Host header names no allowed host (any port)."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str]) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            raw = next((v for k, v in scope.get("headers", []) if k == b"host"), None)
            name = host_name(raw.decode("latin-1")) if raw is not None else None
            if name not in self.hosts:
                shown = "no Host header" if name is None else f"Host {name[:100]!r}"
                exc = RequestError(
                    f"{shown} is not served here (server.allowed_hosts)", param=None, code="host_not_allowed"
                )
                await errors.error_response(exc, errors.dialect(scope.get("path")))(scope, receive, send)
                return
        await self.app(scope, receive, send)


def host_name(header: str) -> str:
    """The host of a Host header, lowercased, without its port or a trailing dot."""
    header = header.strip().lower()
    if header.startswith("["):  # an IPv6 literal: [::1]:8000
        end = header.find("]")
        name = header[: end + 1] if end > 0 else header
    else:
        name = header.rpartition(":")[0] if ":" in header else header
    return name.rstrip(".")


def _is_json(scope: Scope) -> bool:
    """Whether FastAPI will parse this body as JSON: no Content-Type, or application/json or +json."""
    value = next((v for k, v in scope.get("headers", []) if k == b"content-type"), None)
    if value is None:
        return True
    message = email.message.Message()
    message["content-type"] = value.decode("latin-1")
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def json_problem(body: bytes) -> str | None:
    """Why a JSON body cannot be served, or None when it is fine (or not JSON at all: the route
    reports that in its own words)."""
    try:
        value = json.loads(body)
    except RecursionError:
        return "The JSON body is nested too deeply."
    except UnicodeDecodeError:
        return "The request body is not valid UTF-8."
    except ValueError:
        return None
    try:
        # one C-speed pass finds NaN/Infinity (and 1e999, read as infinity) and lone surrogates
        # ("\ud800"), which no tokenizer, database or JSON encoder downstream accepts
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        return "The request contains text that is not valid Unicode (a lone surrogate such as \\ud800)."
    except RecursionError:
        return "The JSON body is nested too deeply."
    except ValueError:
        return "NaN and Infinity are not valid JSON numbers."
    return None


class BodyLimit:
    """413 for bodies over the limit, whether announced by Content-Length or streamed chunked;
    400 for a JSON body that is not valid text or holds non-finite numbers (see json_problem).

    A body is parsed only for a caller whose key is valid (`authenticate`): every route that takes
    a body needs one, and parsing a megabyte of JSON costs tens of milliseconds of CPU, twice
    (here, then FastAPI), which a caller without a key must not be able to spend. A request
    without a valid key reaches the app with its body withheld, so its route refuses it by its
    own rules (401; the admin API's audit of refused keys) without reading a byte of it: FastAPI
    runs a route's key check before it validates the body."""

    OFF_LOOP_BYTES = 64 * 1024  # bigger bodies are checked in a worker thread

    def __init__(self, app: ASGIApp, max_bytes: int, authenticate: Callable[[str | None], Awaitable[Any]]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.authenticate = authenticate

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
                    await self._reject(scope, send)
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
                await self._reject(scope, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            keyed = bool(body) and await self._keyed(scope)
        except UnavailableError as exc:  # no slot to check the key in now: the route would say 503 too
            await errors.error_response(exc, errors.dialect(scope.get("path")))(scope, _replay([], receive), send)
            return
        if body and not keyed:
            await self.app(scope, _replay([{"type": "http.request", "body": b"", "more_body": False}], receive), send)
            return
        if body and _is_json(scope):
            small = len(body) <= self.OFF_LOOP_BYTES
            problem = json_problem(body) if small else await asyncio.to_thread(json_problem, body)
            if problem is not None:
                response = errors.error_response(
                    RequestError(problem, code="invalid_body"), errors.dialect(scope.get("path"))
                )
                await response(scope, _replay([], receive), send)
                return
        replay: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
        await self.app(scope, _replay(replay, receive), send)

    async def _keyed(self, scope: Scope) -> bool:
        """Whether the request presents a key that is valid now (any caller, on a server without keys),
        read from its headers as the routes read it (`Authorization`, or Anthropic's `x-api-key`)."""
        headers: dict[bytes, bytes] = {}
        for name, value in scope.get("headers", []):
            headers.setdefault(name, value)  # the first of a repeated header, as Starlette's headers.get reads it
        auth, api_key = headers.get(b"authorization"), headers.get(b"x-api-key")
        try:
            presented = credentials(
                None if auth is None else auth.decode("latin-1"), None if api_key is None else api_key.decode("latin-1")
            )
            await self.authenticate(presented)
        except UnavailableError:  # no scan slot: a valid key must not lose its body to the load (503)
            raise
        except TierrouteError:  # a wrong, revoked or expired key, or none
            return False
        return True

    async def _reject(self, scope: Scope, send: Send) -> None:
        response = errors.error_response(
            errors.PayloadTooLarge(f"request body over {self.max_bytes} bytes"), errors.dialect(scope.get("path"))
        )
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


def create_app(
    settings: Settings,
    *,
    engine: Engine | None = None,
    tracing: telemetry.Tracing | None = None,
    stages: StageRegistry | None = None,
    **engine_kwargs: Any,
) -> FastAPI:
    """Build the app. Pass `engine` to serve an engine built elsewhere (its lifecycle stays the
    caller's); otherwise one is built from settings and started and closed with the app. Traces
    go to `tracing` when given, else over OTLP when `[telemetry]` or OTEL_* ask for it
    (`router.telemetry.setup`), else nowhere; the tracer is installed for the app's lifespan.
    The configured request stages are made from `stages` when given, else from the entry points."""
    owned = engine is None
    eng = engine if engine is not None else Engine.from_settings(settings, **engine_kwargs)
    if tracing is None and telemetry.wanted(settings.telemetry):
        tracing = telemetry.Tracing.otlp(settings.telemetry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if owned or not eng.started:
            await eng.start()
        accounting = app.state.services.accounting
        shadow = app.state.services.shadow
        keys = app.state.services.keys
        if tracing is not None:
            tracing.install()
        try:
            await keys.start()  # the ledger database's keys (the config's imported once), then polled
            await accounting.start()
            await shadow.start()  # reads the day's shadow spend back from the ledger
            yield
        finally:
            await shadow.close()  # before the ledger closes: running shadow work is still recorded
            await app.state.services.cache.close()  # its stores in flight, before the ledger closes
            await accounting.close()  # after the server has drained: every answered request is in
            await asyncio.to_thread(app.state.services.refusals.flush)  # refused admin calls still counted
            await keys.close()
            app.state.services.auth.close()  # its thread for scanning salted keys
            if owned:
                await eng.close()
            if tracing is not None:
                await asyncio.to_thread(tracing.close)  # the last spans exported, off the loop

    # FastAPI's own /docs, /redoc and /openapi.json answer anyone: ours go through the keys.
    # No slash redirects: Starlette builds their Location from the client's own Host header
    # (`/v1/models/` sent with `Host: evil.example` went to http://evil.example/v1/models), so a
    # path with a trailing slash is a 404 in OpenAI's shape like any other unknown path.
    app = FastAPI(
        title="tierroute",
        version=API_VERSION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,
    )
    app.state.services = Services(settings, eng, stages=stages)
    errors.install(app)

    app.include_router(routes_health.router)
    app.include_router(routes_models.router)
    app.include_router(routes_completions.router)
    app.include_router(routes_responses.router)
    app.include_router(routes_messages.router)
    app.include_router(routes_feedback.router)
    app.include_router(routes_admin.router)
    if settings.dashboard.enabled:
        app.include_router(routes_ui.router)
        app.add_middleware(routes_ui.UiHeaders)
    _add_metrics_route(app, settings)
    extra_routes = ["/metrics"]
    if docs_enabled(settings.server):
        extra_routes += _add_docs_routes(app)
    app.add_middleware(
        BodyLimit, max_bytes=settings.server.max_body_bytes, authenticate=app.state.services.auth.authenticate_async
    )
    # past the bound, 503 at once: before the key is checked or the body read (router.api.shedding)
    app.add_middleware(
        InFlightLimit,
        limit=settings.server.max_in_flight,
        max_body_bytes=settings.server.max_body_bytes,
        lag_s=None if settings.server.shed_lag_ms is None else settings.server.shed_lag_ms / 1000,
        admitted=lambda: app.state.services.accounting.limits.in_flight,
    )
    hosts = allowed_hosts(settings.server)
    if hosts is not None:
        app.add_middleware(HostAllowlist, hosts=hosts)
    app.add_middleware(
        ResponseCounter,
        metrics=app.state.services.accounting.metrics,
        routes=lambda: [*app.openapi()["paths"], *extra_routes],
    )
    json_logs = settings.logging.format == "json"
    if tracing is not None or json_logs:  # outermost: refused requests get their span and line too
        route_of = RouteTemplates(lambda: [*app.openapi()["paths"], *extra_routes]).match
        app.add_middleware(RequestTelemetry, log_requests=json_logs, route_of=route_of)
    return app


def _add_docs_routes(app: FastAPI) -> list[str]:
    """The OpenAPI schema and its two viewers, each behind the API keys like every other route."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(principal: AnyPrincipalDep) -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def swagger(principal: AnyPrincipalDep) -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="tierroute API")

    @app.get("/redoc", include_in_schema=False)
    async def redoc(principal: AnyPrincipalDep) -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title="tierroute API")

    return ["/openapi.json", "/docs", "/redoc"]


def _add_metrics_route(app: FastAPI, settings: Settings) -> None:
    """Prometheus metrics: for a key with the admin or metrics role (a client key alone gets 403:
    the page names every key and its spend), or anyone when server.metrics_public."""

    def render(services: Services) -> Response:
        metrics = services.accounting.metrics
        return Response(metrics.render(), media_type=metrics.content_type)

    if settings.server.metrics_public:

        @app.get("/metrics", include_in_schema=False)
        async def metrics_public(services: ServicesDep) -> Response:
            return render(services)

    else:

        @app.get("/metrics", include_in_schema=False)
        async def metrics_private(services: ServicesDep, principal: MetricsReaderDep) -> Response:
            return render(services)
