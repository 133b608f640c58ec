"""The built-in backends, registered through the entry-point group ``tierroute.backends`` exactly
as a third-party backend registers its own. Each factory imports its module only when a tier uses
it, so a config without a local tier never imports llama_cpp."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.backends.base import Backend
    from router.config import Settings, TierSettings
    from router.plugins import BackendFactory


def _llamacpp(tier: TierSettings, settings: Settings) -> Backend:
    from router.backends.llama.backend import LlamaCppBackend

    return LlamaCppBackend.from_settings(tier, settings)


def _openai(tier: TierSettings, settings: Settings) -> Backend:
    from router.backends.openai import OpenAIBackend

    return OpenAIBackend.from_settings(tier, settings)


def register_backends(register: Callable[[str, BackendFactory], None]) -> None:
    register("llamacpp", _llamacpp)
    register("openai", _openai)
