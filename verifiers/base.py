"""The verifier plugin API, as plugins import it.

The types live in the core (`router.verification`, `router.plugins`) because the cascade needs
them and must not depend on any verifier; this module names them for verifier authors. Plugins are
found through the entry-point group ``tierroute.verifiers``: each entry point names a callable
``register_verifiers(register)``, and ``register(name, factory)`` adds a factory
``factory(params: dict, ctx: VerifierContext) -> Verifier``. The built-ins register the same way.
"""

from __future__ import annotations

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
]
