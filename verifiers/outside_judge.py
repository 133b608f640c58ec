"""Judge a test here, outside the box, when its expectation is written inside the expression.

`code_tests` never sends an expectation into the sandbox: for ``assert f(1) == 2`` the box
evaluates ``f(1)`` and the checker compares the plain value with 2. Tests that hold the expected
value deeper in the expression (``assert abs(f(1.33) - 0.33) < 1e-6``, ``math.isclose(f(2),
1.41)``, ``0 < f(x) < 1``, ``len(f(x)) == 3``) would otherwise be sent whole, and an answer that
takes over the box's reply channel reads ``0.33`` in the source and answers "true". So such a test
is taken apart here:

- What this module can compute over plain values is computed here: literals, tuple/list/set
  displays, arithmetic, ``not``/``and``/``or`` (short-circuit, as Python does), comparisons
  (chained ones link by link), and a few functions with known meanings: ``abs``, ``round``,
  ``len``, ``min``, ``max``, ``sum``, ``sorted``, ``list``, ``tuple``, ``set``, ``frozenset``,
  ``float``, ``int``, ``isinstance`` (against builtin types), ``math.isclose`` / ``isclose``,
  ``math.fabs``, ``math.sqrt``. Here they mean what the builtins mean, whatever the answer
  rebound in its own namespace.
- Everything else is a *leaf*: its source goes to the box, which reports its value as plain data,
  and leaves are asked for one at a time, in Python's order, only when Python would evaluate them.
- Each link of an ``and``-joined assert is its own check, as if written as separate asserts.

The box still reports every leaf's value, so a verdict is only as safe as its leaves. A verdict is
*sealed* (an answer that takes over the box can make it pass only as a different solution could)
when every leaf is an answer value (a call of a function the answer defines, or an attribute or
subscript of one) or a name the test's setup bound, every comparison has a side computed here from
literals alone, and no name's truth is the verdict. Everything else is counted ``forgeable`` in
the score's details: ``assert f(1) == ref(1)`` (the box computes the reference too),
``assert check(f(1), 2)`` (the expectation is an argument of a function the box runs),
``assert all(f(x) == y for ...)``, ``assert ok``. Values the caller's setup computes are taken as
the box reports them: setup that stores an expectation in a name the assert then reads is beyond
what this count can see.

Work here is bounded: values come from replies of at most 1 MiB, results of ``*`` and ``**`` are
capped, every integer computed here (an operator's or a known function's result) has at most
`MAX_INT_BITS` bits, and sets are built from at most `MAX_HASHED_ITEMS` items. Integer arithmetic
holds the interpreter's lock for its whole length, and ``%`` and ``//`` take time quadratic in the
digits: ``int(f(1), 16)`` over a 200,000-character hex string, squared and taken modulo itself less
one, held the event loop for seconds, a 900,000-character one for minutes.
"""

from __future__ import annotations

import ast
import builtins
import math
import operator
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

MAX_HASHED_ITEMS = 256  # see code_tests.protocol: colliding hashes make larger sets quadratic to build
MAX_BUILT_ITEMS = 100_000  # a sequence ``*`` may build
MAX_POWER_BITS = 100_000  # an integer ``**`` may build
MAX_INT_BITS = 100_000  # any integer computed here: ``%`` of two such takes milliseconds

_TYPES: dict[str, type] = {
    t.__name__: t for t in (int, float, complex, str, bytes, bool, list, tuple, dict, set, frozenset)
}
_CALLS = frozenset(
    {"abs", "round", "len", "min", "max", "sum", "sorted", "list", "tuple", "set", "frozenset", "float", "int"}
)
_MATH_CALLS = frozenset({"isclose", "fabs", "sqrt"})
_MATH: dict[str, Callable[..., Any]] = {"math.fabs": math.fabs, "math.sqrt": math.sqrt}
# the keyword arguments judged here; a call with any other is a leaf
_KEYWORDS = {"sorted": frozenset({"reverse"}), "math.isclose": frozenset({"rel_tol", "abs_tol"})}
_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
# the comparisons other than equality (which is `same`), for the checker of plain asserts too
ORDER: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


