"""Which built-in verifiers ask a tier's model for work (`uses_model`): an imported run refuses
them and a learned estimator takes them as features only when asked (`--with-costly-verifiers`)."""

from __future__ import annotations

import pytest

from router.verification import SharedVerifier, VerifierContext, uses_a_model
from verifiers.builtins import BUILTINS


@pytest.mark.parametrize(
    ("name", "params", "uses"),
    [
        ("self_consistency", {}, True),
        ("judge", {"tier": "large"}, True),
        ("cross_tier", {"tier": "large"}, True),
        ("execution", {"second_opinion": True}, True),
        ("execution", {}, False),
        ("confidence", {}, False),
        ("code_tests", {}, False),
        ("choice", {}, False),
        ("degeneration", {}, False),
        ("math_answer", {}, False),
        ("format", {}, False),
        ("arithmetic", {}, False),
        ("instructions", {}, False),
        ("steps", {}, False),
    ],
)
def test_uses_a_model(name: str, params: dict, uses: bool) -> None:
    v = BUILTINS[name](dict(params), VerifierContext(tier="small"))
    assert uses_a_model(v) is uses
    assert uses_a_model(SharedVerifier(v)) is uses  # as a tier's SharedRegistry hands it out
