"""The built-in agreement rules of shadow escalation (`router.quality.agreement`), one per task.

Agreement is grading with the larger tier's answer in the reference's place, so the rules read
answers exactly as the graders do (`evals.grading`): the final number of a maths answer, the
option letter of a multiple-choice one. Code runs the caller's own tests against both answers,
in the sandbox, and only when the request carries tests: the API puts them there only for a key
allowed to send them (`tierroute.tests`); no other code is ever run for a comparison. Registered
through the entry-point group ``tierroute.agreement`` as a third-party rule would be.
"""

from __future__ import annotations

from router.generation import GenerationRequest
from router.quality.agreement import Agreement, RegisterRule

_CODE_TIMEOUT_S = 10.0


async def number_rule(request: GenerationRequest, answer: str, shadow: str) -> Agreement | None:
    from verifiers.math_answer import answers_agree, extract_answer

    a = extract_answer(answer, fallback_last_number=True)
    b = extract_answer(shadow, fallback_last_number=True)
    if a is None or b is None:
        return None
    agree = answers_agree(a, b)
    return Agreement(agree, "number", f"{a} {'==' if agree else '!='} {b}", a, b)


async def choice_rule(request: GenerationRequest, answer: str, shadow: str) -> Agreement | None:
    from evals.grading import extract_choice

    a, b = extract_choice(answer), extract_choice(shadow)
    if a is None or b is None:
        return None
    return Agreement(a == b, "choice", f"{a} {'==' if a == b else '!='} {b}", a, b)


async def code_rule(request: GenerationRequest, answer: str, shadow: str) -> Agreement | None:
    tests = request.metadata.get("tests")
    if not tests or not request.metadata.get("client_code"):
        return None  # no tests from a caller allowed to send them: nothing may run
    from verifiers import sandbox
    from verifiers.code_tests.harness import run_tests
    from verifiers.code_tests.steps import caller_test_steps
    from verifiers.code_tests.verifier import assemble_program

    if sandbox.available() is not None:
        return None
    try:
        steps = caller_test_steps(tests)
    except SyntaxError:
        return None
    passed = []
    for text in (answer, shadow):
        run = await run_tests(assemble_program(request, text), steps, timeout_s=_CODE_TIMEOUT_S)
        passed.append("".join("1" if u.passed else "0" for u in run.units if u.group == "tests"))
    a, b = passed
    agree = a == b
    return Agreement(agree, "code_tests", f"tests passed {a} {'==' if agree else '!='} {b}", a, b)


def register_agreement(register: RegisterRule) -> None:
    register("maths", number_rule)
    register("choice", choice_rule)
    register("code", code_rule)
