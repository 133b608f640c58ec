"""OpenTelemetry traces and JSON logs: what an operator follows a request through its tiers with.

Off and free unless configured: the cascade, the verifiers and the backends call the facade in
`router.telemetry.spans`, which hands out one shared no-op span while no tracer is installed, and
the OpenTelemetry SDK is imported only by `router.telemetry.otel` when `[telemetry]` or the
standard OTEL_* variables ask for export (`router.telemetry.setup`). This package's `__init__`
imports nothing, so importing a facade module stays instant.
"""
