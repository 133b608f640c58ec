"""The request pipeline: one lifecycle for every API surface (`flow`), its SSE body
(`streaming`), and the stages plugins add to it (`stages`, the built-ins in `builtin`)."""

from router.pipeline.stages import Stage, StageContext, StageRefused

__all__ = ["Stage", "StageContext", "StageRefused"]
