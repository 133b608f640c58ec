"""What the verifier runs: the caller's tests and the prompt's ``>>>`` examples, as steps and checks.

Tests come only from what a real caller sends:

- ``request.metadata["tests"]``: Python test code (a string, or a list of strings, one test each).
  Each top-level ``assert`` is one test, each ``def test_*()`` is one test, everything else is
  setup run in order; a script with neither is one test that passes when it runs without error.
  The answer's code is importable as ``solution`` too, so ``from solution import f`` works.
- with ``doctest = true`` (the default), the ``>>>`` examples in the request's last user message
  (or prompt), such as a HumanEval docstring's. An example with no expected output is setup.
- with ``stated = true`` (the default), examples the prompt states in prose
  (`verifiers.code_tests.stated`).

Never a grader's reference tests: see "Eval hygiene" in docs/design.md.

A test becomes a `Step` holding `Check` s: what the worker in the box is asked to evaluate, and how
the checker outside it decides (`verifiers.code_tests.judge`). The expectation never enters the
sandbox:

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
``all(...)``), are counted in ``details["forgeable"]``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from verifiers.extract import compiles, defined_names
from verifiers.outside_judge import Judge, split_and

_PS1 = re.compile(r"^(?P<indent>[ \t]*)>>>(?: (?P<src>.*)|$)")
_PS2 = re.compile(r"^[ \t]*\.\.\.(?: (?P<src>.*)|$)")
_END_OF_WANT = ('"""', "'''", "```")


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
        if not trusted and (not want or not literal_call(src)):
            continue
        label = ">>> " + short(src)
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


def literal_call(src: str) -> bool:
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


def top_level_names(program: str) -> frozenset[str]:
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


def called_name(src: str) -> str | None:
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
            steps.append(Step("test", source, short(source), "tests", checks=_assert_checks(node, judge)))
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test") and _takes_no_args(node):
            steps.append(Step("setup", source, f"def {node.name}", "tests"))
            straight = _straight_body(node)
            if straight is None:
                steps.append(Step("test", f"{node.name}()", f"{node.name}()", "tests"))
            else:
                checks = tuple(c for stmt in straight for c in _statement_checks(stmt, judge))
                steps.append(Step("test", f"{node.name}()", f"{node.name}()", "tests", checks=checks, own_ns=True))
        else:
            steps.append(Step("setup", source, short(source), "tests"))
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


def literal(node: ast.expr) -> tuple[bool, Any]:
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
        left_lit, left_val = literal(left)
        right_lit, right_val = literal(right)
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


def short(source: str, n: int = 80) -> str:
    one = " ".join(source.split())
    return one if len(one) <= n else one[: n - 3] + "..."


def _takes_no_args(fn: ast.FunctionDef) -> bool:
    a = fn.args
    return not (a.posonlyargs or a.args or a.vararg or a.kwonlyargs or a.kwarg) or (
        len(a.defaults) == len(a.posonlyargs) + len(a.args) and not a.kwonlyargs
    )
