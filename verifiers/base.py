"""The verifier plugin API, as plugins import it.

The types live in the core (`router.verification`, `router.plugins`) because the cascade needs
them and must not depend on any verifier; this module names them for verifier authors. Plugins are
found through the entry-point group ``tierroute.verifiers``: each entry point names a callable
``register_verifiers(register)``, and ``register(name, factory)`` adds a factory
``factory(params: dict, ctx: VerifierContext) -> Verifier``. The built-ins register the same way.
"""

from __future__ import annotations

import math
from typing import Any

from router.plugins import VERIFIERS as ENTRY_POINT_GROUP
from router.plugins import SharedRegistry
from router.plugins import VerifierRegistry as Registry
from router.verification import (
    Score,
    SharedVerifier,
    Verdict,
    Verifier,
    VerifierContext,
    VerifierCost,
    VerifierError,
    VerifierFactory,
    VerifierSet,
    WeightedVerifier,
    uses_a_model,
    worst_cost,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Registry",
    "Score",
    "SharedRegistry",
    "SharedVerifier",
    "Verdict",
    "Verifier",
    "VerifierContext",
    "VerifierCost",
    "VerifierError",
    "VerifierFactory",
    "VerifierSet",
    "WeightedVerifier",
    "require_integers",
    "require_numbers",
    "uses_a_model",
    "worst_cost",
]


def require_numbers(params: Any, *keys: str) -> None:
    """Each named attribute of a verifier's parameters is a real number (a bool is not; NaN is
    refused, since every comparison with it is false and no bound would hold)."""
    for key in keys:
        value = getattr(params, key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{key} must be a number")
        if math.isnan(value):
            raise ValueError(f"{key} must be a number, not NaN")


def require_integers(params: Any, *keys: str) -> None:
    """Each named attribute of a verifier's parameters is an integer (a bool is not)."""
    for key in keys:
        value = getattr(params, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{key} must be an integer")
