"""The request's telemetry at the outermost edge of the app: its server span, and its log line.

Installed by the app factory only when tracing or JSON logs are on, and outside every other gate,
so a request refused by the Host allowlist or the body guard still gets its span and its line. The
server span continues the client's trace when it sent a valid W3C `traceparent`; the cascade's
spans hang under it (`router.telemetry.context`). The line is written when the response has
finished (a stream: its last byte), with what the request's account filled in: the request id
(the response's `id`, the ledger's `request_id`, the span's `tierroute.request_id`), the key's
name, and what the cascade did.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.telemetry import context, spans
from router.telemetry.context import RequestRecord
from router.telemetry.logs import REQUEST_LOGGER

log = logging.getLogger(REQUEST_LOGGER)
# the line of a request that ended without a settled answer (refused, failed, or not a completion)
_UNSETTLED: dict[str, Any] = dict.fromkeys(
    (
        "task",
        "final_tier",
        "escalated",
        "escalation_reason",
        "prompt_tokens",
        "completion_tokens",
        "cost_usd",
        "cache_hit",
    )
) | {"tiers_tried": []}
# a span's name is one of few (OpenTelemetry's HTTP conventions): `{method} {route}`, else the
# method alone, an unknown method `HTTP`; the client's own path stays in `url.path`
_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"))


class RequestTelemetry:
    """A server span per HTTP request (when tracing), and one log line per API request (`log_requests`)."""

    def __init__(self, app: ASGIApp, *, log_requests: bool, route_of: Callable[[str], str | None]) -> None:
        self.app = app
        self.log_requests = log_requests
        self.route_of = route_of  # a path's route template, None for no route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        method, path = scope.get("method", ""), scope.get("path", "")
        span = spans.server(
            self._span_name(method, path) if spans.active() else "",
            scope.get("headers", ()),
            {"http.request.method": method, "url.path": path},
        )
        record = RequestRecord(span)
        token = context.enter(record)
        status = 500  # what a client gets when the app fails before it starts a response

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException as exc:
            spans.fail(span, exc)
            raise
        finally:
            context.leave(token)
            latency_s = time.perf_counter() - t0
            if span.is_recording():
                span.set_attributes(_span_attributes(record, status))
                if status >= 500:
                    span.set_attribute("error.type", str(status))
            span.end()
            if self.log_requests and path.startswith("/v1/"):
                _log_line(record, method, path, status, latency_s)

    def _span_name(self, method: str, path: str) -> str:
        if method not in _METHODS:
            return "HTTP"
        route = self.route_of(path)
        return method if route is None else f"{method} {route}"


def _span_attributes(record: RequestRecord, status: int) -> dict[str, Any]:
    out: dict[str, Any] = {"http.response.status_code": status}
    if record.request_id is not None:
        out["tierroute.request_id"] = record.request_id
    if record.key is not None:
        out["tierroute.key"] = record.key
    if record.model is not None:
        out["gen_ai.request.model"] = record.model
    if record.surface is not None:
        out["tierroute.surface"] = record.surface
    facts = record.facts
    if facts:
        out |= {
            "tierroute.final_tier": facts["final_tier"],
            "tierroute.tiers_tried": facts["tiers_tried"],
            "tierroute.escalated": facts["escalated"],
            "tierroute.cost_usd": facts["cost_usd"],
            "gen_ai.usage.input_tokens": facts["prompt_tokens"],
            "gen_ai.usage.output_tokens": facts["completion_tokens"],
        }
        if facts["task"] is not None:
            out["tierroute.task"] = facts["task"]
    return out


def _log_line(record: RequestRecord, method: str, path: str, status: int, latency_s: float) -> None:
    fields: dict[str, Any] = {
        "request_id": record.request_id,
        "key": record.key,
        "method": method,
        "path": path,
        "model": record.model,
        "surface": record.surface,
        "status": status,
        "latency_ms": round(latency_s * 1000.0, 3),
        **(record.facts or _UNSETTLED),
    }
    log.info("%s %s %d", method, path, status, extra={"fields": fields})
