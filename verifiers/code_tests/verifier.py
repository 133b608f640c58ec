"""`CodeTestsVerifier`: caps what it reads, builds the program and its tests, turns a run into a score.

The program is the answer's code with the prompt's imports and helpers, held to
`verifiers.prompt_code`'s rule for callers without the tests permission: none of the client's
prompt code runs for them. The answer's own code always runs (in the sandbox). The tests are the
caller's and the prompt's examples (`verifiers.code_tests.steps`, `verifiers.code_tests.stated`),
run by `verifiers.code_tests.harness`.

The score's reason and details carry counts and a fixed vocabulary only (see
`verifiers.code_tests.judge.KINDS`): never the sandbox's output, which would make the response an
exfiltration channel. The full text (labels, exception messages, stderr) goes to the server log at
DEBUG.

Limits: the answer text, the prompt scanned for examples and the caller's tests are capped in
size (over a cap: score 0, reason ``too_large``); parsing and program assembly run off the event
loop; at most ``max_concurrency`` sandboxes run at once per verifier and at most ``max_queue`` wait,
beyond which the verifier raises OverloadedError (503 with Retry-After to the client).

Score: the fraction of tests that pass. With no tests at all: ``no_tests_score`` (0.5) when the code
compiles and loads cleanly, else 0. Code that does not parse as Python and is written in another
language (its fences say so, or the prompt asks for one by name: SQL, bash, JavaScript) is not
judged: the verifier abstains with reason ``not_python``.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from router.admission.slots import Slots, hold_all, verifier_slots
from router.generation import Generation, GenerationRequest
from verifiers.base import Score, VerifierContext, require_integers, require_numbers
from verifiers.code_tests.harness import HarnessRun, run_tests
from verifiers.code_tests.stated import MAX_PROMPT_CHARS, stated_steps
from verifiers.code_tests.steps import Step, called_name, caller_test_steps, doctest_steps, top_level_names
from verifiers.extract import foreign_language
from verifiers.prompt_code import build_program
from verifiers.sandbox import SandboxUnavailableError

log = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 100_000
MAX_TESTS_CHARS = 100_000
MAX_UNITS = 500


@dataclass(frozen=True)
class _Prepared:
    program: str | None  # None: no runnable Python
    steps: list[Step]
    refusal: str | None = None  # a KINDS entry when the input is refused before any run
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CodeTestsVerifier:
    doctest: bool = True
    stated: bool = True  # examples written in prose: f(x) == y, f(x) ➞ y, "Input: / Output:"
    timeout_s: float = 10.0  # the whole sandboxed run
    unit_timeout_s: float = 3.0  # one test; the first test to time out ends the run
    memory_mb: int = 512
    no_tests_score: float = 0.5
    max_concurrency: int = 0  # sandboxes at once per verifier; 0: the machine's CPU count
    max_queue: int = 0  # runs waiting for a sandbox; 0: four per sandbox slot; beyond it: 503
    name: str = "code_tests"
    # the host's slots every sandboxed run shares (the engine's `[sandbox]`), held after this verifier's own
    host_slots: Slots | None = field(default=None, repr=False, compare=False)
    _sandboxes: Slots = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.doctest, bool) or not isinstance(self.stated, bool):
            raise TypeError("doctest and stated must be true or false")
        require_numbers(self, "timeout_s", "unit_timeout_s", "no_tests_score")
        require_integers(self, "memory_mb", "max_concurrency", "max_queue")
        if self.timeout_s <= 0 or self.unit_timeout_s <= 0:
            raise ValueError("timeout_s and unit_timeout_s must be positive")
        if not 0.0 <= self.no_tests_score <= 1.0:
            raise ValueError("no_tests_score must be in [0, 1]")
        if self.memory_mb < 64 or self.max_concurrency < 0 or self.max_queue < 0:
            raise ValueError("memory_mb must be at least 64, max_concurrency and max_queue not negative")
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")
        if self.host_slots is not None and not isinstance(self.host_slots, Slots):
            raise TypeError("host_slots is the engine's, not a param")
        object.__setattr__(self, "_sandboxes", verifier_slots(self.name, self.slots, self.max_queue))

    @property
    def slots(self) -> int:
        return self.max_concurrency or os.cpu_count() or 2

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        prepared = await asyncio.to_thread(self._prepare, request, candidate.text)
        notes = list(prepared.notes)
        if prepared.refusal == "not_python":
            # code in another language is not this verifier's to judge: the policy's other
            # verifiers decide (README, "Tasks": the code policy falls back to degeneration)
            return Score.abstain("not_python", details={"reason": "not_python", "language": prepared.notes[0]})
        if prepared.refusal is not None:
            details = {"compiles": prepared.refusal != "syntax_error", "reason": prepared.refusal}
            return Score(0.0, prepared.refusal, details)
        assert prepared.program is not None
        try:
            async with hold_all(self._sandboxes, self.host_slots):
                run = await run_tests(
                    prepared.program,
                    prepared.steps,
                    timeout_s=self.timeout_s,
                    unit_timeout_s=self.unit_timeout_s,
                    memory_mb=self.memory_mb,
                )
        except SandboxUnavailableError as exc:
            log.error("code_tests: the sandbox is unavailable: %s", exc)
            return Score(0.0, "sandbox_unavailable", {"compiles": True, "reason": "sandbox_unavailable"})
        return self._verdict(run, prepared, notes)

    def _verdict(self, run: HarnessRun, prepared: _Prepared, notes: list[str]) -> Score:
        if log.isEnabledFor(logging.DEBUG):
            failed = [f"{u.label}: {u.kind} {u.detail}" for u in run.units if not u.passed]
            log.debug(
                "code_tests run: loaded=%s load=%s forged=%s failures=%s notes=%s\n%s",
                run.loaded,
                run.load_kind,
                run.forged,
                failed[:20],
                notes,
                run.log,
            )
        details: dict[str, Any] = {"compiles": True, "imports": run.loaded, "sandbox_s": round(run.duration_s, 3)}
        if notes:
            details["notes"] = notes  # fixed phrases of ours, never sandbox output
        if not run.loaded:
            kind = run.load_kind or "load_error"
            return Score(0.0, kind, {**details, "reason": kind})
        if not run.units:
            return Score(float(self.no_tests_score), "no_tests", {**details, "reason": "no_tests"})
        passed = sum(u.passed for u in run.units)
        total = len(run.units)
        by_source = {}
        for group in ("tests", "doctest"):
            us = [u for u in run.units if u.group == group]
            if us:
                by_source[group] = {"passed": sum(u.passed for u in us), "total": len(us)}
        failures = Counter(u.kind for u in run.units if not u.passed and u.kind)
        reason = "forged" if run.forged else ("passed" if passed == total else "failed")
        details.update(
            reason=reason,
            passed=passed,
            total=total,
            by_source=by_source,
            failures=dict(sorted(failures.items())),
            in_process=sum(u.in_process for u in run.units),
            forgeable=sum(u.forgeable for u in run.units),
        )
        value = 0.0 if run.forged else passed / total
        parts = ", ".join(
            f"{'caller tests' if g == 'tests' else 'prompt examples'} {c['passed']}/{c['total']}"
            for g, c in by_source.items()
        )
        text = f"{reason}: {passed}/{total} tests passed ({parts})"
        if failures:
            text += "; failures: " + ", ".join(f"{k} {n}" for k, n in sorted(failures.items()))
        return Score(value, text, details)

    def _prepare(self, request: GenerationRequest, text: str) -> _Prepared:
        """Everything before the run, off the event loop: caps, program assembly, parsing."""
        prompt = request.last_user_text()
        if len(text) > MAX_ANSWER_CHARS or len(prompt) > MAX_PROMPT_CHARS:
            return _Prepared(None, [], "too_large")
        built = build_program(request, text)
        program = built.source
        if len(program) > MAX_ANSWER_CHARS + MAX_PROMPT_CHARS:
            return _Prepared(None, [], "too_large")
        try:
            ast.parse(program)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            language = foreign_language(prompt, text)
            if language is not None:
                return _Prepared(None, [], "not_python", (_language_label(language),))
            return _Prepared(None, [], "syntax_error")
        steps: list[Step] = []
        notes: list[str] = []
        answer = top_level_names(program)
        tests = request.metadata.get("tests")
        if tests is not None:
            if isinstance(tests, str) or (isinstance(tests, list | tuple) and all(isinstance(t, str) for t in tests)):
                size = len(tests) if isinstance(tests, str) else sum(len(t) for t in tests)
                if size > MAX_TESTS_CHARS:
                    return _Prepared(None, [], "too_large")
                try:
                    steps += caller_test_steps(tests, answer)
                except (SyntaxError, ValueError, MemoryError, RecursionError):
                    # the caller's mistake; run it anyway as one test so it shows as failing
                    notes.append("metadata tests do not parse")
                    steps.append(Step("test", tests if isinstance(tests, str) else "", "tests (do not parse)", "tests"))
            else:
                notes.append("metadata tests ignored: not a string or a list of strings")
        examples: list[Step] = []
        if self.doctest:
            examples += doctest_steps(prompt, trusted=bool(request.metadata.get("client_code")), answer=answer)
        if self.stated:
            examples += stated_steps(prompt)
        # without the permission, an example of a function the prompt wrote and the answer did not
        # would test the prompt, running the client's code to do it (verifiers.prompt_code)
        steps += [s for s in examples if called_name(s.source) not in built.prompt_only]
        if sum(s.is_test for s in steps) > MAX_UNITS:
            return _Prepared(None, [], "too_large")
        return _Prepared(program, steps, None, tuple(notes))


def make_code_tests(params: dict[str, Any], ctx: VerifierContext) -> CodeTestsVerifier:
    if "host_slots" in params:
        raise TypeError("unexpected param 'host_slots'")
    return CodeTestsVerifier(**params, host_slots=ctx.sandboxes)


# the language names a score may report; any other fence word is model text and reads "other"
_LANGUAGES = frozenset(
    "bash sh shell zsh powershell ps1 sql mysql postgresql javascript js jsx typescript ts tsx java c cpp c++ "
    "csharp cs c# go golang rust rs ruby rb php kotlin swift scala haskell perl lua julia elixir dart r "
    "html css scss xml dockerfile makefile".split()
)


def _language_label(language: str) -> str:
    """A fence's info word is model text: reported only when it names a known language."""
    return language if language in _LANGUAGES else "other"


def assemble_program(request: GenerationRequest, text: str) -> str:
    """The program to test: the code in the answer, after the prompt's imports and helpers, or a
    plain completion joined to its code prompt; for a caller without the tests permission, only
    what of the prompt runs none of the client's code (`verifiers.prompt_code`)."""
    return build_program(request, text).source
