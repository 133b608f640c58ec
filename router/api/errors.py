"""Every error leaves the service in its API surface's shape, with its status chosen here, by exception type.

    OpenAI (chat, completions, Responses, everything else):
        {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
    Anthropic (`/v1/messages` and below):
        {"type": "error", "error": {"type": ..., "message": ...}}

The status, the headers and the words are chosen once, by exception type (`error_response`); the
dialect only spells them (`dialect` picks it from the request's path, so the body guard and the
host check, which run before any route, answer a Messages client in its own shape too). An
Anthropic error has no `param`: the field is named in its message (at its start when the words do
not already name it, as Anthropic's own errors do: "max_tokens: Field required"). Nothing else in
the app picks a status, and no stack trace ever reaches a client.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from router.control.records import Conflict, NotFound
from router.errors import (
    AuthError,
    NotFoundError,
    QuotaError,
    RateLimitError,
    RequestError,
    TierrouteError,
    UnavailableError,
    UnknownModelError,
    UpstreamRefusedError,
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


Dialect = Literal["openai", "anthropic"]
ANTHROPIC_PREFIX = "/v1/messages"  # the Messages API's routes: /v1/messages, /v1/messages/count_tokens

# Anthropic's error types by status (its API reference's list); 503 is ours for a tier or the
# ledger that cannot answer now, which Anthropic's clients retry as they retry its overload
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def dialect(path: str | None) -> Dialect:
    """The error shape a request's path speaks: Anthropic's under /v1/messages, else OpenAI's."""
    if path is not None and (path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")):
        return "anthropic"
    return "openai"


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def anthropic_body(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped error body (`error_body`) as Anthropic spells it, for `status`."""
    error = body["error"]
    message, param = str(error.get("message")), error.get("param")
    if param and param not in message:
        message = f"{param}: {message}"
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}


def spelt(status: int, body: dict[str, Any], headers: dict[str, str] | None, speaks: Dialect) -> JSONResponse:
    """The response for an error already chosen (status, OpenAI-shaped body), in `speaks`."""
    shown = anthropic_body(status, body) if speaks == "anthropic" else body
    return JSONResponse(shown, status_code=status, headers=headers)


def error_response(exc: BaseException, speaks: Dialect = "openai") -> JSONResponse:
    """Map one of our exceptions to its response, in the dialect of the surface it answers."""
    headers: dict[str, str] = {}
    if isinstance(exc, NotFound):
        status, body = 404, error_body(str(exc), "invalid_request_error", exc.param, "not_found")
    elif isinstance(exc, Conflict):
        status, body = 409, error_body(str(exc), "invalid_request_error", exc.param, "conflict")
    elif isinstance(exc, UnknownModelError | NotFoundError):
        status, body = 404, error_body(str(exc), "invalid_request_error", exc.param, exc.code)
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
    elif isinstance(exc, UpstreamRefusedError):  # no Retry-After: nothing is unavailable
        status, body = 502, error_body(str(exc), "server_error", None, "upstream_refused_request")
    elif isinstance(exc, PayloadTooLarge):
        status, body = 413, error_body(str(exc), "invalid_request_error", None, "payload_too_large")
    else:
        log.error("unhandled error", exc_info=exc)
        status, body = 500, error_body("The server had an error while processing your request.", "server_error")
    return spelt(status, body, headers, speaks)


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}


def _is_field(part: object) -> bool:
    """Whether one step of a pydantic error location names a field or index, rather than the
    member of a union that was tried (pydantic writes those as 'str', 'list[str]', 'constrained-str')."""
    if isinstance(part, int):
        return True
    text = str(part)
    return text != "body" and text not in _TYPE_NAMES and "[" not in text and "-" not in text


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    return validation_message(list(exc.errors()))


def validation_message(errors: list[Any], prefix: str | None = None) -> tuple[str, str | None]:
    """The words and the parameter of pydantic's errors (the deepest one), the parameter under
    `prefix` when given (a surface's item validated on its own: 'input.3')."""
    if prefix is not None:
        errors = [{**e, "loc": (*prefix.split("."), *e.get("loc", ()))} for e in errors]
    if not errors:
        return "invalid request", prefix
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
        return error_response(exc, dialect(request.url.path))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return spelt(400, error_body(message, "invalid_request_error", param, None), None, dialect(request.url.path))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = (
            str(exc.detail) if exc.status_code != 404 else f"Unknown request URL: {request.method} {request.url.path}"
        )
        body = error_body(message, "invalid_request_error", None, None)
        return spelt(exc.status_code, body, getattr(exc, "headers", None), dialect(request.url.path))

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc, dialect(request.url.path))


class _OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    """An error as OpenAI's APIs (and tierroute's other routes) send it."""

    error: _OpenAIErrorDetail


class _AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """An error as Anthropic's Messages API sends it."""

    type: Literal["error"]
    error: _AnthropicErrorDetail


_STATUS_WHY = {
    400: "Invalid request: a parameter, a body that is not valid JSON or Unicode, a field not supported (named)",
    401: "No valid API key",
    403: "The key may not do this (a model it may not use, tests it may not send)",
    404: "Unknown model",
    413: "Body over the size limit",
    429: "A rate limit or budget is spent",
    502: "The tier's upstream failed this request alone (it answers the tier's own): not retried",
    503: "A tier or the cost ledger cannot answer now (Retry-After)",
}


def openapi_errors(speaks: Dialect) -> dict[int | str, dict[str, Any]]:
    """The error responses of a route in `speaks`, for its OpenAPI entry."""
    model = AnthropicError if speaks == "anthropic" else OpenAIError
    return {status: {"model": model, "description": why} for status, why in _STATUS_WHY.items()}
