"""The checker's verdicts: whether a reply from the box satisfies a step's check.

The box only reports plain values (`verifiers.code_tests.protocol`); the operator, the expected
value and the comparison live here, outside the sandbox. A value the box could only describe as an
object equals nothing: a test that needs one compared fails as ``not_plain_data``.

`KINDS` is every reason a score or a test can give; nothing else reaches a response.
"""

from __future__ import annotations

import ast

from verifiers.code_tests.protocol import Reply
from verifiers.code_tests.steps import Check, Step
from verifiers.outside_judge import ORDER, Opaque, contains_opaque, same

# Every reason a score or a test can give; nothing else reaches a response.
KINDS = (
    "passed",
    "failed",
    "no_tests",
    "too_large",
    "syntax_error",
    "load_error",
    "import_error",
    "mismatch",
    "assertion",
    "exception",
    "not_plain_data",
    "timeout",
    "memory",
    "crashed",
    "forged",
    "not_run",
    "bad_tests",
    "sandbox_unavailable",
    "not_python",
)


def failure_kind(reply: Reply) -> str:
    if reply.exc == "AssertionError":
        return "assertion"
    if reply.exc == "MemoryError":
        return "memory"
    return "exception"


def judge(check: Check, reply: Reply) -> str | None:
    """None when the reply satisfies the check, else the failure's kind."""
    if not reply.ok:
        return failure_kind(reply)
    if check.judge == "ran":
        return None
    value = reply.value
    if check.judge in ("truthy", "falsy"):
        if contains_opaque(value):
            truth = reply.truth  # only the object knows its truth; returning True would do the same
            if truth is None:
                return "not_plain_data"
        else:
            truth = bool(value)
        return None if truth == (check.judge == "truthy") else "assertion"
    if check.judge == "compare":
        if check.pair:
            if not (isinstance(value, tuple) and len(value) == 2):
                return "forged"
            left, right = value
        elif check.literal_left:
            left, right = check.expected, value
        else:
            left, right = value, check.expected
        if check.cmp in ("Is", "IsNot"):
            is_same = (value is check.expected) if not isinstance(value, Opaque) else False
            return None if is_same == (check.cmp == "Is") else "assertion"
        if contains_opaque(left) or contains_opaque(right):
            return "not_plain_data"
        if check.cmp == "Eq":
            result = same(left, right)
        elif check.cmp == "NotEq":
            result = not same(left, right)
        else:
            fn = next((f for k, f in ORDER.items() if k.__name__ == check.cmp), None)
            if fn is None:
                return "forged"
            try:
                result = bool(fn(left, right))
            except Exception:  # noqa: BLE001 - the comparison itself failed: the assert would have raised
                return "exception"
        return None if result else "assertion"
    return "forged"


def judge_doctest(step: Step, reply: Reply) -> str | None:
    if step.exc:
        if reply.ok:
            return "mismatch"
        return None if reply.exc == step.exc else "mismatch"
    if not reply.ok:
        return failure_kind(reply)
    value = reply.value
    got = reply.printed + (repr(value) + "\n" if step.expr and value is not None else "")
    if " ".join(got.split()) == " ".join(step.want.split()):
        return None
    if step.expr and not reply.printed:
        try:
            expected = ast.literal_eval(step.want.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            if contains_opaque(value):
                return "mismatch"
            return None if " ".join(str(value).split()) == " ".join(step.want.split()) else "mismatch"
        return None if same(value, expected) else "mismatch"
    return "mismatch"
