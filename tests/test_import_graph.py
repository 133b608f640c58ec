"""Arrows point one way: no file under router/, verifiers/ or evals/ imports a file that imports it back.

The graph is read from the source with `ast`, not by importing anything, so an import placed late
inside a function (to dodge a circle at load time) counts like one at the top, and so does one
under `if TYPE_CHECKING:`: a circle a type checker has to untangle is a circle a reader has to.
`from pkg import name` points at `pkg/name.py` when that is a module, else at `pkg` itself.

The layers point one way too: `router/` is the core (types, protocols, the cascade, the service)
and imports neither `verifiers/` nor `evals/`, which implement its protocols and are registered by
name through entry points; `verifiers/` does not import `evals/`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("router", "verifiers", "evals")

# What each package may not import: the core knows no implementation, verifiers know no evals.
FORBIDDEN = {"router": ("verifiers", "evals"), "verifiers": ("evals",)}
# The command line is the one composition root that puts every package's commands together.
COMPOSITION_ROOTS = {"router.cli.main"}


def modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(tree: ast.Module, name: str, is_package: bool) -> Iterator[tuple[str, str | None]]:
    """(module, attribute) for every import anywhere in the file; relative ones made absolute."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                yield base, alias.name


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for module, attr in _imported(tree, name, path.name == "__init__.py"):
            target = f"{module}.{attr}" if attr and f"{module}.{attr}" in mods else module
            if target in mods and target != name:
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: set[tuple[str, ...]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.add(tuple(sorted(component)))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_late_and_relative_imports() -> None:
    tree = ast.parse("def f():\n    from . import b\n    import evals.c\n")
    assert set(_imported(tree, "evals.a", False)) == {("evals", "b"), ("evals.c", None)}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {("a", "b", "c")}


def test_no_import_circles() -> None:
    found = sorted(cycles(graph()))
    assert not found, "import circles (each a set of modules that import each other):\n" + "\n".join(map(str, found))


def test_layers_point_one_way() -> None:
    wrong = sorted(
        (module, target)
        for module, targets in graph().items()
        for target in targets
        if target.split(".")[0] in FORBIDDEN.get(module.split(".")[0], ()) and module not in COMPOSITION_ROOTS
    )
    assert not wrong, f"imports against the layers: {wrong}"
    assert not any(t.startswith("verifiers") for t in graph()["router.cascade"])
