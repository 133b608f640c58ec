from __future__ import annotations

import pytest

from verifiers.base import Registry, Verifier, VerifierContext, VerifierError
from verifiers.builtins import BUILTINS, register_verifiers

NAMES = {
    "confidence",
    "format",
    "math_answer",
    "code_tests",
    "self_consistency",
    "judge",
    "degeneration",
    "cross_tier",
    "choice",
    "execution",
    "tool_call",
    "arithmetic",
    "instructions",
    "steps",
}
MINIMAL = {"format": {"json": True}, "judge": {"tier": "big"}, "cross_tier": {"tier": "big"}}


def test_the_entry_point_lists_every_builtin() -> None:
    reg = Registry.from_entry_points()
    assert NAMES <= set(reg.names())
    assert set(BUILTINS) == NAMES | {"learned"}  # learned needs a trained artifact: see test_learned.py


def test_every_builtin_builds_and_follows_the_protocol() -> None:
    reg = Registry()
    register_verifiers(reg.register)
    ctx = VerifierContext(tier="small")
    for name in NAMES:
        v = reg.create(name, MINIMAL.get(name, {}), ctx)
        assert isinstance(v, Verifier)
        assert v.name == name


def test_bad_params_are_reported_with_the_verifiers_name() -> None:
    reg = Registry()
    register_verifiers(reg.register)
    ctx = VerifierContext(tier="small")
    for name in NAMES:
        with pytest.raises(VerifierError, match=f"verifier '{name}'"):
            reg.create(name, {**MINIMAL.get(name, {}), "no_such_param": 1}, ctx)
    with pytest.raises(VerifierError, match="'judge'.*tier"):
        reg.create("judge", {}, ctx)


def test_a_second_instance_can_take_its_own_name() -> None:
    reg = Registry()
    register_verifiers(reg.register)
    v = reg.create("format", {"regex": "^A", "name": "starts_with_a"}, VerifierContext(tier="small"))
    assert v.name == "starts_with_a"
