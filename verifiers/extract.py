"""Pull the parts a verifier checks out of free model text: fenced blocks and Python code.

Pure functions of strings; nothing here runs the code it finds.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

# An opening fence of three or more backticks (or tildes), an optional info string, then the body
# up to a closing fence of the same kind, or to the end of the text when the answer was cut off.
_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)(?:^[ \t]*(?P=fence)[ \t]*$|\Z)",
    re.DOTALL | re.MULTILINE,
)
_PYTHON_LANGS = frozenset({"python", "python3", "py", "py3", "pycon", ""})
_CODE_START = re.compile(r"^(?:def |async def |class |import |from \S+ import |@)", re.MULTILINE)


@dataclass(frozen=True)
class FencedBlock:
    lang: str  # lower-cased first word of the info string; "" when none
    body: str


def fenced_blocks(text: str) -> list[FencedBlock]:
    """Every fenced block in ``text``, in order; an unclosed last fence runs to the end."""
    blocks = []
    for m in _FENCE.finditer(text):
        info = m.group("info").strip().split()
        blocks.append(FencedBlock(info[0].lower() if info else "", m.group("body")))
    return blocks


def compiles(code: str) -> bool:
    """Whether ``code`` is syntactically valid Python (compiling does not run it)."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):  # ValueError: source with NUL bytes
        return False
    return True


def extract_code(text: str) -> str:
    """The Python program in a model's answer.

    Fenced blocks labelled python (or unlabelled) win; when there are several, those that define
    or import something are joined in order, so an answer split into a helper block and a
    solution block still runs, while a trailing "example usage" block is left out. Without fences,
    the whole text; and if that does not parse, the text from the first line that starts like
    code (def, class, import, a decorator), which drops a sentence of preamble.
    """
    blocks = [b.body for b in fenced_blocks(text) if b.lang in _PYTHON_LANGS]
    if blocks:
        defining = [b for b in blocks if _CODE_START.search(b)]
        return "\n\n".join(defining) if defining else blocks[0]
    if compiles(text):
        return text
    m = _CODE_START.search(text)
    if m is not None and compiles(text[m.start() :]):
        return text[m.start() :]
    return text


def defined_names(code: str) -> set[str]:
    """Top-level function and class names that ``code`` defines (empty if it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return set()
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def definitions(code: str) -> list[tuple[str | None, str]]:
    """The top-level imports, functions and classes of ``code`` as (name, source) pairs, in order;
    the name is None for an import. Other statements are left out, so none of them runs."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    found: list[tuple[str | None, str]] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((None, ast.unparse(node)))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.append((node.name, ast.unparse(node)))
    return found
