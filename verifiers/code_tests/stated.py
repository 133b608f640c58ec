"""Examples a prompt states in prose, read as tests: ``f(x) == y``, ``f(x) ➞ y``, "Input: / Output:".

With ``stated = true`` (the default), the verifier also runs examples the prompt states in prose:
a call followed by what it gives (``f(x) == y``, ``f(x) ➞ y``, ``->``, ``=>``, ``==>``, ``=``,
``returns``, ``should return``, ``# => y``), "For x = ... the output should be y", and "Input: ...
/ Output: y" tables. Half the HumanEval prompts have no ``>>>`` but state examples this way.
Whoever the caller, these are held to the untrusted rule of `verifiers.code_tests.steps`: the call
names a function the prompt defines (``def f(``), with literal arguments only, and the value is a
literal; each becomes ``f(args) == value``, judged outside the sandbox like an assert.

A prompt is client text read on a thread that holds the GIL, so every pattern here runs under
bounds on what one prompt can cost, whatever it holds (the ``_MAX_*`` constants below).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from verifiers.code_tests.steps import Check, Step, literal, literal_call, short

MAX_PROMPT_CHARS = 200_000  # the text scanned for examples (>>> ones too): the verifier refuses more

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
            short(ex.source) + " == " + short(repr(ex.expected), 40),
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
    return literal(node)


def _literal_call_of(source: str, names: set[str]) -> str | None:
    """``source`` rebuilt from its parse when it is one call of one of ``names`` with literal
    arguments (the untrusted rule of `doctest_steps`), else None."""
    if not literal_call(source):
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
            if not literal_call(f"{name}({m.group(1)})"):
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
