"""What routes depend on: the services built once per app, and the caller's identity.

Kept apart from the app factory so the routes and the factory import this module and not each
other.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, Request

from router.admission.accounting import Accounting
from router.admission.auth import Authenticator, Principal, credentials, is_admin, is_client
from router.api.errors import PermissionDenied
from router.cache.service import ResponseCache
from router.config import Settings
from router.control.refusals import RefusalLog
from router.control.registry import KeyRegistry
from router.engine import Engine
from router.errors import AuthError
from router.pipeline.flow import Pipeline
from router.pipeline.stages import StageRegistry, build_stages
from router.quality.shadow import ShadowService


class Services:
    """Everything a route needs, built once per app."""

    def __init__(self, settings: Settings, engine: Engine, *, stages: StageRegistry | None = None) -> None:
        self.settings = settings
        self.engine = engine
        # keys, teams and user limits: the ledger database's, polled (router.control.registry)
        self.keys = KeyRegistry(settings, models=engine.cascade.model_names())
        self.auth = Authenticator(settings.server, keys=lambda: self.keys.snapshot)
        self.accounting = Accounting(settings, engine, user_quota=self.keys.user_quota)
        self.shadow = ShadowService(
            settings, engine.cascade, self.accounting.ledger, self.accounting.metrics, sandboxes=engine.sandboxes
        )
        self.cache = ResponseCache(settings, self.accounting.ledger, self.accounting.metrics.registry)
        self.refusals = RefusalLog(self.keys.store, self.accounting.metrics.registry)
        # one request lifecycle for every API surface, with the configured stages (router.pipeline)
        self.pipeline = Pipeline(
            engine, self.accounting, self.cache, self.shadow, build_stages(settings.stages, stages)
        )


# The hot dependencies are coroutines although none awaits: FastAPI runs a plain function dependency
# in its thread pool, a hand-off to a worker thread and back for each of them on every request
# (three per completion, a third of the router's own time under load: py-spy, `tierroute bench
# overhead`). Each is a few microseconds of work that never blocks (a key is one SHA-256 and one
# lookup, router.admission.auth), so they run on the event loop; the one costly case, a key
# compared with every older salted hash, is handed to the authenticator's scanning thread.


def cache_control(http: Request) -> str | None:
    """The client's Cache-Control, every line of it: HTTP reads repeated lines as one list (RFC
    9110, 5.3), and a `no-store` on the second line must count as much as on the first."""
    return ", ".join(http.headers.getlist("cache-control")) or None


async def get_services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


ServicesDep = Annotated[Services, Depends(get_services)]


def presented(request: Request) -> str | None:
    """The key a request presents, as an Authorization header: `Authorization: Bearer KEY`, or
    Anthropic's `x-api-key: KEY` (router.admission.auth.credentials)."""
    return credentials(request.headers.get("authorization"), request.headers.get("x-api-key"))


async def get_any_principal(request: Request, services: ServicesDep) -> Principal:
    """Any valid key, whatever its roles (the OpenAPI schema, the same for every caller)."""
    return await services.auth.authenticate_async(presented(request))


AnyPrincipalDep = Annotated[Principal, Depends(get_any_principal)]


async def get_principal(principal: AnyPrincipalDep) -> Principal:
    """A key with the client role: the /v1 API."""
    if not is_client(principal):
        raise PermissionDenied(
            f"Key '{principal.key_id}' has roles {sorted(principal.roles)}, not 'client': it may not use /v1. "
            "Give it the client role, or use a client key, to send requests to /v1.",
            code="not_a_client_key",
        )
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def get_admin(request: Request, services: ServicesDep) -> Principal:
    """A key with the admin role: the admin API. A client key gets 403 on every admin route, a
    wrong, revoked or expired key 401; each refusal of a known key is audited at a bounded rate
    (`router.control.refusals`). A coroutine, as the other key checks: as a plain function it
    scanned salted keys for every guess on a thread of FastAPI's pool, which a flood of guesses
    at /admin/ filled, stalling every route that needs one."""
    route = getattr(request.scope.get("route"), "path", request.url.path[:200])
    try:
        principal = await services.auth.authenticate_async(presented(request))
    except AuthError as exc:
        await _refused(services, exc.key_id, request.method, route, 401, exc.reason)
        raise
    if not is_admin(principal):
        known = None if services.auth.open else principal.key_id  # a keyless server's caller is no key
        await _refused(services, known, request.method, route, 403, "not_admin")
        raise PermissionDenied(
            f"Key '{principal.key_id}' may not use the admin API: it needs the admin role.", code="not_an_admin_key"
        )
    return principal


async def _refused(services: Services, key: str | None, method: str, route: str, status: int, reason: str) -> None:
    """A refused admin attempt noted: only a known key's may write an audit row (in a worker
    thread); anyone else's is a count."""
    if key is None:
        services.refusals.note(None, method, route, status, reason)
    else:
        await asyncio.to_thread(services.refusals.note, key, method, route, status, reason)


AdminDep = Annotated[Principal, Depends(get_admin)]


async def get_metrics_reader(principal: AnyPrincipalDep, services: ServicesDep) -> Principal:
    """A key with the admin or metrics role: /metrics names every key and what it spent, which one
    team's client key must not learn of another's. A client key alone gets 403. A server without
    keys (`server.allow_unauthenticated`) answers whoever reaches it, this page included."""
    if not (is_admin(principal) or "metrics" in principal.roles or services.auth.open):
        raise PermissionDenied(
            f"Key '{principal.key_id}' may not read /metrics (it names every key and its spend): it needs the "
            "metrics or admin role (`tierroute keys create NAME --metrics`).",
            code="not_a_metrics_key",
        )
    return principal


MetricsReaderDep = Annotated[Principal, Depends(get_metrics_reader)]


async def get_report_reader(request: Request, services: ServicesDep) -> Principal:
    """A key with the admin or report role: the dashboard under /ui/ (router.dashboard), which
    shows every key's spend, every team's budget and the quality of every tier. A client or
    metrics key gets 403, no key or a wrong one 401; refusals are noted as the admin API's are.
    A server without keys (`server.allow_unauthenticated`, loopback only) answers whoever
    reaches it, as its admin API and /metrics do."""
    route = getattr(request.scope.get("route"), "path", request.url.path[:200])
    try:
        principal = await services.auth.authenticate_async(presented(request))
    except AuthError as exc:
        await _refused(services, exc.key_id, request.method, route, 401, exc.reason)
        raise
    if not (is_admin(principal) or "report" in principal.roles or services.auth.open):
        await _refused(services, principal.key_id, request.method, route, 403, "not_a_report_key")
        raise PermissionDenied(
            f"Key '{principal.key_id}' may not read the dashboard (it shows every key's spend): it needs the "
            "report or admin role (`tierroute keys create NAME --report`).",
            code="not_a_report_key",
        )
    return principal


ReportReaderDep = Annotated[Principal, Depends(get_report_reader)]
