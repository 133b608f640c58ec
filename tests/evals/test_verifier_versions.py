"""A built-in verifier whose scores changed declares a version; stored scores are keyed by it."""

from __future__ import annotations

from evals.runner import verifier_fingerprint
from evals.store import canonical, digest
from verifiers.builtins import BUILTINS, VERSIONS


def test_a_versioned_verifier_is_rescored_and_the_others_keep_their_stored_scores() -> None:
    assert set(VERSIONS) <= set(BUILTINS)
    unversioned = digest("verifier", "code_tests", canonical({}))
    assert verifier_fingerprint("code_tests", {}) != unversioned  # the prose examples: rescored
    assert verifier_fingerprint("confidence", {"stat": "min"}) == digest(
        "verifier", "confidence", canonical({"stat": "min"})
    )  # unchanged: the committed runs' scores are still found
