"""What of a prompt's code goes into the program `code_tests` runs, and for whom.

An answer often leaves out what its prompt already gave it (``from typing import List``, a helper
the stub relies on), and a plain completion of a code prompt (a signature and docstring that the
model continues) is only a function body. So the program is the answer's code with the prompt's
imports and helpers in front, or, for such a completion, the prompt and the completion joined.

A prompt is client text, though, and what of it goes into the program runs in the sandbox by the
client's choice, whatever the model wrote: Python evaluates default values, decorators,
annotations, class bases and class bodies when it reaches a definition, so
``def helper(_=(<any expression>)): pass`` in a prompt runs that expression. The rule:

- A caller that may send tests (``client_code``: a key with the tests permission, or the
  operator's own eval data) can have any code run as its tests anyway; its prompt's imports,
  functions and classes go in as written, and a completion is joined to its whole prompt.
- For every other caller, only what runs nothing the client wrote at definition time is kept:
  imports (they run modules of the box's standard library, chosen by the client but not written by
  it); functions whose default values are literals (``ast.literal_eval``, without ``set()``, which
  a class body would run as its own method named ``set``); classes whose bases are
  builtin classes (``object``, ``ValueError``; not an enum, whose creation runs the class's own
  ``__init__``) and whose bodies hold only such functions, such classes, a docstring and literal
  assignments; annotations only when they are *plain* (builtin classes and ``typing``'s names,
  subscripts of them, string constants, ``|``), else dropped;
  decorators only from a short list of the standard library's that wrap and call nothing
  (``staticmethod``, ``classmethod``, ``property`` and its ``.setter``, ``functools.cache``,
  ``lru_cache``, ``cached_property``, ``total_ordering``, ``dataclasses.dataclass``,
  ``abc.abstractmethod``), with literal arguments. Nothing that rebinds a builtin's name (a
  function, a class, an import, ``import *`` but from ``typing``) or a module dunder
  (``__builtins__``, where later functions look builtins up; ``__getattr__``). No top-level
  statement is kept. A completion is joined to its prompt under the same rule, and the definition
  it continues may hold nothing of the prompt's in its body but a docstring.
- A kept function's body is the client's code too; it runs only when the answer's code calls it.
  For such callers, the prompt's examples that call a function the answer did not write itself
  are dropped: they would test the prompt, not the answer, and run the client's code to do it.

Model-written code is not the client's choice in this sense, but a model can be asked to echo
code, so it is treated as hostile all the same: it always runs, in the sandbox, when
``code_tests`` or ``execution`` is on, whoever the caller.
"""

from __future__ import annotations

import ast
import builtins
import copy
from dataclasses import dataclass

from router.generation import GenerationRequest
from verifiers.extract import compiles, defined_names, definitions, extract_code, fenced_blocks

# decorators that only wrap what they decorate, by the module that must provide them ("" for the
# builtins); the call form takes literal arguments only
_DECORATORS: dict[str, frozenset[str]] = {
    "": frozenset({"staticmethod", "classmethod", "property"}),
    "functools": frozenset({"cache", "lru_cache", "cached_property", "total_ordering"}),
    "dataclasses": frozenset({"dataclass"}),
    "abc": frozenset({"abstractmethod"}),
}
_PROPERTY_PARTS = frozenset({"setter", "getter", "deleter"})
_TYPING = frozenset({"typing", "collections.abc"})


@dataclass(frozen=True)
class Program:
    """The program to test, and the prompt's functions and classes in it that the answer did not
    write (empty for a trusted caller, whose examples may call anything)."""

    source: str
    prompt_only: frozenset[str] = frozenset()


def build_program(request: GenerationRequest, text: str) -> Program:
    """The program to test for ``request`` and the answer ``text`` (see the module docstring)."""
    trusted = bool(request.metadata.get("client_code"))
    code = extract_code(text)
    prompt = request.last_user_text()
    if not request.is_chat and not fenced_blocks(text):
        joined = Program(prompt + text) if trusted else _untrusted_join(prompt, text)
        if (
            joined is not None
            and compiles(joined.source)
            and (not compiles(code) or not defined_names(prompt) & defined_names(code))
        ):
            return joined
    if not compiles(code):
        return Program(code)
    own = defined_names(code)
    prompt_code = extract_code(prompt)
    found = definitions(prompt_code) if trusted else safe_definitions(prompt_code)
    given = [(name, src) for name, src in found if name not in own and src not in code]
    source = "\n\n".join([*(src for _, src in given), code]) if given else code
    kept = frozenset() if trusted else frozenset(name for name, _ in given if name is not None)
    return Program(source, kept)


