"""Run the caller's own tests against the code in the answer, in the sandbox.

Tests come only from what a real caller sends:

- ``request.metadata["tests"]``: Python test code (a string, or a list of strings, one test each).
  Each top-level ``assert`` is one test, each ``def test_*()`` is one test, everything else is
  setup run in order; a script with neither is one test that passes when it runs without error.
  The answer's code is importable as ``solution`` too, so ``from solution import f`` works.
- with ``doctest = true`` (the default), the ``>>>`` examples in the request's last user message
  (or prompt), such as a HumanEval docstring's. An example with no expected output is setup.
- with ``stated = true`` (the default), examples the prompt states in prose: a call followed by
  what it gives (``f(x) == y``, ``f(x) ➞ y``, ``->``, ``=>``, ``==>``, ``=``, ``returns``, ``should
  return``, ``# => y``), "For x = ... the output should be y", and "Input: ... / Output: y" tables.
  Half the HumanEval prompts have no ``>>>`` but state examples this way. Whoever the caller, these
  are held to the untrusted rule below: the call names a function the prompt defines (``def f(``),
  with literal arguments only, and the value is a literal; each becomes ``f(args) == value``,
  judged outside the sandbox like an assert.

Never a grader's reference tests: see "Eval hygiene" in docs/design.md.

Who decides a test passed. The answer's code runs first in its process and can take that process
over (replace functions, read every frame, write to any descriptor, exit). So the process that runs
it only *reports*, and the checker here, outside the sandbox, decides. The worker in the sandbox
answers one request at a time on a pipe; each request carries a fresh random id that the answer must
echo, so replies cannot be written ahead; a reply is plain data: whether the code raised (and the
exception's type name), what it printed, and the value of an expression as a tagged tree of
numbers, strings, bytes, lists, tuples, sets and dicts (anything else is "an object", which
equals nothing). The expectation never enters the sandbox:

- a doctest: the checker compares what was printed and the value's repr with the expected output;
- ``assert A <op> B`` with one comparison: the worker evaluates the sides (only the side that is
  not a literal, when one is) and the checker applies the operator to the plain values;
- ``assert not X`` / ``assert X``: the worker evaluates X, the checker asks for falsy / truthy;
- an assert that holds more (``abs(f(x) - y) < tol``, ``math.isclose``, a chained comparison,
  ``len(f(x)) == 3``): the checker computes it from the values of its leaves, which are all the
  worker is asked for (`verifiers.outside_judge`); an ``and``-joined assert is one check per link;
- a ``def test_*()`` whose body is straight-line code (assignments, calls, asserts) is run as
  those statements, its asserts split as above.

What stays in-process (counted in ``details["in_process"]``): a test function with loops or
branches, a test script, a test given as a list of strings that is not one assert. Their verdict
is "ran without raising", which code that takes over its own interpreter can fake. Those, and the
tests whose expectation the worker computes itself (``f(1) == ref(1)``, ``check(f(1), 2)``,
``all(...)``), are counted in ``details["forgeable"]``. A worker that exits early, stalls, or
answers out of protocol fails every test it did not answer in protocol; an answer out of protocol
is counted as ``forged``.

The program is the answer's code with the prompt's imports and helpers, held to
`verifiers.prompt_code`'s rule for callers without the tests permission: none of the client's
prompt code runs for them. The answer's own code always runs (in the sandbox).

The score's reason and details carry counts and a fixed vocabulary only (see ``KINDS``): never the
sandbox's output, which would make the response an exfiltration channel. The full text (labels,
exception messages, stderr) goes to the server log at DEBUG.

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
import contextlib
import functools
import inspect
import json
import logging
import operator
import os
import re
import secrets
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from router.admission.slots import Slots, hold_all, verifier_slots
from router.generation import Generation, GenerationRequest
from verifiers import outside_judge
from verifiers.base import Score, VerifierContext, require_integers, require_numbers
from verifiers.extract import compiles, defined_names, foreign_language
from verifiers.outside_judge import Failed, Judge, Opaque, contains_opaque, same, split_and, truth_of
from verifiers.prompt_code import build_program
from verifiers.sandbox import Limits, SandboxUnavailableError, start_python

log = logging.getLogger(__name__)

_PS1 = re.compile(r"^(?P<indent>[ \t]*)>>>(?: (?P<src>.*)|$)")
_PS2 = re.compile(r"^[ \t]*\.\.\.(?: (?P<src>.*)|$)")
_END_OF_WANT = ('"""', "'''", "```")

MAX_ANSWER_CHARS = 100_000
MAX_PROMPT_CHARS = 200_000  # the text scanned for >>> examples
MAX_TESTS_CHARS = 100_000
MAX_UNITS = 500
_MAX_REPLY_BYTES = 1 << 20

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
_CMP: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


@dataclass(frozen=True)
class Check:
    """One request to the worker and how the checker judges the reply.

    judge: ``ran`` (no exception), ``truthy``, ``falsy``, ``compare`` (``op`` between the value and
    ``expected``, or between the two values of an evaluated pair when ``pair``), ``outside`` (the
    expression is computed here from the values of its leaves, `verifiers.outside_judge`, and is
    true, or is ``expected`` when that is a bool)."""

    op: str  # exec or eval
    source: str
    judge: str = "ran"
    cmp: str = ""  # the ast.cmpop class name
    expected: Any = None
    pair: bool = False
    literal_left: bool = False  # the literal was the left operand
    forgeable: bool = False  # code that takes over the box could pass it (outside_judge.Judge.forgeable)
    shadowed: frozenset[str] = frozenset()  # for ``outside``: builtins the test's setup rebinds


@dataclass(frozen=True)
class Step:
    """One thing the harness runs: setup, or a test (assert / call / script / doctest)."""

    kind: str  # setup, test, doctest
    source: str
    label: str
    group: str  # tests or doctest: each group runs in its own copy of the solution's namespace
    want: str = ""
    exc: str | None = None  # a doctest that expects this exception type
    checks: tuple[Check, ...] = ()  # a test's requests; one ``ran`` check of ``source`` when empty
    expr: bool = False  # a doctest whose source is an expression
    own_ns: bool = False  # a test function's body: its locals stay its own
    loose: bool = False  # a doctest whose expression holds what the box could use to forge its output

    @property
    def is_test(self) -> bool:
        return self.kind != "setup"

    @property
    def in_process(self) -> bool:
        return self.kind == "test" and all(c.judge == "ran" for c in self.plan())

    @property
    def forgeable(self) -> bool:
        """Whether code that takes over the box could make this test pass (in-process ones too)."""
        return self.is_test and (self.in_process or self.loose or any(c.forgeable for c in self.plan()))

    def plan(self) -> tuple[Check, ...]:
        if self.checks:
            return self.checks
        return (Check("eval" if self.expr else "exec", self.source),)


def assemble_program(request: GenerationRequest, text: str) -> str:
    """The program to test: the code in the answer, after the prompt's imports and helpers, or a
    plain completion joined to its code prompt; for a caller without the tests permission, only
    what of the prompt runs none of the client's code (`verifiers.prompt_code`)."""
    return build_program(request, text).source


def doctest_steps(text: str, *, trusted: bool = True, answer: Iterable[str] = ()) -> list[Step]:
    """The ``>>>`` examples in ``text``, leniently parsed (indentation need not be consistent).

    A prompt is client text, so its examples are client code. Unless the caller may have code run
    (`trusted`: a key with the tests permission, or the operator's own eval data), only examples
    that call a function by name with literal arguments (``f(3, [1, 2], key="x")``) and state what
    they should give are kept; setup lines and every other example are dropped unrun.

    An example that states ``True`` or ``False`` for an expression holding more than one value
    (``abs(f(x) - 1.5) < 1e-6``) is judged outside the box like an assert; any other example whose
    source is more than one value of the answer's (``answer``: the program's names) is counted
    forgeable: the box sees everything it computes."""
    judge = Judge(answer)
    lines = text.splitlines()
    steps: list[Step] = []
    i = 0
    while i < len(lines):
        m = _PS1.match(lines[i])
        if m is None:
            i += 1
            continue
        indent = m.group("indent")
        source = [m.group("src") or ""]
        i += 1
        while i < len(lines) and (m2 := _PS2.match(lines[i])) is not None:
            source.append(m2.group("src") or "")
            i += 1
        want: list[str] = []
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if not stripped or _PS1.match(line) or stripped.startswith(_END_OF_WANT):
                break
            ends_docstring = stripped.endswith(_END_OF_WANT)
            if ends_docstring:
                line = line.rstrip()[:-3]
            want.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
            if ends_docstring:
                break
        src = "\n".join(source)
        if not src.strip() or not compiles(src):
            continue
        if not trusted and (not want or not _literal_call(src)):
            continue
        label = ">>> " + _short(src)
        expr = _is_expression(src)
        node = ast.parse(src, mode="eval").body if expr else None
        loose = node is None or not judge.sealed_leaf(node)
        if node is not None and [w.strip() for w in want] in (["True"], ["False"]) and not judge.is_leaf(node):
            stated = want[0].strip() == "True"
            check = Check("eval", src, "outside", "exact", stated, forgeable=judge.forgeable(node))
            steps.append(Step("test", src, label, "doctest", checks=(check,)))
        elif want and want[0].startswith("Traceback (most recent call last)"):
            exc = want[-1].split(":", 1)[0].strip().rsplit(".", 1)[-1]
            steps.append(Step("doctest", src, label, "doctest", exc=exc, expr=expr, loose=loose))
        elif want:
            steps.append(Step("doctest", src, label, "doctest", want="\n".join(want), expr=expr, loose=loose))
        else:
            steps.append(Step("setup", src, label, "doctest"))
    return steps


def _literal_call(src: str) -> bool:
    """Whether `src` is one call of a plain name with literal arguments only."""
    try:
        node = ast.parse(src, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return False
    args = [*node.args, *(k.value for k in node.keywords if k.arg is not None)]
    if len(args) != len(node.args) + len(node.keywords):
        return False  # **kwargs
    for arg in args:
        try:
            ast.literal_eval(arg)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False
    return True


def _top_level_names(program: str) -> frozenset[str]:
    """The names the program binds at its top level: its functions and classes, and the names it
    assigns (``f = lambda x: ...``)."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return frozenset()
    names = set(defined_names(program))
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return frozenset(names)


def _called_name(src: str) -> str | None:
    """The plain name ``src`` calls when it is one call expression, else None."""
    try:
        node = ast.parse(src, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None


def _is_expression(src: str) -> bool:
    try:
        ast.parse(src, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


# ----------------------------------------------------------------------------------------------
# examples stated in prose: ``f(x) == y``, ``f(x) ➞ y``, ``f(x) should return y``, "Input: / Output:"

# what may stand before an example's call on its line: a bullet, "For example:", "for", "assert"
_STATED_LEAD = re.compile(
    r"[ \t]*(?:[*\-•][ \t]*|\d+[.)][ \t]*)?"
    r"(?:(?:for[ \t]+example|for[ \t]+instance|examples?|e\.g\.)[ \t]*[:,]?[ \t]*)?"
    r"(?:(?:for|assert)[ \t]+)?",
    re.IGNORECASE,
)
# between the call and the value it should give
_STATED_SEP = re.compile(
    r"[ \t]*(?:#[ \t]*)?"
    r"(?P<sep>==>|==|=>|-->|->|➞|→|=(?!=)|(?:should[ \t]+)?return(?:s)?\b|should[ \t]+be\b|gives\b)"
    r"[ \t]*:?[ \t]*"
)
_DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+(?P<name>[A-Za-z_]\w*)[ \t]*\(", re.MULTILINE)
# "For lst = [1,2,3] the output should be 14", "For s = "abcde", c = "ae", the result should be ..."
_FOR_LEAD = re.compile(r"[ \t]*(?:[*\-•][ \t]*)?for[ \t]+(?=[A-Za-z_])", re.IGNORECASE)
_FOR_OUTPUT = re.compile(
    r"\bthe[ \t]+(?:output|result)[ \t]+(?:should[ \t]+be|will[ \t]+be|is)\b[ \t]*:?[ \t]*", re.IGNORECASE
)
_INPUT = re.compile(r"^[ \t]*Input[ \t]*:[ \t]*(?P<args>.*?)[ \t]*$", re.IGNORECASE)
_OUTPUT = re.compile(r"^[ \t]*Output[ \t]*:[ \t]*(?P<want>.*?)[ \t]*$", re.IGNORECASE)
_NAMED_LINE = re.compile(r"^[ \t]*(?P<name>[A-Za-z_]\w*)[ \t]*[:=][ \t]*(?P<value>.+?)[ \t]*$")
# Bounds on what one prompt costs to read, whatever it holds (it is client text, read on a thread
# that holds the GIL): one call's or value's text (and so the literal a set is built from), the
# functions whose examples are looked for, the calls looked at, the parses tried for one value, and
# the length of a line the "For ..." and "Input:" patterns are matched against.
_MAX_STATED_CHARS = 2_000
_MAX_NAMES = 32
_MAX_CALLS = 1_000
_MAX_VALUE_TRIES = 16
_MAX_LINE = 1_000
_TRUTH_WORDS = {"true": True, "false": False}
STATED_FORMS = ("call", "for", "input_output")


@dataclass(frozen=True)
class StatedExample:
    """An example the prompt states in prose: the literal call to run and the value it should give."""

    source: str  # a literal call of a function the prompt defines, rebuilt by ast.unparse
    expected: Any
    form: str  # one of STATED_FORMS
    separator: str = ""  # for the call form: ==, ➞, ->, returns, ...


def stated_examples(text: str) -> list[StatedExample]:
    """The examples ``text`` states in prose for the functions it defines (``def name(``).

    Always held to the untrusted rule, whoever the caller: the call is rebuilt from its parsed
    literal arguments and must name a function the prompt defines, and the expected value must be
    a literal (``true``/``false`` read as booleans). A value given as a sum (``1 + 9 = 10``) counts
    its last term. A prompt that defines its function by equations (``tri(n) = 1 + n / 2``) uses
    ``=`` for those, so a plain ``=`` is not read as an example's for that function."""
    if len(text) > MAX_PROMPT_CHARS:
        return []
    params = _prompt_signatures(text)
    if not params:
        return []
    found: list[StatedExample] = []
    found += _call_examples(text, params)
    found += _for_examples(text, params)
    found += _input_output_examples(text, params)
    seen: set[tuple[str, str]] = set()
    unique = []
    for ex in found:
        key = (ex.source, repr(ex.expected))
        if key not in seen:
            seen.add(key)
            unique.append(ex)
    return unique


def stated_steps(text: str) -> list[Step]:
    """`stated_examples` as tests; the checker compares each call's value with the stated one."""
    return [
        Step(
            "test",
            ex.source,
            _short(ex.source) + " == " + _short(repr(ex.expected), 40),
            "doctest",
            checks=(Check("eval", ex.source, "compare", "Eq", ex.expected),),
        )
        for ex in stated_examples(text)
    ]


def _prompt_signatures(text: str) -> dict[str, list[str] | None]:
    """Each function the prompt defines, with its parameter names (None where they cannot be read),
    the last defined last."""
    last: dict[str, int] = {}
    for m in _DEF.finditer(text):
        last.pop(m.group("name"), None)
        last[m.group("name")] = m.end() - 1
    kept = list(last.items())[-_MAX_NAMES:]
    return {name: _param_names(text, paren) for name, paren in kept}


def _param_names(text: str, paren: int) -> list[str] | None:
    end = _bracket_end(text, paren)
    if end is None:
        return None
    try:
        tree = ast.parse(f"def _{text[paren:end]}: pass")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    if fn.args.vararg or fn.args.kwonlyargs or fn.args.defaults:
        return None  # only plain positional parameters map a stated input unambiguously
    return [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]


def _bracket_end(text: str, start: int, *, stop_at_newline: bool = False) -> int | None:
    """The index after the bracket that closes the one at ``start`` (or, with `stop_at_newline`,
    the end of the line once every bracket is closed), skipping quoted strings. None when a string
    runs past its line, brackets do not match, or it goes on for more than _MAX_STATED_CHARS."""
    depth = 0
    i = start
    limit = min(len(text), start + _MAX_STATED_CHARS)
    while i < limit:
        c = text[i]
        if c in "'\"":
            j = i + 1
            while j < limit and text[j] != c:
                if text[j] == "\n":
                    return None
                j += 2 if text[j] == "\\" else 1
            if j >= limit:
                return None
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:
                return None
            if depth == 0 and not stop_at_newline:
                return i + 1
        elif c == "\n" and stop_at_newline and depth == 0:
            return i
        i += 1
    if stop_at_newline and depth == 0 and i == len(text):
        return i
    return None


def _top_level(text: str) -> list[int]:
    """Positions in ``text`` outside brackets and strings where a value could end."""
    cuts = []
    depth = 0
    quote = ""
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            if depth == 0:
                cuts.append(i)
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and c in " \t#=,;.":
            cuts.append(i)
        i += 1
    return cuts


def _stated_value(text: str) -> tuple[bool, Any]:
    """The literal a stated value starts with, where what follows it is nothing, a comment, a
    parenthesis of prose or a full stop; after a sum written out (``1 + 9 = 10``), its last term."""
    text = text.strip()
    if not text or len(text) > _MAX_STATED_CHARS:
        return False, None
    ok, value = _literal_text(text)
    if ok:
        return ok, value
    cuts = _top_level(text)
    # a lone "=", not part of ==, !=, <=, >= or =>
    equals = [i for i in cuts if text[i] == "=" and text[i - 1 : i] not in "=!<>" and text[i + 1 : i + 2] not in "=>"]
    if equals and equals[-1] > 0:
        return _literal_text(text[equals[-1] + 1 :])
    tries = 0
    for i in reversed(cuts):
        rest = text[i:].strip()
        ends = not rest or rest[0] in "#(" or rest in (".", ",", ";") or (rest[0] in ".,;" and rest[1:2].isspace())
        if i > 0 and ends:
            ok, value = _literal_text(text[:i])
            if ok:
                return ok, value
            tries += 1
            if tries >= _MAX_VALUE_TRIES:
                break
    return False, None


def _literal_text(text: str) -> tuple[bool, Any]:
    text = text.strip()
    if text.lower() in _TRUTH_WORDS:
        return True, _TRUTH_WORDS[text.lower()]
    if text.endswith(".") and not text.endswith(".."):
        ok, value = _literal_text(text[:-1])
        if ok:
            return ok, value
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False, None
    if text.startswith("(") and not isinstance(node, ast.Tuple):
        return False, None  # ("Venus") in prose may mean a tuple of one: ambiguous, left out
    return _literal(node)


def _literal_call_of(source: str, names: set[str]) -> str | None:
    """``source`` rebuilt from its parse when it is one call of one of ``names`` with literal
    arguments (the untrusted rule of `doctest_steps`), else None."""
    if not _literal_call(source):
        return None
    node = ast.parse(source, mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    if node.func.id not in names:
        return None
    return ast.unparse(node)


def _call_examples(text: str, params: dict[str, list[str] | None]) -> list[StatedExample]:
    names = set(params)
    found = []
    by_equation = _defined_by_equations(text, names)
    pattern = re.compile(r"\b(?P<name>" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\(")
    looked = 0
    for m in pattern.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        lead = text[line_start : m.start()]
        if len(lead) > 80 or _STATED_LEAD.fullmatch(lead) is None:  # also skips ">>> f(x)": a doctest's
            continue
        looked += 1
        if looked > _MAX_CALLS:
            break
        end = _bracket_end(text, m.end() - 1)
        if end is None:
            continue
        source = _literal_call_of(text[m.start() : end], names)
        sep = _STATED_SEP.match(text, end)
        if source is None or sep is None or "\n" in text[end : sep.end()]:
            continue
        if sep.group("sep") == "=" and m.group("name") in by_equation:
            continue
        value_end = _bracket_end(text, sep.end(), stop_at_newline=True)
        if value_end is None:
            line_end = text.find("\n", sep.end())
            value_end = len(text) if line_end < 0 else line_end
        ok, expected = _stated_value(text[sep.end() : value_end])
        if ok:
            found.append(StatedExample(source, expected, "call", " ".join(sep.group("sep").split())))
    return found


def _defined_by_equations(text: str, names: set[str]) -> set[str]:
    """Functions the prompt writes equations for, ``f(n) = ...`` with a name for an argument."""
    out = set()
    for name in names:
        for m in re.finditer(rf"\b{re.escape(name)}\(([^()\n]*)\)[ \t]*=(?!=)", text):
            if not _literal_call(f"{name}({m.group(1)})"):
                out.add(name)
    return out


def _named_call(args: str, params: dict[str, list[str] | None]) -> str | None:
    """A literal call of the prompt's last function from arguments written ``a = 1, b = [2]``
    (names matching its parameters, or as many as it has, in order) or one literal value."""
    name, names = next(reversed(params.items()))
    if names is None or len(args) > _MAX_STATED_CHARS:
        return None
    try:
        node = ast.parse(f"_({args})", mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(node, ast.Call):
        return None
    if node.args and not node.keywords:
        if len(names) != len(node.args):
            return None
        values = list(node.args)
    elif node.keywords and not node.args:
        given = [k.arg for k in node.keywords]
        if None in given or len(given) != len(names):
            return None
        if set(given) == set(names):
            values = [next(k.value for k in node.keywords if k.arg == n) for n in names]
        else:
            values = [k.value for k in node.keywords]  # stated in order under other names
    else:
        return None
    call = ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=values, keywords=[])
    return _literal_call_of(ast.unparse(call), {name})


def _for_examples(text: str, params: dict[str, list[str] | None]) -> list[StatedExample]:
    found = []
    for line in text.splitlines():
        lead = _FOR_LEAD.match(line) if len(line) <= _MAX_LINE else None
        then = _FOR_OUTPUT.search(line, lead.end()) if lead is not None else None
        if lead is None or then is None:
            continue
        args = line[lead.end() : then.start()].rstrip(" \t,")
        source = None
        # "For N = 1000, the sum of digits will be 1 the output ...": the arguments end at a comma
        for cut in [len(args), *reversed([i for i in _top_level(args) if args[i] == ","])]:
            source = _named_call(args[:cut], params)
            if source is not None:
                break
        ok, expected = _stated_value(line[then.end() :])
        if source is not None and ok:
            found.append(StatedExample(source, expected, "for"))
    return found


def _input_output_examples(text: str, params: dict[str, list[str] | None]) -> list[StatedExample]:
    """Examples stated as ``Input: arr = [1, 2], k = 3`` (or the arguments one per line below it,
    ``grid : [[0, 1]]``) followed by ``Output: [2]``."""
    lines = [line if len(line) <= _MAX_LINE else "" for line in text.splitlines()]
    found = []
    for i, line in enumerate(lines):
        m = _INPUT.match(line)
        if m is None:
            continue
        parts = [m.group("args")] if m.group("args") else []
        j = i + 1
        while j < len(lines) and j <= i + 10 and _OUTPUT.match(lines[j]) is None:
            named = _NAMED_LINE.match(lines[j])
            if m.group("args") or named is None:
                break
            parts.append(f"{named.group('name')} = {named.group('value')}")
            j += 1
        out = _OUTPUT.match(lines[j]) if j < len(lines) else None
        if out is None or not parts:
            continue
        source = _named_call(", ".join(parts), params)
        ok, expected = _stated_value(out.group("want"))
        if source is not None and ok:
            found.append(StatedExample(source, expected, "input_output"))
    return found


def caller_test_steps(tests: str | list[str] | tuple[str, ...], answer: Iterable[str] = ()) -> list[Step]:
    """Split the caller's test code into setup and tests (see the module docstring). ``answer``:
    the program's top-level names, which tell a value the answer decides from one the box could
    forge (`verifiers.outside_judge`).

    Raises SyntaxError when the tests do not parse."""
    if not isinstance(tests, str):
        bodies = []
        for t in tests:
            try:
                bodies.append(ast.parse(t).body)
            except (SyntaxError, ValueError):
                bodies.append([])
        judge = _judge_for([node for body in bodies for node in body], answer)
        steps = []
        for i, (t, body) in enumerate(zip(tests, bodies, strict=True)):
            checks = _assert_checks(body[0], judge) if len(body) == 1 and isinstance(body[0], ast.Assert) else ()
            steps.append(Step("test", t, f"tests[{i}]", "tests", checks=checks))
        return steps
    tree = ast.parse(tests)
    judge = _judge_for(tree.body, answer)
    steps = []
    for node in tree.body:
        source = ast.unparse(node)
        if isinstance(node, ast.Assert):
            steps.append(Step("test", source, _short(source), "tests", checks=_assert_checks(node, judge)))
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test") and _takes_no_args(node):
            steps.append(Step("setup", source, f"def {node.name}", "tests"))
            straight = _straight_body(node)
            if straight is None:
                steps.append(Step("test", f"{node.name}()", f"{node.name}()", "tests"))
            else:
                checks = tuple(c for stmt in straight for c in _statement_checks(stmt, judge))
                steps.append(Step("test", f"{node.name}()", f"{node.name}()", "tests", checks=checks, own_ns=True))
        else:
            steps.append(Step("setup", source, _short(source), "tests"))
    if not any(s.is_test for s in steps):
        return [Step("test", tests, "tests script", "tests")]
    return steps


_STRAIGHT = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.Assert, ast.Import, ast.ImportFrom, ast.Pass)


def _straight_body(fn: ast.FunctionDef) -> list[ast.stmt] | None:
    """The body of a test function that can run as its statements one by one: no branches, loops,
    returns, or names declared global/nonlocal (which would change what the statements mean)."""
    if fn.decorator_list or fn.args.defaults or not all(isinstance(s, _STRAIGHT) for s in fn.body):
        return None
    for stmt in fn.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Yield | ast.YieldFrom | ast.Await | ast.NamedExpr | ast.Lambda):
                return None  # a lambda or walrus would see the namespace differently from a function's
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return body or None


def _statement_checks(stmt: ast.stmt, judge: Judge) -> tuple[Check, ...]:
    if isinstance(stmt, ast.Assert):
        return _assert_checks(stmt, judge)
    return (Check("exec", ast.unparse(stmt)),)


def _judge_for(tests: list[ast.stmt], answer: Iterable[str]) -> Judge:
    """The judge of these tests: every name their code binds is theirs, not the answer's, and a
    builtin they rebind means what they made it mean (so it is evaluated in the box)."""
    bound = {
        n.id if isinstance(n, ast.Name) else n.name
        for stmt in tests
        for n in ast.walk(stmt)
        if (isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load))
        or isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    for stmt in tests:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Import | ast.ImportFrom):
                bound.update(a.asname or a.name.split(".")[0] for a in n.names if a.name != "*")
    # `import math` is how a test reaches math.isclose: binding math to math changes nothing
    shadowed = {name for name in bound if name != "math"}
    return Judge(set(answer) - bound, shadowed)


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _assert_checks(node: ast.Assert, judge: Judge | None = None) -> tuple[Check, ...]:
    """How the checker decides ``assert <test>`` without trusting the process that runs it: each
    link of an ``and``-joined test on its own, as separate asserts would be."""
    judge = judge or Judge()
    return tuple(_part_check(part, judge) for part in split_and(node.test))


def _part_check(test: ast.expr, judge: Judge) -> Check:
    """One link: the simple shapes (one value against a literal, a value's truth) as `judge`
    decides them; anything holding more (``abs(f(x) - y) < tol``, ``isclose``, a chain) computed
    here from its leaves' values (`verifiers.outside_judge`)."""
    forgeable = judge.forgeable(test)
    if judge.is_leaf(test):  # one value (identity between two values too: only the box can say)
        return Check("eval", ast.unparse(test), "truthy", forgeable=forgeable)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and judge.is_leaf(test.operand):
        return Check("eval", ast.unparse(test.operand), "falsy", forgeable=forgeable)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, left, right = test.ops[0], test.left, test.comparators[0]
        name = type(op).__name__
        left_lit, left_val = _literal(left)
        right_lit, right_val = _literal(right)
        if isinstance(op, ast.Is | ast.IsNot):
            # one side is None, True or False, or the comparison would be a leaf
            value, const = (left, right_val) if right_lit else (right, left_val)
            if judge.is_leaf(value):
                return Check("eval", ast.unparse(value), "compare", name, const, forgeable=forgeable)
        elif right_lit and not left_lit and judge.is_leaf(left):
            return Check("eval", ast.unparse(left), "compare", name, right_val, forgeable=forgeable)
        elif left_lit and not right_lit and judge.is_leaf(right):
            return Check("eval", ast.unparse(right), "compare", name, left_val, literal_left=True, forgeable=forgeable)
        elif judge.is_leaf(left) and judge.is_leaf(right):
            pair = f"({ast.unparse(left)}, {ast.unparse(right)})"
            return Check("eval", pair, "compare", name, pair=True, forgeable=forgeable)
    return Check("eval", ast.unparse(test), "outside", forgeable=forgeable, shadowed=judge.shadowed)


# ----------------------------------------------------------------------------------------------
# the checker's side: plain values and verdicts


class _BadReply(ValueError):
    pass


# Rebuilding a set or dict hashes every item while the GIL is held: values crafted to collide
# (ints equal modulo 2**61 - 1) make that quadratic and stall every thread, the event loop included;
# with the reply size capped, 256 per container bounds the whole decode to a few million comparisons.
MAX_HASHED_ITEMS = outside_judge.MAX_HASHED_ITEMS
MAX_PROCS = 8  # processes one code_tests run may have: with memory_mb each, its memory bound


def decode_value(tree: Any, depth: int = 0) -> Any:
    """Rebuild a tagged value sent by the worker; anything malformed raises _BadReply."""
    if depth > 100 or not isinstance(tree, dict):
        raise _BadReply("malformed value")
    tag, v = tree.get("t"), tree.get("v")
    try:
        if tag == "n":
            return None
        if tag == "B" and isinstance(v, bool):
            return v
        if tag == "i" and isinstance(v, str) and len(v) <= 5000:
            return int(v)
        if tag == "f" and isinstance(v, str) and len(v) <= 64:
            return float(v)
        if tag == "x" and isinstance(v, list) and len(v) == 2 and all(isinstance(p, str) and len(p) <= 64 for p in v):
            return complex(float(v[0]), float(v[1]))
        if tag == "s" and isinstance(v, str):
            return v
        if tag == "b" and isinstance(v, str):
            return bytes.fromhex(v)
        if tag in ("l", "t", "S", "F") and isinstance(v, list):
            if tag in ("S", "F") and len(v) > MAX_HASHED_ITEMS:
                raise _BadReply("set too large")
            items = [decode_value(x, depth + 1) for x in v]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d" and isinstance(v, list):
            if len(v) > MAX_HASHED_ITEMS:
                raise _BadReply("dict too large")
            out = {}
            for pair in v:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise _BadReply("malformed dict")
                out[decode_value(pair[0], depth + 1)] = decode_value(pair[1], depth + 1)
            return out
        if tag == "o" and isinstance(tree.get("type"), str) and isinstance(tree.get("repr"), str):
            return Opaque(tree["type"][:100], tree["repr"][:1000])
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise _BadReply("malformed value") from exc
    raise _BadReply("malformed value")


@dataclass(frozen=True)
class Reply:
    ok: bool
    value: Any = None
    truth: bool | None = None
    printed: str = ""
    exc: str = ""  # the exception's type name, as the worker said (log only)
    msg: str = ""  # its message (log only)


def _failure_kind(reply: Reply) -> str:
    if reply.exc == "AssertionError":
        return "assertion"
    if reply.exc == "MemoryError":
        return "memory"
    return "exception"


def judge(check: Check, reply: Reply) -> str | None:
    """None when the reply satisfies the check, else the failure's kind."""
    if not reply.ok:
        return _failure_kind(reply)
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
            fn = next((f for k, f in _CMP.items() if k.__name__ == check.cmp), None)
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
        return _failure_kind(reply)
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


# ----------------------------------------------------------------------------------------------
# running: the checker talks to the worker


@dataclass(frozen=True)
class UnitResult:
    label: str
    group: str
    passed: bool
    kind: str | None = None  # why it failed, one of KINDS
    in_process: bool = False
    detail: str = ""  # for the server log only
    forgeable: bool = False  # code that takes over the box could have passed it


@dataclass(frozen=True)
class HarnessRun:
    """What one sandboxed run of the harness found."""

    loaded: bool  # the program ran to the end of its top level
    load_kind: str | None  # why not, one of KINDS
    units: list[UnitResult]
    duration_s: float
    forged: bool = False  # the worker answered out of protocol
    log: str = ""  # the worker's stderr and the load error, for the server log only


class _Stop(Exception):
    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(kind)
        self.kind, self.detail = kind, detail


class _Session:
    """Request and reply, one at a time; a reply must echo the request's random id."""

    def __init__(self, box: Any, deadline: float, unit_timeout_s: float) -> None:
        self.box, self.deadline, self.unit_timeout_s = box, deadline, unit_timeout_s

    async def ask(self, request: dict[str, Any]) -> Reply:
        rid = secrets.token_hex(12)
        line = json.dumps({**request, "id": rid}) + "\n"
        wait = min(self.unit_timeout_s, self.deadline - time.monotonic())
        if wait <= 0:
            raise _Stop("timeout")
        try:
            self.box.stdin.write(line.encode())
            await asyncio.wait_for(self.box.stdin.drain(), wait)
            raw = await asyncio.wait_for(self.box.stdout.readline(), wait)
        except TimeoutError:
            raise _Stop("timeout") from None
        except (BrokenPipeError, ConnectionResetError):
            raise _Stop("crashed") from None
        except ValueError:  # a line beyond the stream's limit
            raise _Stop("forged", "reply too long") from None
        if not raw:
            raise _Stop("crashed", "the worker ended")
        if not raw.endswith(b"\n"):
            raise _Stop("crashed", "the worker ended mid-reply")
        return await asyncio.to_thread(_parse_reply, raw, rid)


def _parse_reply(raw: bytes, rid: str) -> Reply:
    try:
        msg = json.loads(raw)
        if not isinstance(msg, dict) or msg.get("id") != rid or not isinstance(msg.get("ok"), bool):
            raise _BadReply("not a reply to this request")
        printed = msg.get("printed", "")
        exc, text = msg.get("exc", ""), msg.get("msg", "")
        truth = msg.get("truth")
        if not isinstance(printed, str) or not isinstance(exc, str) or not isinstance(text, str):
            raise _BadReply("malformed reply")
        if truth is not None and not isinstance(truth, bool):
            raise _BadReply("malformed reply")
        value = decode_value(msg["value"]) if msg["ok"] and "value" in msg else None
        return Reply(msg["ok"], value, truth, printed, exc[:100], text[:300])
    except (ValueError, RecursionError, KeyError) as exc:  # _BadReply and json errors are ValueErrors
        raise _Stop("forged", f"reply out of protocol: {exc}") from None


async def run_tests(
    program: str,
    steps: list[Step],
    *,
    timeout_s: float = 10.0,
    unit_timeout_s: float = 3.0,
    memory_mb: int = 512,
) -> HarnessRun:
    """Load ``program`` as module ``solution`` in a sandboxed worker, then run ``steps`` there one
    request at a time, judging each reply here. Tests never answered in protocol count as failed."""
    start = time.monotonic()
    deadline = start + timeout_s
    # memory is capped per process, so the process count bounds what one run can hold
    limits = Limits(timeout_s=timeout_s + 1.0, memory_mb=memory_mb, max_procs=MAX_PROCS)
    units: list[UnitResult] = []
    tests = [s for s in steps if s.is_test]
    loaded, load_kind, forged, notes = False, None, False, []
    async with start_python(
        _worker_source(), limits=limits, files={"solution.py": program}, stream_limit=_MAX_REPLY_BYTES
    ) as box:
        session = _Session(box, deadline, unit_timeout_s)
        stop: _Stop | None = None
        try:
            load = await session.ask({"op": "load"})
            loaded = load.ok
            if not load.ok:
                load_kind = {
                    "SyntaxError": "syntax_error",
                    "ModuleNotFoundError": "import_error",
                    "ImportError": "import_error",
                    "MemoryError": "memory",
                }.get(load.exc, "load_error")
                notes.append(f"load: {load.exc}: {load.msg}")
        except _Stop as exc:
            stop = exc
            load_kind = "forged" if exc.kind == "forged" else exc.kind
        if loaded:
            for step in steps:
                if stop is not None:
                    break
                try:
                    units.extend(await _run_step(session, step))
                except _Stop as exc:
                    stop = exc
                    if step.is_test:
                        units.append(
                            UnitResult(
                                step.label, step.group, False, exc.kind, step.in_process, exc.detail, step.forgeable
                            )
                        )
        if stop is not None:
            forged = stop.kind == "forged"
            notes.append(f"stopped: {stop.kind} {stop.detail}".strip())
            box.kill()
        elif box.stdin is not None:
            box.stdin.close()
        if stop is None or stop.kind != "crashed":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(box.proc.wait(), 1.0)
            box.kill()
        err, _ = await box.stderr()
    answered = len(units)
    kind_left = "forged" if forged else "not_run"
    for step in tests[answered:]:
        units.append(UnitResult(step.label, step.group, False, kind_left, step.in_process, forgeable=step.forgeable))
    stderr = err.decode("utf-8", "replace")[-4000:]
    return HarnessRun(loaded, load_kind, units, time.monotonic() - start, forged, "\n".join([*notes, stderr]).strip())


async def _run_step(session: _Session, step: Step) -> list[UnitResult]:
    base = None
    ns = step.group
    if step.own_ns:
        ns, base = f"{step.group}:{step.label}:{secrets.token_hex(4)}", step.group
    if step.kind == "setup":
        await session.ask({"op": "exec", "source": step.source, "ns": ns, "base": base})
        return []
    if step.kind == "doctest":
        op = "eval" if step.expr else "exec"
        reply = await session.ask({"op": op, "source": step.source, "ns": ns, "base": base})
        kind = await asyncio.to_thread(judge_doctest, step, reply)  # literal_eval of a long want
        detail = (
            "" if kind is None else f"expected {step.want[:120]!r}, got {reply.printed[:120]!r} {reply.exc} {reply.msg}"
        )
        detail = detail[:400]
        return [UnitResult(step.label, step.group, kind is None, kind, False, detail, step.forgeable)]
    for check in step.plan():
        if check.judge == "outside":
            kind, outcome = await _judge_outside(session, check, ns, base)
        else:
            reply = await session.ask({"op": check.op, "source": check.source, "ns": ns, "base": base})
            kind = judge(check, reply)
            outcome = f"{reply.exc}: {reply.msg}" if not reply.ok else f"-> {reply.value!r:.200}"
        if kind is not None:
            detail = f"{check.source[:120]} {outcome}"
            return [UnitResult(step.label, step.group, False, kind, step.in_process, detail, step.forgeable)]
    return [UnitResult(step.label, step.group, True, None, step.in_process, forgeable=step.forgeable)]


async def _judge_outside(session: _Session, check: Check, ns: str, base: str | None) -> tuple[str | None, str]:
    """Compute ``check.source`` here, asking the box only for its leaves' values; the failure's
    kind (None when it holds) and, for the log, what the box said last."""
    said = [""]

    async def ask(source: str) -> Any:
        reply = await session.ask({"op": "eval", "source": source, "ns": ns, "base": base})
        said[0] = f"{source[:60]} -> " + (f"{reply.exc}: {reply.msg}" if not reply.ok else f"{reply.value!r:.100}")
        if not reply.ok:
            raise Failed(_failure_kind(reply))
        if isinstance(reply.value, Opaque):
            reply.value.truth = reply.truth
        return reply.value

    judge_here = Judge(shadowed=check.shadowed)
    try:
        value = await judge_here.value(ast.parse(check.source, mode="eval").body, ask)
        # a doctest states the bool it prints; an assert asks for truth
        held = value is check.expected if check.cmp == "exact" else truth_of(value)
    except Failed as exc:
        return exc.kind, said[0]
    return (None if held else ("mismatch" if check.cmp == "exact" else "assertion")), said[0]


# ----------------------------------------------------------------------------------------------
# the verifier


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
        answer = _top_level_names(program)
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
        steps += [s for s in examples if _called_name(s.source) not in built.prompt_only]
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


def _short(source: str, n: int = 80) -> str:
    one = " ".join(source.split())
    return one if len(one) <= n else one[: n - 3] + "..."


def _takes_no_args(fn: ast.FunctionDef) -> bool:
    a = fn.args
    return not (a.posonlyargs or a.args or a.vararg or a.kwonlyargs or a.kwarg) or (
        len(a.defaults) == len(a.posonlyargs) + len(a.args) and not a.kwonlyargs
    )


@functools.cache
def _worker_source() -> str:
    # annotations stay strings in the box, where typing is not imported
    return (
        "from __future__ import annotations\n" + textwrap.dedent(inspect.getsource(_worker_main)) + "\n_worker_main()\n"
    )


def _worker_main() -> None:  # pragma: no cover - runs only inside the sandbox
    """Load solution.py as module ``solution``, then answer requests from stdin, one JSON line each.

    Shipped to the sandbox as source text; self-contained. It decides nothing: it reports whether
    the code raised, what it printed and the value, as plain data (see the module docstring).
    """
    import contextlib
    import io
    import json
    import os
    import sys
    import types

    max_printed, max_nodes, max_reply = 16384, 50000, 900_000
    out_fd = os.dup(1)
    requests = sys.stdin.buffer

    def send(reply: dict[str, Any]) -> None:
        try:
            data = (json.dumps(reply) + "\n").encode()
        except (TypeError, ValueError):
            data = (json.dumps({"id": reply["id"], "ok": False, "exc": "EncodingError", "msg": ""}) + "\n").encode()
        if len(data) > max_reply:  # the checker refuses longer lines as out of protocol
            reply = {**reply, "printed": reply.get("printed", "")[:1000]}
            if "value" in reply:
                reply["value"] = {"t": "o", "type": "too_big", "repr": "<too big>"}
            data = (json.dumps(reply) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(out_fd, view) :]

    def encode(value: Any, budget: list[int], depth: int = 0) -> dict[str, Any]:
        budget[0] -= 1
        t = type(value)
        if budget[0] < 0 or depth > 90:
            return {"t": "o", "type": "too_big", "repr": "<too big>"}
        if value is None:
            return {"t": "n"}
        if t is bool:
            return {"t": "B", "v": value}
        if t is int:
            try:
                return {"t": "i", "v": str(value)}
            except ValueError:
                return {"t": "o", "type": "int", "repr": "<int too long>"}
        if t is float:
            return {"t": "f", "v": repr(value)}
        if t is complex:
            return {"t": "x", "v": [repr(value.real), repr(value.imag)]}
        if t is str:
            return {"t": "s", "v": value}
        if t is bytes:
            return {"t": "b", "v": value.hex()}
        tags: dict[Any, str] = {list: "l", tuple: "t", set: "S", frozenset: "F"}
        if t in tags:
            return {"t": tags[t], "v": [encode(x, budget, depth + 1) for x in value]}
        if t is dict:
            pairs = [[encode(k, budget, depth + 1), encode(v, budget, depth + 1)] for k, v in value.items()]
            return {"t": "d", "v": pairs}
        try:
            text = repr(value)[:1000]
        except BaseException:  # noqa: BLE001 - a repr that fails is still a value to describe
            text = "<unrepresentable>"
        return {"t": "o", "type": t.__name__[:100], "repr": text}

    module = types.ModuleType("solution")
    module.__file__ = os.path.abspath("solution.py")
    sys.modules["solution"] = module
    spaces: dict[str, dict[str, Any]] = {}
    while True:
        line = requests.readline()
        if not line:
            return
        request = json.loads(line)
        rid = request["id"]
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                if request["op"] == "load":
                    with open("solution.py", encoding="utf-8") as fh:
                        code = compile(fh.read(), module.__file__, "exec")
                    exec(code, module.__dict__)  # noqa: S102 - that is the job
                    value = None
                else:
                    ns = spaces.get(request["ns"])
                    if ns is None:
                        base = spaces.get(request.get("base") or "")
                        ns = spaces[request["ns"]] = dict(base if base is not None else module.__dict__)
                        if base is None:
                            ns["__name__"] = "__test__"
                    mode = "eval" if request["op"] == "eval" else "exec"
                    value = eval(compile(request["source"], "<test>", mode), ns)  # noqa: S307
            reply = {"id": rid, "ok": True, "printed": printed.getvalue()[:max_printed]}
            reply["value"] = encode(value, [max_nodes])
            try:
                reply["truth"] = bool(value)
            except BaseException:  # noqa: BLE001
                reply["truth"] = None
        except BaseException as exc:  # noqa: BLE001 - a test's failure, whatever it is, is data
            try:
                text = str(exc)[:300]
            except BaseException:  # noqa: BLE001
                text = ""
            reply = {
                "id": rid,
                "ok": False,
                "printed": printed.getvalue()[:max_printed],
                "exc": type(exc).__name__[:100],
                "msg": text,
            }
        send(reply)