# ----------------------------------------------------------------------------------------------
# plain values


class Opaque:
    """A value the worker could only describe: an object of a type that is not plain data.
    It equals nothing, so no test can pass by returning one where plain data is expected. Its
    truth is the box's word (``truth``), known only where the box reported it."""

    def __init__(self, type_name: str, text: str, truth: bool | None = None) -> None:
        self.type_name, self.text, self.truth = type_name, text, truth

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__


def same(a: object, b: object) -> bool:
    """Plain-data equality, with floats compared to a relative 1e-6 and bools kept apart from ints."""
    if isinstance(a, Opaque) or isinstance(b, Opaque):
        return False
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        try:
            return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
        except OverflowError:  # an int too large for a float: it equals no float
            return False
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - plain values; a failure means they differ
        return False


def contains_opaque(value: object, depth: int = 0) -> bool:
    if isinstance(value, Opaque):
        return True
    if depth > 100:
        return True
    if isinstance(value, list | tuple | set | frozenset):
        return any(contains_opaque(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(contains_opaque(k, depth + 1) or contains_opaque(v, depth + 1) for k, v in value.items())
    return False


# ----------------------------------------------------------------------------------------------
# what is computed here, and what the box is asked


class Failed(Exception):
    """The test fails, for this reason (a `code_tests.judge.KINDS` word)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


# asks the box for one leaf's value; raises Failed when the leaf raised there
Ask = Callable[[str], Awaitable[Any]]


class Judge:
    """The checker's view of one test expression, for a program whose own top-level names are
    ``answer`` and a test whose setup binds ``shadowed`` (a builtin the test rebinds is a leaf)."""

    def __init__(self, answer: Iterable[str] = (), shadowed: Iterable[str] = ()) -> None:
        self.answer = frozenset(answer)
        self.shadowed = frozenset(shadowed)

    # ------------------------------------------------------------------ shape

    def is_leaf(self, node: ast.expr) -> bool:
        """Whether ``node`` is evaluated in the box (its value asked for) rather than here."""
        if isinstance(node, ast.Constant):
            return False
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(isinstance(e, ast.Starred) for e in node.elts)
        if isinstance(node, ast.UnaryOp):
            return not isinstance(node.op, ast.Not | ast.USub | ast.UAdd)
        if isinstance(node, ast.BinOp):
            return type(node.op) not in _BINOPS
        if isinstance(node, ast.BoolOp):
            return False
        if isinstance(node, ast.Compare):
            return not all(self._link_here(op, a, b) for op, a, b in _links(node))
        if isinstance(node, ast.Call):
            return self._call_name(node) is None
        if isinstance(node, ast.Name):
            return not (node.id in _TYPES and node.id not in self.shadowed)
        return True

    def _link_here(self, op: ast.cmpop, left: ast.expr, right: ast.expr) -> bool:
        if isinstance(op, ast.Is | ast.IsNot):  # identity means something only against the singletons
            return _singleton(left) or _singleton(right)
        return type(op) in ORDER or isinstance(op, ast.Eq | ast.NotEq)

    def _call_name(self, node: ast.Call) -> str | None:
        """The known function ``node`` calls (``math.x`` for math's), or None."""
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return None
        name = self._function(node.func)
        if name is None or not {str(k.arg) for k in node.keywords} <= _KEYWORDS.get(name, frozenset()):
            return None
        return name

    def _function(self, func: ast.expr) -> str | None:
        if isinstance(func, ast.Name) and func.id not in self.shadowed:
            if func.id in _CALLS or func.id == "isinstance":
                return func.id
            if func.id == "isclose":
                return "math.isclose"
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "math"
            and "math" not in self.shadowed
            and func.attr in _MATH_CALLS
        ):
            return f"math.{func.attr}"
        return None

    def leaves(self, node: ast.expr) -> list[ast.expr]:
        if self.is_leaf(node):
            return [node]
        found: list[ast.expr] = []
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                found += self.leaves(child)
            elif isinstance(child, ast.keyword):
                found += self.leaves(child.value)
        return found

    def answer_value(self, leaf: ast.expr) -> bool:
        """A call of a function the answer defines, or an attribute or subscript of one: a value
        the answer decides in any case, so the box reporting it gives a forger nothing more."""
        root = _root(leaf)
        return isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id in self.answer

    def sealed_leaf(self, node: ast.expr) -> bool:
        """Whether ``node``, sent to the box whole and its value compared here with a stated one,
        is sealed: one leaf, an answer value or a name's."""
        return self.is_leaf(node) and (self.answer_value(node) or isinstance(_root(node), ast.Name))

    def forgeable(self, test: ast.expr) -> bool:
        """Whether code that takes over the box could make ``test`` pass where a different
        solution could not (see the module docstring)."""
        return not self._sealed(test, truth=True)

    def _sealed(self, node: ast.expr, *, truth: bool) -> bool:
        if self.is_leaf(node):
            if self.answer_value(node):
                return True
            return isinstance(_root(node), ast.Name) and not truth
        if isinstance(node, ast.BoolOp):
            return all(self._sealed(v, truth=truth) for v in node.values)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return self._sealed(node.operand, truth=True)
        if isinstance(node, ast.Compare):
            for _, a, b in _links(node):
                if self.leaves(a) and self.leaves(b):
                    return False  # both sides computed in the box: it can make them agree
            return all(self._sealed(s, truth=False) for s in [node.left, *node.comparators])
        if isinstance(node, ast.Call) and self._call_name(node) in ("math.isclose", "isinstance"):
            args = [*node.args, *(k.value for k in node.keywords)]
            if sum(bool(self.leaves(a)) for a in args) > 1:
                return False
            return all(self._sealed(a, truth=False) for a in args)
        if isinstance(node, ast.Call):  # a known function: its arguments, not its name
            children = [*node.args, *(k.value for k in node.keywords)]
        else:
            children = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
        # a value computed here from leaves: its truth is theirs when it is the verdict
        return all(self._sealed(c, truth=truth) for c in children)

    # ------------------------------------------------------------------ evaluation

    async def holds(self, test: ast.expr, ask: Ask) -> None:
        """Raise Failed unless ``test`` is true, asking the box for its leaves."""
        if not truth_of(await self.value(test, ask)):
            raise Failed("assertion")

    async def value(self, node: ast.expr, ask: Ask) -> Any:
        try:
            return await self._value(node, ask)
        except Failed:
            raise
        except RecursionError:
            raise Failed("too_large") from None
        except (ArithmeticError, TypeError, ValueError, AttributeError, KeyError, IndexError):
            raise Failed("exception") from None  # the expression itself raises: so would the assert

    async def _value(self, node: ast.expr, ask: Ask) -> Any:
        if self.is_leaf(node):
            return await ask(ast.unparse(node))
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return _TYPES[node.id]
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = [await self._value(e, ask) for e in node.elts]
            if isinstance(node, ast.Set):
                return _hashed(set, items)
            return tuple(items) if isinstance(node, ast.Tuple) else items
        if isinstance(node, ast.UnaryOp):
            operand = await self._value(node.operand, ask)
            if isinstance(node.op, ast.Not):
                return not truth_of(operand)
            _plain(operand)
            return -operand if isinstance(node.op, ast.USub) else +operand
        if isinstance(node, ast.BoolOp):
            result: Any = None
            for v in node.values:
                result = await self._value(v, ask)
                if truth_of(result) != isinstance(node.op, ast.And):
                    break  # short-circuit: `and` stops at a false value, `or` at a true one
            return result
        if isinstance(node, ast.BinOp):
            left = _plain(await self._value(node.left, ask))
            right = _plain(await self._value(node.right, ask))
            return _small(_binop(type(node.op), left, right))
        if isinstance(node, ast.Compare):
            left = await self._value(node.left, ask)
            for op, left_node, right_node in _links(node):
                right = await self._value(right_node, ask)
                if isinstance(op, ast.Is | ast.IsNot):
                    # one side is None, True or False (else the comparison is a leaf)
                    other = right if _singleton(left_node) else left
                    const = left_node if _singleton(left_node) else right_node
                    assert isinstance(const, ast.Constant)
                    if (other is const.value) != isinstance(op, ast.Is):
                        return False
                elif not _compare(op, left, right):
                    return False
                left = right
            return True
        assert isinstance(node, ast.Call)
        return _small(await self._call(node, ask))

    async def _call(self, node: ast.Call, ask: Ask) -> Any:
        name = self._call_name(node)
        args = [await self._value(a, ask) for a in node.args]
        kwargs = {k.arg: await self._value(k.value, ask) for k in node.keywords if k.arg is not None}
        if name == "isinstance":
            if len(args) != 2 or kwargs:
                raise TypeError("isinstance takes two arguments")
            kinds = args[1] if isinstance(args[1], tuple) else (args[1],)
            if not all(isinstance(k, type) for k in kinds):
                raise TypeError("isinstance against a value that is not a builtin type")
            if isinstance(args[0], Opaque):
                raise Failed("not_plain_data")
            return isinstance(args[0], kinds)
        for a in [*args, *kwargs.values()]:
            _plain(a)
        if name == "math.isclose":
            if len(args) != 2:
                raise TypeError("isclose takes two numbers")
            return math.isclose(*args, **kwargs)
        if name in ("set", "frozenset"):
            return _hashed(set if name == "set" else frozenset, *args)
        if name == "round" and len(args) == 2 and isinstance(args[1], int) and abs(args[1]) > 1000:
            raise Failed("too_large")
        if name == "sum" and not all(isinstance(x, int | float | complex) for x in [*args[0], *args[1:]]):
            raise TypeError("sum is judged here over numbers only")
        fn: Callable[..., Any] = _MATH.get(str(name)) or getattr(builtins, str(name))
        return fn(*args, **kwargs)


def truth_of(value: Any) -> bool:
    """A value's truth; for an object that is not plain data, the box's word, when it gave one."""
    if isinstance(value, Opaque):
        if value.truth is None:
            raise Failed("not_plain_data")
        return value.truth
    return bool(value)


def split_and(test: ast.expr) -> list[ast.expr]:
    """``a and b and c`` as its links, each its own check (nested ``and`` flattened)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [part for v in test.values for part in split_and(v)]
    return [test]


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node


def _links(node: ast.Compare) -> list[tuple[ast.cmpop, ast.expr, ast.expr]]:
    sides = [node.left, *node.comparators]
    return [(op, sides[i], sides[i + 1]) for i, op in enumerate(node.ops)]


def _plain(value: Any) -> Any:
    if contains_opaque(value):
        raise Failed("not_plain_data")
    return value


def _small(value: Any) -> Any:
    """``value``, unless it is an integer too large to compute with here (see `MAX_INT_BITS`)."""
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise Failed("too_large")
    return value


def _hashed(kind: Callable[[Any], Any], items: Any) -> Any:
    if len(items) > MAX_HASHED_ITEMS:
        raise Failed("too_large")
    return kind(items)


def _binop(op: type[ast.operator], left: Any, right: Any) -> Any:
    if op is ast.Mult:
        for seq, n in ((left, right), (right, left)):
            if (
                isinstance(seq, str | bytes | list | tuple)
                and isinstance(n, int)
                and len(seq) * max(n, 0) > MAX_BUILT_ITEMS
            ):
                raise Failed("too_large")
    if op is ast.Pow and isinstance(left, int) and isinstance(right, int) and not isinstance(right, bool):
        if right > 0 and max(left.bit_length(), 1) * right > MAX_POWER_BITS:
            raise Failed("too_large")
    if op in (ast.Mod,) and isinstance(left, str | bytes):
        raise TypeError("string formatting is not judged here")
    return _BINOPS[op](left, right)


def _singleton(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and (node.value is None or type(node.value) is bool)


def _compare(op: ast.cmpop, left: Any, right: Any) -> bool:
    _plain(left)
    _plain(right)
    if isinstance(op, ast.Eq):
        return same(left, right)
    if isinstance(op, ast.NotEq):
        return not same(left, right)
    return bool(ORDER[type(op)](left, right))