def safe_definitions(code: str) -> list[tuple[str | None, str]]:
    """The top-level imports, functions and classes of ``code`` that run nothing of its author's
    when defined, as (name, source) pairs in order (the name is None for an import), each rewritten
    without what the rule drops (a non-plain annotation). Empty when ``code`` does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    rule = _Rule(tree)
    found: list[tuple[str | None, str]] = []
    for node in tree.body:
        kept = rule.top_level(node)
        if kept is None:
            continue
        name = None if isinstance(kept, ast.Import | ast.ImportFrom) else getattr(kept, "name", None)
        try:
            found.append((name, ast.unparse(kept)))
        except (ValueError, RecursionError):
            continue
    return found


def _untrusted_join(prompt: str, text: str) -> Program | None:
    """``prompt + text`` with the prompt's part held to the rule: its own top-level definitions
    kept as `safe_definitions` keeps them, and the one the completion continues kept only when its
    header passes and its body, on the prompt's side, is at most a docstring. None when it fails.

    Line breaks are made Python's first: it reads a lone ``\r`` as one too, and a prompt whose
    lines were split by ``\r`` alone ended, by a count of ``\n``, on its first line, so the code on
    its later lines passed for the model's."""
    joined = _python_newlines(prompt + text)  # a \r\n across the join is one break, as here
    prompt = _python_newlines(prompt)
    try:
        tree = ast.parse(joined)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    rule = _Rule(ast.parse(prompt) if compiles(prompt) else tree)
    end = _end_of(prompt)
    body: list[ast.stmt] = []
    prompt_only: set[str] = set()
    changed = False
    for node in tree.body:
        if _before(node, end):
            kept = rule.top_level(node)
            if isinstance(kept, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                prompt_only.add(kept.name)
        elif _starts_before(node, end):
            # the function or class the completion continues: a dunder name rebinds module state
            kept = None if _is_dunder(getattr(node, "name", "")) else rule.continued(node, end)
            if kept is None:
                return None  # the definition the completion continues is not one the rule keeps
        else:
            kept = node  # the model's
        changed |= kept is not node
        if kept is not None:
            body.append(kept)
    if not changed:
        return Program(joined, frozenset(prompt_only))
    try:
        return Program(ast.unparse(ast.Module(body=body, type_ignores=[])), frozenset(prompt_only))
    except (ValueError, RecursionError):
        return None


def _python_newlines(source: str) -> str:
    """``source`` with its line breaks as Python's tokenizer reads them (``\r\n`` and ``\r`` are
    ``\n``; it translates them before anything else, inside string literals too)."""
    return source.replace("\r\n", "\n").replace("\r", "\n")


def _end_of(prompt: str) -> tuple[int, int]:
    """Where ``prompt`` ends, as ast positions: line (1-based) and UTF-8 byte column."""
    lines = prompt.split("\n")
    return len(lines), len(lines[-1].encode("utf-8"))


def _first_line(node: ast.stmt) -> int:
    decorators: list[ast.expr] = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def _before(node: ast.stmt, end: tuple[int, int]) -> bool:
    assert node.end_lineno is not None and node.end_col_offset is not None
    return (node.end_lineno, node.end_col_offset) <= end


def _starts_before(node: ast.stmt, end: tuple[int, int]) -> bool:
    first = _first_line(node)
    return first < end[0] or (first == end[0] and node.col_offset < end[1])


class _Rule:
    """The rule of the module docstring, for one prompt.

    ``bound``: every name the prompt binds other than by an import (a def, a class, an assignment,
    a parameter, anywhere in it): a decorator, base or annotation naming one of those could reach
    the prompt's own code. ``imported``: for each name an import binds, what it binds
    (``module.name``, or ``module`` for ``import module``)."""

    def __init__(self, tree: ast.Module) -> None:
        self.bound: set[str] = set()
        self.imported: dict[str, set[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.bound.add(node.name)
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                self.bound.add(node.id)
            elif isinstance(node, ast.arg):
                self.bound.add(node.arg)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self.bound.add(node.name)
            elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
                self.bound.add(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                self.bound.add(node.rest)
            elif isinstance(node, ast.Global | ast.Nonlocal):
                self.bound.update(node.names)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    self.imported.setdefault(local, set()).add(alias.name if alias.asname else local)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    where = f"{'.' * node.level}{node.module or ''}"
                    self.imported.setdefault(alias.asname or alias.name, set()).add(f"{where}.{alias.name}")

    # ------------------------------------------------------------------ statements

    def top_level(self, node: ast.stmt) -> ast.stmt | None:
        """``node`` as the rule keeps it at the top of the prompt (itself when unchanged), or None.

        Nothing that rebinds a builtin is kept: the answer's own ``len(...)`` or ``open(...)``
        would then call what the client put there."""
        if isinstance(node, ast.Import | ast.ImportFrom):
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                return node if node.module == "typing" and not node.level else None
            bound = [a.asname or a.name.split(".")[0] for a in node.names]
            return None if any(_is_builtin(name) for name in bound) else node
        if _is_builtin(getattr(node, "name", "")):
            return None
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return self.function(node, {})
        if isinstance(node, ast.ClassDef):
            return self.klass(node)
        return None

    def function(
        self, node: ast.FunctionDef | ast.AsyncFunctionDef, scope: dict[str, str]
    ) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """A definition whose defaults are literals and decorators allowed; non-plain annotations
        are dropped. The body is left as it is: it runs only when called."""
        if getattr(node, "type_params", None):
            return None
        a = node.args
        defaults = [*a.defaults, *(d for d in a.kw_defaults if d is not None)]
        if not all(_is_literal(d) for d in defaults):
            return None
        if not all(self.decorator(d, scope) for d in node.decorator_list):
            return None
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p is not None)]
        stale = [p for p in params if p.annotation is not None and not self.plain(p.annotation)]
        bad_return = node.returns is not None and not self.plain(node.returns)
        if not stale and not bad_return:
            return node
        out = copy.deepcopy(node)
        oa = out.args
        for p in [*oa.posonlyargs, *oa.args, *oa.kwonlyargs, *(q for q in (oa.vararg, oa.kwarg) if q is not None)]:
            if p.annotation is not None and not self.plain(p.annotation):
                p.annotation = None
        if bad_return:
            out.returns = None
        return out

    def klass(self, node: ast.ClassDef) -> ast.ClassDef | None:
        """A class whose bases are builtin classes (`builtin_class`), with no keywords
        (``metaclass=``), allowed decorators, and a body the rule keeps whole."""
        if getattr(node, "type_params", None) or node.keywords:
            return None
        if not all(self.builtin_class(b) for b in node.bases):
            return None
        if not all(self.decorator(d, {}) for d in node.decorator_list):
            return None
        body = self.class_body(node.body)
        if body is None:
            return None
        if body == node.body:
            return node
        out = copy.copy(node)
        out.body = body
        return out

    def class_body(self, stmts: list[ast.stmt]) -> list[ast.stmt] | None:
        scope: dict[str, str] = {}  # names bound in this body so far: "property" or "other"
        body: list[ast.stmt] = []
        for stmt in stmts:
            kept: ast.stmt | None
            if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                kept = stmt
            elif isinstance(stmt, ast.Assign):
                if not (all(isinstance(t, ast.Name) for t in stmt.targets) and _is_literal(stmt.value)):
                    return None
                kept = stmt
                for t in stmt.targets:
                    scope[t.id] = "other"  # type: ignore[attr-defined]  # checked: Names
            elif isinstance(stmt, ast.AnnAssign):
                if not isinstance(stmt.target, ast.Name) or (stmt.value is not None and not _is_literal(stmt.value)):
                    return None
                if self.plain(stmt.annotation):
                    kept = stmt
                elif stmt.value is None:
                    kept = None  # only an annotation, and one that would run: dropped
                else:
                    kept = ast.Assign(targets=[stmt.target], value=stmt.value, lineno=stmt.lineno)
                scope[stmt.target.id] = "other"
            elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                kept = self.function(stmt, scope)
                if kept is None:
                    return None
                scope[stmt.name] = "property" if _makes_property(stmt) else "other"
            elif isinstance(stmt, ast.ClassDef):
                kept = self.klass(stmt)
                if kept is None:
                    return None
                scope[stmt.name] = "other"
            else:
                return None
            if kept is not None:
                body.append(kept)
        return body or [ast.Pass()]

    def continued(self, node: ast.stmt, end: tuple[int, int]) -> ast.stmt | None:
        """The definition a completion continues: its header as `top_level` keeps it, and of its
        body only a docstring (a function) or what the rule keeps (a class) on the prompt's side."""
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            header = self.function(node, {})
            if header is None:
                return None
            for i, stmt in enumerate(node.body):
                if not _starts_before(stmt, end):
                    break
                is_doc = i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                if not (is_doc and _before(stmt, end)):
                    return None  # a statement the prompt wrote, or began for the model to finish
            return header
        if isinstance(node, ast.ClassDef):
            inside = [s for s in node.body if _before(s, end)]  # a prefix: statements are in order
            rest = node.body[len(inside) :]
            shell = copy.copy(node)
            shell.body = inside or [ast.Pass()]
            kept = self.klass(shell)
            if kept is None:
                return None
            if rest and _starts_before(rest[0], end):
                inner = self.continued(rest[0], end)
                if inner is None:
                    return None
                rest = [inner, *rest[1:]]
            if kept is shell and rest == node.body[len(inside) :]:
                return node
            out = copy.copy(node)
            out.body = [*(kept.body if inside else []), *rest]
            return out
        return None

    # ------------------------------------------------------------------ expressions

    def builtin_class(self, node: ast.expr) -> bool:
        """A builtin class by its own name, which the prompt neither defines nor imports over.
        Only those are bases: a class's creation runs its bases' hooks (``__init_subclass__``,
        an enum's ``__init__`` for each member, a metaclass), and through an import (``from
        solution import Base``, the program itself) they could be the prompt's."""
        return (
            isinstance(node, ast.Name)
            and node.id not in self.bound
            and node.id not in self.imported
            and isinstance(getattr(builtins, node.id, None), type)
        )

    def typing_name(self, node: ast.expr) -> bool:
        """A builtin class, or a name of ``typing`` or ``collections.abc`` (``List``,
        ``typing.Optional``): what an annotation may name."""
        if self.builtin_class(node):
            return True
        if isinstance(node, ast.Name) and node.id not in self.bound:
            sources = self.imported.get(node.id, set())
            return bool(sources) and all(src.rpartition(".")[0] in _TYPING for src in sources)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id not in self.bound:
            return self.imported.get(node.value.id) in ({"typing"}, {"collections.abc"})
        return False

    def plain(self, node: ast.expr) -> bool:
        """An annotation whose evaluation runs only the standard library's code: builtin classes
        and ``typing``'s names, subscripts of them, string and None constants, tuples, lists and
        ``|``. Any other name could lead, by an attribute or a subscript, to the prompt's code
        (``modules["solution"].T[0]`` runs ``T.__class_getitem__``)."""
        if isinstance(node, ast.Constant):
            return node.value is None or isinstance(node.value, str)
        if isinstance(node, ast.Name | ast.Attribute):
            return self.typing_name(node)
        if isinstance(node, ast.Subscript):
            return self.plain(node.value) and self.plain(node.slice)
        if isinstance(node, ast.Tuple | ast.List):
            return all(self.plain(e) for e in node.elts)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.plain(node.left) and self.plain(node.right)
        return False

    def decorator(self, node: ast.expr, scope: dict[str, str]) -> bool:
        if isinstance(node, ast.Call):
            args = [*node.args, *(k.value for k in node.keywords)]
            if any(k.arg is None for k in node.keywords) or not all(_is_literal(a) for a in args):
                return False
            return self._known_decorator(node.func, scope, call=True)
        return self._known_decorator(node, scope, call=False)

    def _known_decorator(self, node: ast.expr, scope: dict[str, str], *, call: bool) -> bool:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner, attr = node.value.id, node.attr
            if attr in _PROPERTY_PARTS and scope.get(owner) == "property":
                return not call
            # module.name, the module bound only by `import module`
            for module, names in _DECORATORS.items():
                if module and attr in names and self.imported.get(owner) == {module} and owner not in self.bound:
                    return True
            return False
        if not isinstance(node, ast.Name) or node.id in self.bound or node.id in scope:
            return False
        if node.id in _DECORATORS[""]:
            return not call and node.id not in self.imported and hasattr(builtins, node.id)
        # name, bound only by `from module import name`
        sources = self.imported.get(node.id, set())
        return bool(sources) and all(
            src.rpartition(".")[0] in _DECORATORS and src.rpartition(".")[2] in _DECORATORS[src.rpartition(".")[0]]
            for src in sources
        )


def _makes_property(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether an (allowed) decorator makes the name a property: ``property`` or ``x.setter``."""
    return any(
        (isinstance(d, ast.Name) and d.id == "property") or (isinstance(d, ast.Attribute) and d.attr in _PROPERTY_PARTS)
        for d in node.decorator_list
    )


def _is_dunder(name: object) -> bool:
    return isinstance(name, str) and len(name) > 4 and name.startswith("__") and name.endswith("__")


def _is_builtin(name: str) -> bool:
    """A name the prompt may not bind at the top of the program: a builtin's (the answer's own
    ``len(...)`` would call the client's code), or a module dunder. ``__builtins__`` is where a
    function defined after it looks builtins up, so a class of that name with a
    ``__class_getitem__`` would run on the answer's every builtin; ``__getattr__``, ``__all__``,
    ``__loader__`` and the like are read by the import system."""
    return hasattr(builtins, name) or _is_dunder(name)


def _is_literal(node: ast.expr) -> bool:
    """A value that runs nothing when evaluated. ``ast.literal_eval`` also takes ``set()``, which
    Python runs as a call of whatever ``set`` means there: in a class body, a method the prompt
    defined as ``set`` just above."""
    if any(isinstance(n, ast.Call | ast.Name) for n in ast.walk(node)):
        return False
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True
