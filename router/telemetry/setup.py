"""Whether to trace, and the tracing pipeline's life: built at app creation, installed for the
app's lifespan, flushed and shut down with it.

Tracing is on when `[telemetry] endpoint` is set, or any of the standard variables
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_SERVICE_NAME is (the OTLP
exporter then reads them as the OpenTelemetry spec says; with only the service name set it sends to
the spec's default, http://localhost:4318/v1/traces). OTEL_SDK_DISABLED=true turns it off whatever
else is set. Off, this module imports nothing of OpenTelemetry and the app installs no tracer.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from router.config import TelemetrySettings
from router.telemetry import spans

if TYPE_CHECKING:
    from router.telemetry.otel import OtelTracer

ENV_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME")
DEFAULT_SERVICE_NAME = "tierroute"


def wanted(settings: TelemetrySettings, environ: Mapping[str, str] | None = None) -> bool:
    """Whether this config (and environment) asks for traces."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return settings.endpoint is not None or any(env.get(name) for name in ENV_VARS)


def traces_url(endpoint: str | None) -> str | None:
    """The endpoint as the exporter takes it: a base URL (no path) gets OTLP's /v1/traces, as
    OTEL_EXPORTER_OTLP_ENDPOINT does; a URL with a path is used as it is."""
    if endpoint is None or urlsplit(endpoint).path not in ("", "/"):
        return endpoint
    return endpoint.rstrip("/") + "/v1/traces"


class Tracing:
    """A tracer provider with its exporter: `install` it for the app's life, `close` flushes it.

    `Tracing.otlp(settings)` exports in batches over OTLP/HTTP (protobuf); `Tracing.to(exporter)`
    hands each span to `exporter` as it ends (tests: the SDK's in-memory exporter)."""

    def __init__(self, tracer: OtelTracer, close_timeout_s: float, exporter: Any) -> None:
        self.tracer = tracer
        self.close_timeout_s = close_timeout_s
        self.exporter = exporter

    @classmethod
    def otlp(cls, settings: TelemetrySettings) -> Tracing:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from router.telemetry.otel import OtlpExporter

        # None leaves the endpoint to OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, as the exporter reads them
        exporter = OtlpExporter(endpoint=traces_url(settings.endpoint), timeout=settings.export_timeout_s)
        return cls._with(settings, exporter, BatchSpanProcessor(exporter))

    @classmethod
    def to(cls, exporter: Any, settings: TelemetrySettings | None = None) -> Tracing:
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        return cls._with(settings or TelemetrySettings(), exporter, SimpleSpanProcessor(exporter))

    @classmethod
    def _with(cls, settings: TelemetrySettings, exporter: Any, processor: Any) -> Tracing:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        from router.telemetry.otel import OtelTracer

        name = settings.service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        provider.add_span_processor(processor)
        return cls(OtelTracer(provider, processor), settings.export_timeout_s, exporter)

    def install(self) -> None:
        spans.install(self.tracer)

    def close(self) -> None:
        """Stop tracing through this pipeline and send what it holds, for at most
        `export_timeout_s`: the SDK's shutdown waits up to 30 s on a collector that is down or
        hung (a timeout per queued batch), past a container's stop timeout; what is not sent by
        then is dropped, the flush left to finish (or not) on a daemon thread."""
        spans.uninstall(self.tracer)
        # flushes the batch processor, then closes the exporter
        flush = threading.Thread(target=self.tracer.provider.shutdown, name="tierroute-trace-flush", daemon=True)
        flush.start()
        flush.join(self.close_timeout_s)
        if flush.is_alive():  # the rest is dropped: no export is begun or retried after this
            self.exporter.shutdown()
