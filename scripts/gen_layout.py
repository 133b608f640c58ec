"""Write docs/layout.md from the tree: every module with the first sentence of its docstring.

The layout page used to be written by hand and fell behind the code (six modules missing). Now it
is generated, and `tests/test_docs.py` fails when the committed page is not what this script writes
from today's tree, so a module moved, added or re-described without rerunning it fails the suite:

    .venv/bin/python scripts/gen_layout.py            # rewrite docs/layout.md
    .venv/bin/python scripts/gen_layout.py --check    # exit 1 if docs/layout.md is stale

Docstrings are read with `ast`, never by importing, so the page is made without the packages'
dependencies (llama.cpp, numpy) and without running any of their code. A file with no docstring
(a package's empty `__init__.py`, a data file) is still listed: being in the tree is what counts.
"""

from __future__ import annotations

import argparse
import ast
import html
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path("docs") / "layout.md"

# The top-level folders the page describes, in the order a reader meets them, each with what the
# folder as a whole is for (the packages' `__init__.py` files carry no docstring to say it).
FOLDERS: dict[str, str] = {
    "router": "The core: config, model catalog, backends, the cascade, the HTTP app, ledger, "
    "pricing, CLI. It imports nothing from `verifiers/` or `evals/` (`tests/test_import_graph.py`).",
    "verifiers": "The Verifier plugin API and the built-in verifiers, registered as plugins are.",
    "evals": "Suites, runner, result store, policy sweep, calibration, reports, learned estimators.",
    "scripts": "One-off measurements and generators behind figures in these docs; each says in its "
    "docstring which figure and how to rerun it (`.venv/bin/python scripts/NAME.py`).",
    "bench": "Configs and inputs that the benchmark commands name (`tierroute bench ... --config bench/...`).",
}
# Folders whose files are listed as one entry: many generated files that say nothing one by one.
COLLAPSED: dict[str, str] = {
    "evals/results": "the committed eval runs, per item (`tierroute eval run --runs-dir evals/results`): "
    "one folder per run",
    "evals/results-gsm8k-full": "the small tier on the whole GSM8K test set, cached per item and resumable "
    "(its README says how): one folder per run",
}
SKIP_DIRS = {"__pycache__"}

_CODE_SPAN = re.compile(r"`([^`]+)`")
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+(?=[A-Z(`\"'])")


def summary(path: Path) -> str:
    """The first sentence of a file's own description: a Python docstring, or a leading comment."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        doc = ast.get_docstring(ast.parse(text, filename=str(path)))
        lines = doc.splitlines() if doc else []
    else:
        lines = []
        for line in text.splitlines():
            if line.startswith("#!"):
                continue
            if not line.startswith("#") or line.startswith("#  "):
                break  # the comment ended, or an indented command follows its first paragraph
            lines.append(line.lstrip("#").strip())
    paragraph: list[str] = []
    for line in lines:
        if not line.strip():
            if paragraph:
                break
            continue
        paragraph.append(line.strip())
    first = " ".join(paragraph)
    first = _SENTENCE_END.split(first, maxsplit=1)[0]
    return _CODE_SPAN.sub(_table_safe_code, first).replace("|", "&#124;")


def _table_safe_code(span: re.Match[str]) -> str:
    # A `|` inside a code span ends a table cell on GitHub unless escaped, and the escape shows up
    # literally on the site; an HTML code element with the entity reads the same on both.
    if "|" not in span[1]:
        return span[0]
    return "<code>" + html.escape(span[1], quote=False).replace("|", "&#124;") + "</code>"


def _entries(root: Path, folder: Path) -> Iterator[tuple[str, str]]:
    """(path relative to the folder, description) for every file under it, depth first, sorted."""
    for path in sorted(folder.iterdir(), key=lambda p: (p.is_dir(), p.name)):
        rel = path.relative_to(root).as_posix()
        if path.name.startswith(".") or path.name in SKIP_DIRS:
            continue
        if path.is_dir():
            if rel in COLLAPSED:
                runs = sorted(p.name for p in path.iterdir() if p.is_dir())
                yield f"{path.relative_to(folder).as_posix()}/", f"{COLLAPSED[rel]}: {', '.join(runs)}"
                continue
            for sub, text in _entries(root, path):
                yield f"{path.name}/{sub}", text
        elif path.suffix in {".py", ".sh", ".toml"}:
            yield path.name, summary(path)
        else:
            yield path.name, ""


def render(root: Path = ROOT) -> str:
    """The layout page for the tree at `root`."""
    lines = [
        "# Layout",
        "",
        "<!-- Generated by scripts/gen_layout.py from the tree; do not edit by hand. -->",
        "",
        "Every module with the first sentence of its docstring, written by `scripts/gen_layout.py`",
        "(`tests/test_docs.py` fails when this page is not what the script writes from the tree:",
        "after adding, moving or re-describing a module, run `.venv/bin/python scripts/gen_layout.py`).",
        "Beside these: `pyproject.toml` (the distribution `tierroute` and its console script),",
        "`config.toml` (the working default config), `tests/` (mirrors the packages; real models and",
        "real servers on loopback), `docs/` (this site, with `bench/` raw benchmark results and `eval/`",
        "the committed eval report).",
    ]
    for name, about in FOLDERS.items():
        folder = root / name
        if not folder.is_dir():
            continue
        lines += ["", f"## `{name}/`", "", about, "", "| file | what it is |", "|---|---|"]
        for rel, text in _entries(root, folder):
            lines.append(f"| `{name}/{rel}` | {text} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed page is stale")
    args = parser.parse_args(argv)
    page = ROOT / OUT
    text = render()
    if args.check:
        if not page.exists() or page.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run .venv/bin/python scripts/gen_layout.py", file=sys.stderr)
            return 1
        return 0
    page.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
