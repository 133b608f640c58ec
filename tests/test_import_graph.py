"""Arrows point one way: no file under router/, verifiers/ or evals/ imports a file that imports it back.

The graph is read from the source with `ast`, not by importing anything, so an import placed late
inside a function (to dodge a circle at load time) counts like one at the top, and so does one
under `if TYPE_CHECKING:`: a circle a type checker has to untangle is a circle a reader has to.
`from pkg import name` points at `pkg/name.py` when that is a module, else at `pkg` itself.

Circles in files owned by other work in progress are listed in `KNOWN` so the test passes now;
whoever removes one deletes its entry, and an entry that no longer matches a circle fails the test
(so the list cannot go stale).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("router", "verifiers", "evals")

# Each circle as the sorted tuple of the modules in one strongly connected component.
KNOWN: set[tuple[str, ...]] = {
    # dependencies live in app.py and the routes are imported late from it
    ("router.api.app", "router.api.routes_completions", "router.api.routes_health", "router.api.routes_models"),
    # make_backend names the concrete backends, which import the base class back
    ("router.backends.base", "router.backends.llamacpp", "router.backends.openai"),
}


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


def test_no_import_circles_beyond_the_known_ones() -> None:
    found = cycles(graph())
    new = sorted(found - KNOWN)
    assert not new, "import circles (each a set of modules that import each other):\n" + "\n".join(map(str, new))
    gone = sorted(KNOWN - found)
    assert not gone, f"these circles are gone: remove them from KNOWN: {gone}"
