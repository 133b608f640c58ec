"""The `code_tests` verifier: run the caller's own tests against the code in the answer, in the sandbox.

Tests come only from what a real caller sends (its ``tierroute.tests``, the prompt's ``>>>``
examples and the examples it states in prose), never a grader's reference tests: see "Eval
hygiene" in docs/design.md. The answer's code runs in the sandbox, in a process that only
*reports*: the checker here, outside the box, decides whether each test passed, and the
expectation never enters the box. One module per job:

- `verifier`: `CodeTestsVerifier`, its params and limits, the program to test
  (`verifiers.prompt_code`), and the score: counts and a fixed vocabulary, never the box's output.
- `steps`: the caller's tests and the ``>>>`` examples as steps, each with the checks that say what
  the box is asked and how its reply is judged; which tests stay in-process or are forgeable.
- `stated`: examples a prompt states in prose (``f(x) == y``, ``f(x) ➞ y``, "Input: / Output:").
- `harness`: one sandboxed run, a step at a time; what a worker that stalls, ends or lies fails.
- `protocol`: the checker's end of the wire: a request with a fresh id, a plain-data reply read as
  hostile.
- `worker`: the program that runs in the box, shipped as source text; it imports only the stdlib.
- `judge`: whether a reply satisfies a check, and `KINDS`, every reason a score or test can give.

The verifier is registered by name (`code_tests`) in `verifiers.builtins`; `CodeTestsVerifier`
and its factory are re-exported here, so that registration and callers name the package, not its
layout. Its modules never import the package itself.
"""

from verifiers.code_tests.verifier import CodeTestsVerifier, make_code_tests

__all__ = ["CodeTestsVerifier", "make_code_tests"]
