"""The tracing facade the request path calls: a span, or one shared no-op when tracing is off.

The cascade, the verifiers, the backends and the ledger write each ask this module for a span and
set attributes on it. While no tracer is installed (`install`, done by the app's lifespan when
`router.telemetry.setup` found an endpoint), `start` returns `NOOP` without allocating anything,
and callers guard attribute work with `span.is_recording()`: the off path costs a global read and
an attribute lookup per span, and imports no part of OpenTelemetry.

Spans are parented explicitly (`parent=`), never through a "current span" attached to the
context: the cascade is an async generator whose steps interleave with the route's, and an
attached context would have to be detached in the same order across those steps. A request's
server span reaches the cascade through `router.telemetry.context`; a tier attempt's span reaches
its backend and verifiers on `GenerationRequest.trace`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

Kind = Literal["internal", "server", "client"]


class Span(Protocol):
    """What the request path does with a span (a subset of OpenTelemetry's `Span`)."""

    def set_attribute(self, key: str, value: Any) -> None: ...

    def set_attributes(self, attributes: Mapping[str, Any]) -> None: ...

    def is_recording(self) -> bool: ...

    def end(self, end_time: int | None = None) -> None: ...


class Tracer(Protocol):
    """An installed tracer (`router.telemetry.otel.OtelTracer`)."""

    def start(
        self, name: str, parent: Span | None, kind: Kind, attributes: Mapping[str, Any] | None, links: Sequence[Span]
    ) -> Span: ...

    def server(self, name: str, headers: Iterable[tuple[bytes, bytes]], attributes: Mapping[str, Any]) -> Span: ...

    def fail(self, span: Span, exc: BaseException) -> None: ...

    def traceparent(self, span: Span) -> str | None: ...


class _NoSpan:
    """The span of a request while tracing is off: accepts everything, records nothing."""

    __slots__ = ()

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        return None

    def is_recording(self) -> bool:
        return False

    def end(self, end_time: int | None = None) -> None:
        return None


NOOP: Span = _NoSpan()
_tracer: Tracer | None = None  # the process's tracer: one OTLP pipeline per process, as OTel's own global


def install(tracer: Tracer) -> None:
    global _tracer
    _tracer = tracer


def uninstall(tracer: Tracer) -> None:
    """Remove `tracer` if it is the installed one (an app shut down after another started keeps theirs)."""
    global _tracer
    if _tracer is tracer:
        _tracer = None


def active() -> bool:
    return _tracer is not None


def start(
    name: str,
    parent: Span | None = None,
    *,
    kind: Kind = "internal",
    attributes: Mapping[str, Any] | None = None,
    links: Sequence[Span] = (),
) -> Span:
    """A started span under `parent` (a root when None or the no-op), or `NOOP` when tracing is off.
    The caller ends it."""
    tracer = _tracer
    if tracer is None:
        return NOOP
    return tracer.start(name, parent, kind, attributes, links)


def server(name: str, headers: Iterable[tuple[bytes, bytes]], attributes: Mapping[str, Any]) -> Span:
    """A request's server span, continuing the client's trace when its W3C `traceparent` is valid."""
    tracer = _tracer
    if tracer is None:
        return NOOP
    return tracer.server(name, headers, attributes)


def fail(span: Span, exc: BaseException) -> None:
    """Mark `span` failed by `exc` (its type in `error.type`; never its message, which may quote input)."""
    tracer = _tracer
    if tracer is not None and span.is_recording():
        tracer.fail(span, exc)


def traceparent(span: Span) -> str | None:
    """The W3C `traceparent` header naming `span`, for an upstream call; None when off. A span the
    sampler dropped (the client's trace, sent unsampled) still names its trace, flagged unsampled."""
    tracer = _tracer
    if tracer is None or span is NOOP:
        return None
    return tracer.traceparent(span)
