"""Every error leaves the service in OpenAI's shape, with its status chosen here, by exception type.

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

Nothing else in the app picks a status, and no stack trace ever reaches a client.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from router.control.records import Conflict, NotFound
from router.errors import (
    AuthError,
    ContextLengthError,
    NotFoundError,
    QuotaError,
    RateLimitError,
    RequestError,
    TierrouteError,
    UnavailableError,
    UnknownModelError,
)

log = logging.getLogger(__name__)


class PayloadTooLarge(TierrouteError):
    pass


class PermissionDenied(TierrouteError):
    """The caller is known but not allowed this (403): e.g. sending tests without the permission."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


MAX_RETRY_AFTER_S = 3600


MAX_BUDGET_RESET_S = 31 * 86400  # a monthly budget resets at most a month away


# On a refusal no retry can turn into an answer (the request alone is over a budget or a token
# rate): the openai SDKs retry every 429 by default, and obey this header over their own rule, so a
# client is not made to send the same doomed request three times.
NO_RETRY = {"x-should-retry": "false"}


def retry_after(seconds: float, cap: int = MAX_RETRY_AFTER_S) -> str:
    """A Retry-After header value: whole seconds in [1, cap] (an hour unless a budget's reset
    says otherwise), whatever was computed or heard from upstream (NaN, infinity, negative or
    absurd values included)."""
    if not math.isfinite(seconds):
        return str(cap)
    return str(min(cap, max(1, math.ceil(seconds))))


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(exc: BaseException) -> JSONResponse:
    """Map one of our exceptions to its response."""
    headers: dict[str, str] = {}
    if isinstance(exc, NotFound):
        status, body = 404, error_body(str(exc), "invalid_request_error", exc.param, "not_found")
    elif isinstance(exc, Conflict):
        status, body = 409, error_body(str(exc), "invalid_request_error", exc.param, "conflict")
    elif isinstance(exc, UnknownModelError | NotFoundError):
        status, body = 404, error_body(str(exc), "invalid_request_error", exc.param, exc.code)
    elif isinstance(exc, ContextLengthError):
        status, body = 400, error_body(str(exc), "invalid_request_error", exc.param, exc.code)
    elif isinstance(exc, RequestError):
        status, body = 400, error_body(str(exc), "invalid_request_error", exc.param, exc.code)
    elif isinstance(exc, AuthError):
        status, body = 401, error_body(str(exc), "invalid_request_error", None, "invalid_api_key")
    elif isinstance(exc, PermissionDenied):
        status, body = 403, error_body(str(exc), "permission_error", exc.param, exc.code)
    elif isinstance(exc, QuotaError):
        status, body = 429, error_body(str(exc), "insufficient_quota", None, "insufficient_quota")
        if exc.retry_after is not None:  # when the budget resets (a day can be longer than the cap)
            headers["Retry-After"] = retry_after(exc.retry_after, MAX_BUDGET_RESET_S)
        else:
            headers.update(NO_RETRY)
        if exc.limit is not None:
            headers["x-tierroute-limit"] = exc.limit
    elif isinstance(exc, RateLimitError):
        status, body = 429, error_body(str(exc), exc.kind, None, "rate_limit_exceeded")
        if exc.retry_after is not None:  # None: the request alone is over the limit, waiting cannot help
            headers["Retry-After"] = retry_after(exc.retry_after)
        else:
            headers.update(NO_RETRY)
        if exc.limit is not None:
            headers["x-tierroute-limit"] = exc.limit
    elif isinstance(exc, UnavailableError):
        status, body = 503, error_body(str(exc), "server_error", None, "service_unavailable")
        headers["Retry-After"] = retry_after(exc.retry_after)
    elif isinstance(exc, PayloadTooLarge):
        status, body = 413, error_body(str(exc), "invalid_request_error", None, "payload_too_large")
    else:
        log.error("unhandled error", exc_info=exc)
        status, body = 500, error_body("The server had an error while processing your request.", "server_error")
    return JSONResponse(body, status_code=status, headers=headers)


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}


def _is_field(part: object) -> bool:
    """Whether one step of a pydantic error location names a field or index, rather than the
    member of a union that was tried (pydantic writes those as 'str', 'list[str]', 'constrained-str')."""
    if isinstance(part, int):
        return True
    text = str(part)
    return text != "body" and text not in _TYPE_NAMES and "[" not in text and "-" not in text


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    # the deepest error is the most specific: for a union, the member that got furthest
    first = max(errors, key=lambda e: len([p for p in e.get("loc", ()) if _is_field(p)]))
    kind = first.get("type")
    if kind == "json_invalid":
        return (
            f"We could not parse the JSON body of your request: {first.get('ctx', {}).get('error', 'invalid JSON')}",
            None,
        )
    param = ".".join(str(p) for p in first.get("loc", ()) if _is_field(p)) or None
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if param is None:
        if kind == "missing":
            return "The request has no body; send a JSON object.", None
        return f"The request body must be a JSON object: {msg}", None
    if kind == "missing":
        return f"Missing required parameter: '{param}'.", param
    others = len({tuple(p for p in e.get("loc", ()) if _is_field(p)) for e in errors}) - 1
    more = f" (and {others} more)" if others > 0 else ""
    return f"Invalid value for '{param}': {msg}{more}", param


def install(app: FastAPI) -> None:
    @app.exception_handler(TierrouteError)
    async def _ours(request: Request, exc: TierrouteError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return JSONResponse(error_body(message, "invalid_request_error", param, None), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = (
            str(exc.detail) if exc.status_code != 404 else f"Unknown request URL: {request.method} {request.url.path}"
        )
        return JSONResponse(
            error_body(message, "invalid_request_error", None, None),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)
