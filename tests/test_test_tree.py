"""The test tree mirrors the code, and tests share helpers only through tests/support/.

A test module that imports another test module couples two tests: moving, renaming or deleting
one breaks the other, and pytest may collect the imported module's tests twice. So helpers live
in tests/support/, fixtures in conftest.py files, and nothing else under tests/ is imported.
Read from the source with `ast` (nothing imported), like tests/test_import_graph.py.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
SUPPORT = TESTS / "support"


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def imports_of_tests(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, module) for every import of a `tests` module, wherever it sits in the file."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            yield node.lineno, "." * node.level + (node.module or "")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tests":
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tests":
                    yield node.lineno, alias.name


def is_fixture_or_hook(node: ast.stmt) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name.startswith("pytest_") or any("fixture" in ast.unparse(d) for d in node.decorator_list)
    return False


def test_tests_import_only_the_support_package() -> None:
    wrong = []
    for path in python_files():
        for line, module in imports_of_tests(ast.parse(path.read_text(encoding="utf-8"))):
            if not (module == "tests.support" or module.startswith("tests.support.")):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "import helpers from tests.support, never from a test module or conftest:\n" + "\n".join(wrong)


def test_no_pytest_plugins_name_a_test_module() -> None:
    # fixtures shared across folders belong in a conftest.py, which pytest finds by itself
    wrong = []
    for path in python_files():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets
            ):
                if "tests." in ast.unparse(node.value):
                    wrong.append(str(path.relative_to(ROOT)))
    assert not wrong


def test_conftest_files_hold_only_fixtures_and_hooks() -> None:
    wrong = []
    for path in sorted(TESTS.rglob("conftest.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)) or is_fixture_or_hook(node):
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node).splitlines()[0]}")
    assert not wrong, "move helpers to tests/support/:\n" + "\n".join(wrong)


def test_support_modules_hold_no_tests() -> None:
    # pytest collects only test_*.py: a test that lands in a helper module (say, merged into a
    # file that was split) would silently never run
    wrong = []
    for path in sorted(SUPPORT.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and (
                node.name.startswith("test_") or node.name.startswith("Test")
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not wrong, "move these tests to a test_*.py module:\n" + "\n".join(wrong)


def test_every_module_outside_support_is_a_test_or_a_conftest() -> None:
    loose = [
        str(p.relative_to(ROOT))
        for p in python_files()
        if SUPPORT not in p.parents and not (p.name.startswith("test_") or p.name in ("conftest.py", "__init__.py"))
    ]
    assert not loose, "helper modules belong in tests/support/: " + ", ".join(loose)


def test_test_folders_mirror_the_code() -> None:
    # tests/router/ledger/ tests router/ledger/; every folder of tests is a package of the code
    # (or scripts/), so a reader finds a module's tests where the module is
    unmatched = []
    for folder in sorted({p.parent for p in TESTS.rglob("test_*.py")}):
        if folder == TESTS:
            continue
        mirrored = ROOT / folder.relative_to(TESTS)
        if not mirrored.is_dir():
            unmatched.append(str(folder.relative_to(ROOT)))
        if not (folder / "__init__.py").is_file():
            unmatched.append(f"{folder.relative_to(ROOT)} (no __init__.py)")
    assert not unmatched, "test folders without a code folder they mirror: " + ", ".join(unmatched)


def test_no_support_module_shadows_the_standard_library() -> None:
    """A support script run as a file (`python tests/support/otlp_receiver.py`) has its folder first
    on sys.path, so a support module named like a standard module (`http.py`) replaces it there:
    the receiver's `import http.client` failed so once."""
    import sys

    clashes = sorted(p.stem for p in (TESTS / "support").glob("*.py") if p.stem in sys.stdlib_module_names)
    assert not clashes, clashes
