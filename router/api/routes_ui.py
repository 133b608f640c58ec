"""The dashboard under /ui/ (router.dashboard): its static page, and one JSON endpoint per page.

The page (`/ui/`, its script and style sheet) holds no data and is the same for everyone; every
figure comes from `/ui/api/*`, which answers only a key with the admin or report role (401
without one, 403 for a client or metrics key: `router.api.deps.get_report_reader`). The page
asks for the key once, keeps it in the tab's sessionStorage and sends it as an Authorization
header from its own script: never in a URL, a cookie, or a log line.

Every response under /ui/ carries the headers `UiHeaders` sets: a Content-Security-Policy that
allows scripts, styles and fetches from this origin only (no inline script or style, no
`eval`, nothing from elsewhere), no framing, no MIME sniffing, no referrer, and `no-store` so a
shared machine keeps no copy of the figures. The JSON endpoints read the ledger on a worker
thread, so a long window never holds the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.api.deps import ReportReaderDep, Services, ServicesDep
from router.dashboard import evals, figures, reading
from router.errors import NotFoundError, RateLimitError

log = logging.getLogger(__name__)

PREFIX = "/ui"
# A page's figures are built from a window of ledger rows on threads of their own, never asyncio's
# default pool, which admission, the key registry's refresh (revocations), admin routes and the
# body guard share: one report key's week-long builds queued all of those behind it (an outside
# review: a revocation took 31 s to arrive, a large-body completion 73 s). At most MAX_BUILDS run
# at once; one more is refused with 429 at once, not queued.
MAX_BUILDS = 2
_BUILDS = ThreadPoolExecutor(max_workers=MAX_BUILDS, thread_name_prefix="tierroute-ui")
_running = 0
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)
# the page's files, by the name in its URL: nothing else under static/ is ever served
STATIC = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Since = Annotated[str | None, Query(max_length=64)]


class UiHeaders:
    """ASGI middleware: the security headers on every response under /ui/, errors included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {h for h, _ in HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": [*kept, *HEADERS]}
            await send(message)

        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await with_headers(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            # an unhandled error under /ui/ still gets the headers (the server's own 500 would not)
            log.exception("dashboard request failed")
            if started:
                raise
            await with_headers(
                {"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": b'{"error":{"message":"internal error"}}'})


async def _build(work: Callable[..., Any], *args: Any) -> Any:
    """`work` on the dashboard's own threads, or 429 when MAX_BUILDS are running already."""
    global _running
    if _running >= MAX_BUILDS:
        raise RateLimitError(f"the dashboard is building {MAX_BUILDS} pages already: try again shortly", 2.0)
    _running += 1
    try:
        return await asyncio.get_running_loop().run_in_executor(_BUILDS, work, *args)
    finally:
        _running -= 1


def _file(name: str) -> Response:
    body = resources.files("router.dashboard").joinpath("static", name).read_bytes()
    return Response(body, media_type=STATIC[name])


@router.get("/")
async def page() -> Response:
    return _file("index.html")


@router.get("/static/{name}")
async def static(name: str) -> Response:
    if name not in STATIC:
        raise NotFoundError(f"no dashboard file {name[:100]!r}")
    return _file(name)


@router.get("/api/overview")
async def overview(services: ServicesDep, viewer: ReportReaderDep, since: Since = None, until: Since = None) -> Any:
    w = reading.window(since, until)

    def build() -> dict[str, Any]:
        return figures.overview(reading.entries(services.settings, w), services.settings, w)

    return await _build(build)


@router.get("/api/quality")
async def quality(services: ServicesDep, viewer: ReportReaderDep, since: Since = None, until: Since = None) -> Any:
    w = reading.window(since, until)

    def build() -> dict[str, Any]:
        entries, pairs, labels = reading.quality_rows(services.settings, w)
        return figures.quality(entries, pairs, labels, services.settings, w)

    return await _build(build)


@router.get("/api/latency")
async def latency(services: ServicesDep, viewer: ReportReaderDep, since: Since = None, until: Since = None) -> Any:
    w = reading.window(since, until)
    backends = services.engine.backends
    live = {tier: b.stats() for tier, b in backends.items()}  # read on the loop, as /metrics reads them
    deployments = {tier: b.deployment_stats() for tier, b in backends.items()}

    def build() -> dict[str, Any]:
        return figures.latency(reading.entries(services.settings, w), w, live, deployments)

    return await _build(build)


@router.get("/api/keys")
async def keys(services: ServicesDep, viewer: ReportReaderDep, since: Since = None, until: Since = None) -> Any:
    w = reading.window(since, until)
    refusals = _refusals(services)

    def build() -> dict[str, Any]:
        entries = reading.entries(services.settings, w)
        return figures.keys(entries, w, reading.budgets(services.keys.plane), refusals)

    return await _build(build)


@router.get("/api/evals")
async def eval_curves(
    services: ServicesDep, viewer: ReportReaderDep, suite: Annotated[str | None, Query(max_length=200)] = None
) -> Any:
    report = services.settings.dashboard.eval_report
    if report is None:
        return {"report": None, "suites": [], "suite": None, "verifiers": [], "tiers": [], "oracle": [], "random": []}
    return await _build(evals.curves, report, suite)


def _refusals(services: Services) -> dict[str, float]:
    """Requests refused before generation since this process started, by reason (/metrics'
    `tierroute_requests_refused_total`): rate limits and budgets."""
    found: dict[str, float] = {}
    for metric in services.accounting.metrics.refused.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                found[sample.labels["reason"]] = sample.value
    return found
