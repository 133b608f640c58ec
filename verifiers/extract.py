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
# info strings of a Python block (the one list: `execution` runs those that are programs); an
# untagged block counts as Python here
PYTHON_LANGS = frozenset({"python", "python3", "py", "py3", "pycon"})
_PYTHON_LANGS = PYTHON_LANGS | {""}
# info strings that label a block's content rather than a programming language: they neither
# make an answer Python nor make it another language
_NEUTRAL_LANGS = frozenset(
    {"text", "txt", "plaintext", "output", "console", "json", "yaml", "toml", "csv", "markdown", "md"}
)
# programming languages a prompt may ask for by name, as they are written (case-sensitive where
# the name is also an English word: Go, Rust, Swift, R)
_LANGUAGE_NAMES = re.compile(
    r"\b(?P<lang>JavaScript|Javascript|javascript|TypeScript|Typescript|typescript|SQL|sql|"
    r"[Bb]ash|[Ss]hell(?: script)?|PowerShell|Java|C\+\+|C#|Go|Golang|Rust|Ruby|PHP|Kotlin|Swift|"
    r"Scala|Haskell|Perl|Lua|Julia|Elixir|Dart|HTML|CSS|R)\b(?![+#])"
)
_PYTHON_NAME = re.compile(r"\b[Pp]ython\b")
_CODE_START = re.compile(r"^(?:def |async def |class |import |from \S+ import |@)", re.MULTILINE)
# where a top-level statement may begin: a line at column 0 that does not continue the one before
# (a closing bracket, or a clause of the compound statement above it)
_TOP_LEVEL_LINE = re.compile(r"[^\s)\]}]")
_CONTINUATION = re.compile(r"(?:else|elif|except|finally|case)\b")
_MAX_PREFIX_TRIES = 64  # each try parses the prefix; an answer rarely has this many top-level lines
# what `ast.parse` raises for text that is not Python: ValueError for NUL bytes, and RecursionError
# or MemoryError for deep nesting, which a few kilobytes reach (3,001 characters of `-` and a `1`)
UNPARSABLE = (SyntaxError, ValueError, MemoryError, RecursionError)


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


def foreign_language(prompt: str, text: str) -> str | None:
    """The other programming language an answer is written in, or None when it is (or may be)
    Python.

    An answer whose fenced blocks are all labelled with another language (```sql, ```javascript)
    is in that language. An answer with no Python-labelled block whose code does not parse as
    Python is in the language its prompt asks for by name ("Write a bash one-liner"), when the
    prompt names one and does not name Python. Code that parses as Python is Python.
    """
    langs = {b.lang for b in fenced_blocks(text)}
    if langs & (_PYTHON_LANGS - {""}):
        return None
    tagged = sorted(lang for lang in langs if lang not in _PYTHON_LANGS and lang not in _NEUTRAL_LANGS)
    if tagged and "" not in langs:
        return tagged[0]
    if compiles(extract_code(text)):
        return None
    if tagged:
        return tagged[0]
    if _PYTHON_NAME.search(prompt):
        return None
    m = _LANGUAGE_NAMES.search(prompt)
    return m.group("lang").lower() if m else None


def outside_fences(text: str) -> str:
    """``text`` with every fenced block (fences included) replaced by a line break: what an answer
    says in prose, apart from its code and the output it shows."""
    return _FENCE.sub("\n", text)


def parse(code: str) -> ast.Module | None:
    """``code``'s syntax tree, or None when it is not Python the parser can hold (see UNPARSABLE)."""
    try:
        return ast.parse(code)
    except UNPARSABLE:
        return None


def compiles(code: str) -> bool:
    """Whether ``code`` is syntactically valid Python (compiling does not run it)."""
    return parse(code) is not None


def extract_code(text: str) -> str:
    """The Python program in a model's answer.

    Fenced blocks labelled python (or unlabelled) win; when there are several, those that define
    or import something are joined in order, so an answer split into a helper block and a
    solution block still runs, while a trailing "example usage" block is left out. Without fences,
    the whole text; and if that does not parse, the text from the first line that starts like
    code (def, class, import, a decorator), which drops a sentence of preamble.

    Code that does not parse keeps its longest prefix that does, cut before a top-level statement
    and defining at least one function or class: an answer that ran into the token cap inside a
    trailing ``print(f(...`` example still has its complete function.
    """
    blocks = [b.body for b in fenced_blocks(text) if b.lang in _PYTHON_LANGS]
    if blocks:
        defining = [b for b in blocks if _CODE_START.search(b)]
        return "\n\n".join(_parsing_prefix(b) for b in defining) if defining else blocks[0]
    if compiles(text):
        return text
    m = _CODE_START.search(text)
    if m is not None:
        code = _parsing_prefix(text[m.start() :])
        if compiles(code):
            return code
    return text


def _parsing_prefix(code: str) -> str:
    """``code`` itself when it parses, else its longest prefix that parses and defines a function
    or class, cut where a top-level statement begins; ``code`` when there is none. Cutting only at
    top level never shortens a definition's body, which would change what it does."""
    if compiles(code):
        return code
    lines = code.splitlines(keepends=True)
    cuts = [
        i for i, line in enumerate(lines) if i > 0 and _TOP_LEVEL_LINE.match(line) and not _CONTINUATION.match(line)
    ]
    for i in reversed(cuts[-_MAX_PREFIX_TRIES:]):
        prefix = "".join(lines[:i])
        if _defines(prefix):
            return prefix
    return code


def _defines(code: str) -> bool:
    tree = parse(code)
    return tree is not None and any(
        isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for n in tree.body
    )


def defined_names(code: str) -> set[str]:
    """Top-level function and class names that ``code`` defines (empty if it does not parse)."""
    tree = parse(code)
    if tree is None:
        return set()
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def definitions(code: str) -> list[tuple[str | None, str]]:
    """The top-level imports, functions and classes of ``code`` as (name, source) pairs, in order;
    the name is None for an import. Other statements are left out, so none of them runs."""
    tree = parse(code)
    if tree is None:
        return []
    found: list[tuple[str | None, str]] = []
    for node in tree.body:
        if not isinstance(node, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        try:  # unparsing recurses in Python, which a tree the parser held can exceed (400 nested `-`)
            source = ast.unparse(node)
        except (ValueError, RecursionError):
            continue
        found.append((None if isinstance(node, ast.Import | ast.ImportFrom) else node.name, source))
    return found
