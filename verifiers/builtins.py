"""The built-in verifiers, registered exactly as a third-party plugin registers its own.

pyproject.toml names `register_verifiers` under the entry-point group ``tierroute.verifiers``.
Each factory builds a verifier from its params and raises TypeError or ValueError on bad ones
(an unknown key is a TypeError), which the registry reports with the verifier's name.
"""

from __future__ import annotations

from collections.abc import Callable

from router.plugins import RegisterVerifier
from verifiers import sandbox
from verifiers.arithmetic import make_arithmetic
from verifiers.base import VerifierFactory
from verifiers.choice import make_choice
from verifiers.code_tests import make_code_tests
from verifiers.confidence import make_confidence
from verifiers.consistency import make_self_consistency
from verifiers.cross_tier import make_cross_tier
from verifiers.degeneration import make_degeneration
from verifiers.execution import make_execution
from verifiers.format import make_format
from verifiers.instructions import make_instructions
from verifiers.judge import make_judge
from verifiers.learned import make_learned
from verifiers.math_answer import make_math_answer
from verifiers.steps import make_steps
from verifiers.tool_call import make_tool_call

BUILTINS: dict[str, VerifierFactory] = {
    "confidence": make_confidence,
    "format": make_format,
    "math_answer": make_math_answer,
    "code_tests": make_code_tests,
    "self_consistency": make_self_consistency,
    "judge": make_judge,
    "learned": make_learned,
    "degeneration": make_degeneration,
    "choice": make_choice,
    "cross_tier": make_cross_tier,
    "execution": make_execution,
    "tool_call": make_tool_call,
    "arithmetic": make_arithmetic,
    "instructions": make_instructions,
    "steps": make_steps,
}


# Versions of the built-ins whose scores changed since eval runs were first stored: stored scores
# are keyed by the version (evals.runner.verifier_fingerprint), so a rerun rescores exactly these.
# code_tests 2: examples stated in prose (`f(x) == y`, `f(x) ➞ y`, "should return", Input/Output).
# code_tests 3: abstains on code in another language instead of scoring it a syntax error.
# instructions 1: the first reader of constraints; bump it when the reader or a check changes.
VERSIONS: dict[str, int] = {"code_tests": 3, "instructions": 1}


# what a verifier needs of the machine: the reason it cannot run here, or None
CHECKS: dict[str, Callable[[], str | None]] = {"code_tests": sandbox.available, "execution": sandbox.available}


def register_verifiers(register: RegisterVerifier) -> None:
    for name, factory in BUILTINS.items():
        register(name, factory, check=CHECKS.get(name))
