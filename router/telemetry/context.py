"""One request's telemetry record: its server span and the facts of its log line, found by the
code that serves it through a context variable.

`router.telemetry.middleware` opens the record when a request arrives (only when tracing or JSON
logs are on); the request's account (`router.admission.lifecycle`) fills in its id, key and, once
settled, what the cascade did. Off, `current()` is None and those hooks return at once.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from router.telemetry.spans import NOOP, Span


@dataclass
class RequestRecord:
    """What is known of a request for its span and its log line (no prompt, no key: the key's name)."""

    span: Span = NOOP
    request_id: str | None = None
    key: str | None = None
    model: str | None = None
    surface: str | None = None  # the API it came through: "chat.completions", "responses", "messages", ...
    facts: dict[str, Any] = field(default_factory=dict)  # the settled answer's: tiers, tokens, cost


_current: ContextVar[RequestRecord | None] = ContextVar("tierroute_request_record", default=None)


def current() -> RequestRecord | None:
    return _current.get()


def request_span() -> Span:
    """The server span of the request being served, or `NOOP` (tracing off, or no request)."""
    record = _current.get()
    return NOOP if record is None else record.span


def enter(record: RequestRecord) -> Any:
    """Make `record` the current one; returns the token `leave` takes."""
    return _current.set(record)


def leave(token: Any) -> None:
    _current.reset(token)
