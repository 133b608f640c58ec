"""Graders: decide whether an answer is right, given what only the grader may see.

A grader reads the model's text and the item's answer key (a reference answer, hidden tests).
Verifiers never see the answer key; suites build the caller's request without it. The answer
extraction reuses the verifiers' pure functions (`verifiers.math_answer`, `verifiers.extract`) so
that a grader and a verifier read an answer the same way; sandboxed code runs through
`verifiers.sandbox`.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

CHOICE_LETTERS = "ABCD"


@dataclass(frozen=True)
class Grade:
    correct: bool
    extracted: str | None = None  # the answer the grader read out of the text
    detail: str = ""  # why, in a few words (a failed test's last line, say)


def _fold(s: str) -> str:
    return " ".join(s.split()).casefold()


def grade_exact(text: str, reference: str | list[str]) -> Grade:
    """Right when the whole answer, stripped and case-folded with whitespace collapsed, equals
    the reference (or one of a list of references)."""
    refs = [reference] if isinstance(reference, str) else list(reference)
    got = _fold(text)
    return Grade(any(got == _fold(r) for r in refs), text.strip()[:200])


def grade_numeric(text: str, reference: float | int | str, *, cut_off: bool = False) -> Grade:
    """Right when the stated final answer (\\boxed{}, '####', 'answer:', else the last number)
    reads as the reference number (relative tolerance 1e-6).

    An answer cut off at its token limit (`cut_off`) is read by its stated markers only: its last
    number is wherever the generation stopped (a loop that keeps repeating a figure from the
    question, say), not an answer it gave."""
    from verifiers.math_answer import extract_answer, numbers_equal, parse_number

    ref = reference if isinstance(reference, int | float) else parse_number(str(reference))
    if ref is None:
        raise ValueError(f"numeric reference {reference!r} is not a number")
    answer = extract_answer(text, fallback_last_number=not cut_off)
    value = parse_number(answer)
    if answer is None:
        detail = "cut off before stating an answer" if cut_off else "no answer found"
    else:
        detail = "not a number" if value is None else ""
    return Grade(numbers_equal(value, float(ref)), answer, detail)


def grade_regex(text: str, pattern: str) -> Grade:
    """Right when the pattern matches anywhere in the answer (Python `re`, case-sensitive unless
    the pattern says `(?i)`)."""
    m = re.search(pattern, text)
    return Grade(m is not None, m.group(0)[:200] if m else None)


# "answer is (B)", "Answer: B", "the correct option is B." (on one line; the letter a capital)
_CHOICE_STATED = re.compile(r"(?i:answer|option|choice)[ \t]*(?:is|:)[ \t]*(?:\*\*)?\(?([A-Z])\)?(?![\w'])")
# the reply starts with the letter: "B", "B.", "(B)", "**B**"
_CHOICE_FIRST = re.compile(r"^\s*(?:\*\*)?\(?([A-Z])\)?(?:\*\*)?(?:[.):\s]|$)")
# a lone capital letter; one that opens a line as "A." or "A)" lists an option, it does not pick one
_CHOICE_LONE = re.compile(r"(?<![\w'])\(?([A-Z])\)?(?![\w'])")
_OPTION_LINE = re.compile(r"^[ \t]*\(?[A-Z][.)]", re.MULTILINE)


def extract_choice(text: str, letters: str = CHOICE_LETTERS) -> str | None:
    """The option letter an answer picks, or None. In order: a stated answer ('the answer is X',
    'Answer: X'), a reply that starts with the letter, else the one option letter that stands
    alone in the text (None when several do, or only in a list of the options)."""
    for pattern in (_CHOICE_STATED, _CHOICE_FIRST):
        for m in pattern.finditer(text):
            if m.group(1) in letters:
                return m.group(1)
    listed = {m.start() for m in _OPTION_LINE.finditer(text)}
    lone = set()
    for m in _CHOICE_LONE.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if m.group(1) in letters and not (line_start in listed and text[line_start : m.start()].strip(" \t(") == ""):
            lone.add(m.group(1))
    return lone.pop() if len(lone) == 1 else None


def grade_choice(text: str, reference: str, letters: str = CHOICE_LETTERS) -> Grade:
    got = extract_choice(text, letters)
    return Grade(got == reference.strip().upper(), got, "" if got else "no option letter found")


def build_program(prompt: str, code: str, entry_point: str | None) -> str:
    """The candidate program: the answer's code, after the prompt when the answer is only the
    function's body (or does not define the entry point itself, so its imports still count)."""
    if entry_point and re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        # the prompt first keeps its imports and helpers (its stub, a def with only a docstring,
        # is valid Python); the answer's own definition comes later and wins
        return f"{prompt}\n{code}\n"
    if code.startswith((" ", "\t")):
        return prompt + code + "\n"
    return f"{prompt}\n{code}\n"


async def grade_code_tests(
    text: str, tests: str, *, prompt: str = "", entry_point: str | None = None, timeout_s: float = 20.0
) -> Grade:
    """Right when the answer's code, followed by the hidden tests (and `check(entry_point)` when an
    entry point is named), runs to its end in the sandbox within the time limit.

    "To its end": the program's last line prints a random token, so an answer that exits early
    with status 0 (a stray ``sys.exit()``, an ``exit()`` under ``__main__``) is not graded right.
    The hidden tests run in the answer's own process, so an answer written to cheat the grader
    (reading the token out of its own code) could; the live verifier does not rely on this, see
    `verifiers.code_tests`."""
    from verifiers.extract import extract_code
    from verifiers.sandbox import run_python_async

    code = extract_code(text)
    program = build_program(prompt, code, entry_point) if prompt else code + "\n"
    program += f"\n\n{tests}\n"
    if entry_point:
        program += f"\ncheck({entry_point})\n"
    token = secrets.token_hex(16)
    # print() output sits in sys.stdout's buffer until exit; flush it so the token comes after it
    program += f"\nimport os as _os, sys as _sys\n_sys.stdout.flush()\n_os.write(1, b'\\n{token}\\n')\n"
    result = await run_python_async(program, timeout_s=timeout_s)
    if result.ok and token in result.stdout.split():
        return Grade(True, code[:2000])
    if result.ok:
        return Grade(False, code[:2000], "exited before the tests finished")
    if result.timed_out:
        why = "timed out"
    else:
        lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
        why = (result.killed_reason or "") + (lines[-1][:200] if lines else f"exit {result.returncode}")
    return Grade(False, code[:2000], why)
