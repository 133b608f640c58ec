"""How much work a schema's grammar can make llama.cpp do per token, bounded before it exists.

llama.cpp's grammar engine keeps one parse stack for every way the answer so far may continue,
and for each character of a token it advances every stack and de-duplicates the new ones against
each other by linear search: a character costs about the square of the live stacks, and more
where a repeated part can match nothing (each stack then reaches every later repetition without
reading). The work happens in one C call on the engine thread, which nothing can interrupt, and
every other sequence in the batch waits for it. Measured with the real engine over SmolLM2's
vocabulary (`scripts/grammar_cost.py`; ms per token, mean / max, on two cores that other work
shared, so the maxima are noisy):

    string pattern or schema                       bound    ms per token
    ^[0-9]{4}-[0-9]{2}-[0-9]{2}$                       3      0.1 / 0.3
    ^(([a-z]{64}){64}){64}$ (rigid however deep)       5      0.1 / 0.4
    enum of 500 strings                               63      0.4 / 2
    enum of 850 strings sharing 30 characters        850        3 / 19, 505 ms a vocabulary scan
    ^([a-z]{1,8}){1,8}$                               65      1.0 / 5
    ^a(a?){12}$                                      145      0.2 / 0.2
    ^([a-z]{1,16}){1,16}$                            257      2.8 / 8
    ^([a-z]{1,32}){1,32}$                           1025      7.5 / 26
    ^a(a?){64}$                                     4097       41 / 157
    ^a((a?){12}){12}$                              20737      930 / 1900
    ^a(((a?){6}){6}){6}$                           46657     3500 / 8600
    ^a(((a?){12}){12}){12}$ (issue 26)           ~3 million   6200 / 24700, then > 30 s a token
    anyOf chain, 12 levels of two alike branches   > 256       21 / 380
    anyOf chain, 16 levels                         > 256      390 / 5800, then > 30 s
    two alike recursive objects, 14 levels deep    > 256      370 / 6600, then > 30 s

So a schema's grammar gets a bound on its live stacks, computed from the schema as the converter
will write it, and may hold at most `MAX_GRAMMAR_STACKS` (256: where the cost reaches a few ms a
token):

- A pattern counts its positions (each character class or literal, times the repetitions around
  it) where repetitions can be misaligned: a repeated part of variable length (`([a-z]{1,16}){16}`)
  may be at any of its positions at once. A rigid part (every match the same length, `[0-9]{4}`,
  `(ab){64}`) is at one place, however often repeated. A repeated part that can match nothing
  (`(a?){12}`, `(a|){8}`, `(a*){4}`) counts its positions squared: each reaches all the others.
- Alternatives that begin with the same character (anyOf/oneOf branches, type lists, enum values)
  are alive together and add up (enum values an eighth each while they part within their first
  two characters, whole when more of them share a longer beginning); ones that begin differently
  (a string and an object, Optional's null) part at the first character. Objects alive together
  add up per property name, except where their first property is a `const`/`enum` discriminator
  with different values. An object or array counts the largest of its parts: one property or item
  is read at a time.
- `$ref`s are followed; a recursion that comes back to the same alternatives adds nothing, one
  that widens them (two alike branches each recursing) grows until it passes the bound.

A pattern above the bound is left out of the grammar and checked on the answer by the format
verifier, as bounds above `MAX_GRAMMAR_REPEAT` are: the request still works, the local tier
decodes a plain string there, and a breach escalates. When the schema is above the bound even
with all its patterns left out (its alternatives overlap too much), it is refused with a 400 that
says where. The engine's per-request grammar time budget (`router.backends.grammar_budget`) is
the second line, for whatever this estimate gets wrong.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from router.errors import RequestError

MAX_GRAMMAR_STACKS = 256
MAX_BOUND_WORK = 100_000  # alternatives visited, all sets together (a few tenths of a second at most)
MAX_REF_NESTING = 64  # values nested inside values, references followed
PARAM = "response_format"
_HUGE = 1 << 40  # positions are capped here so arithmetic on nested counts stays small


class Unbounded(RequestError):
    """The schema's grammar could hold more live parse stacks than llama.cpp can advance cheaply."""

    def __init__(self, message: str) -> None:
        super().__init__(message[:500], param=PARAM, code="grammar_too_costly")


# ---- patterns --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rx:
    positions: int  # characters classes and literals, times the repetitions around them
    stacks: int  # live-stack bound (for the explosive case, its cost in stack equivalents)
    length: int | None  # the length of every match, None when it varies
    empty: bool  # matches the empty string


_ATOM = _Rx(1, 1, 1, False)
_EMPTY = _Rx(0, 0, 0, True)


def _alt(branches: list[_Rx]) -> _Rx:
    lengths = {b.length for b in branches}
    return _Rx(
        min(_HUGE, sum(b.positions for b in branches)),
        min(_HUGE, sum(b.stacks for b in branches)),
        lengths.pop() if len(lengths) == 1 else None,
        any(b.empty for b in branches),
    )


def _seq(items: list[_Rx]) -> _Rx:
    if not items:
        return _EMPTY
    # after a part of variable length the alignment is lost: every later part may be live at once
    best, run, misaligned = 0, 0, False
    for item in items:
        run = min(_HUGE, run + item.stacks) if misaligned else item.stacks
        best = max(best, run)
        misaligned = misaligned or item.length is None
    lengths = [i.length for i in items]
    return _Rx(
        min(_HUGE, sum(i.positions for i in items)),
        best,
        None if None in lengths else sum(x for x in lengths if x is not None),
        all(i.empty for i in items),
    )


def _rep(x: _Rx, low: int, high: int | None) -> _Rx:
    if high == 0:
        return _EMPTY
    # the converter writes x{m,n} as copies of x (x{m,} as m copies and x*); llama.cpp writes x+ as x x*
    copies = high if high is not None else low + 1
    positions = min(_HUGE, x.positions * copies)
    length = x.length * low if x.length is not None and low == high else None
    if x.empty and copies > 1:
        stacks = min(_HUGE, max(positions * positions, x.stacks * copies))
    elif copies == 1 or x.length is not None:
        stacks = x.stacks + 1  # one place at a time, or past it
    else:
        stacks = min(_HUGE, max(positions, x.stacks * copies))
    return _Rx(positions, stacks, length, low == 0 or x.empty)


class _Pattern:
    """A recursive-descent reading of the regex subset llama-cpp-python's converter translates."""

    def __init__(self, text: str) -> None:
        self.p = text[1:] if text.startswith("^") else text
        if self.p.endswith("$") and not self.p.endswith("\\$"):
            self.p = self.p[:-1]
        self.i = 0

    def read(self) -> _Rx:
        rx = self._alternation()
        if self.i < len(self.p):
            raise ValueError(f"unbalanced ')' at {self.i}")
        return rx

    def _alternation(self) -> _Rx:
        branches = [self._sequence()]
        while self.i < len(self.p) and self.p[self.i] == "|":
            self.i += 1
            branches.append(self._sequence())
        return branches[0] if len(branches) == 1 else _alt(branches)

    def _sequence(self) -> _Rx:
        items: list[_Rx] = []
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            items.append(self._quantified(self._atom()))
        return _seq(items)

    def _atom(self) -> _Rx:
        p, c = self.p, self.p[self.i]
        if c == "(":
            self.i += 1
            if self.i < len(p) and p[self.i] == "?":
                raise ValueError("(?...) groups are not supported")
            inner = self._alternation()
            if self.i >= len(p) or p[self.i] != ")":
                raise ValueError("unbalanced '('")
            self.i += 1
            return inner
        if c == "[":
            end = self.i + 1
            while end < len(p) and p[end] != "]":
                end += 2 if p[end] == "\\" else 1
            if end >= len(p):
                raise ValueError("unbalanced '['")
            self.i = end + 1
            return _ATOM
        if c in "*+?{":
            raise ValueError(f"nothing to repeat at {self.i}")
        self.i += 2 if c == "\\" else 1
        return _ATOM

    def _quantified(self, x: _Rx) -> _Rx:
        p = self.p
        while self.i < len(p) and p[self.i] in "*+?{":
            c = p[self.i]
            self.i += 1
            if c != "{":
                x = _rep(x, 1 if c == "+" else 0, 1 if c == "?" else None)
                continue
            end = p.find("}", self.i)
            if end < 0:
                raise ValueError("unbalanced '{'")
            parts = [s.strip() for s in p[self.i : end].split(",")]
            self.i = end + 1
            if len(parts) > 2 or not all(s == "" or s.isdigit() for s in parts) or parts[0:1] == [""] == parts:
                raise ValueError(f"bad repetition {{{p[self.i : end]}}}")
            low = int(parts[0]) if parts[0] else 0
            high = low if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
            x = _rep(x, low, high)
        return x


def pattern_stacks(pattern: str) -> int:
    """The live-stack bound of a string matching `pattern` (its quotes included). ValueError for
    a pattern the bound cannot read (the converter refuses those too)."""
    return _Pattern(pattern).read().stacks + 1


# ---- schemas ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What a schema's grammar will hold: its live-stack bound, and the patterns left to the
    verifier (above the bound alone, or all of them when the schema needed that to fit). Patterns
    the bound cannot read (lookarounds, unbalanced groups) are `unreadable`: the converter refuses
    those too, in its own words, and where it would not they must stay out of the grammar."""

    stacks: int
    dropped: frozenset[str]
    unreadable: frozenset[str] = frozenset()


def plan(schema: dict[str, Any]) -> Plan:
    """The bound of `schema` (loosened and root-dereferenced, as the converter gets it), with the
    patterns that must stay out of its grammar; Unbounded (400) when it is above the bound even
    without patterns. Pure and quick: at most MAX_BOUND_WORK alternatives visited."""
    first = _Bound(schema, keep_patterns=True)
    try:
        return Plan(first.measure(), frozenset(first.dropped), frozenset(first.unreadable))
    except _Over as over:
        if not first.patterns:
            raise Unbounded(over.message(first)) from None
    second = _Bound(schema, keep_patterns=False)
    try:
        return Plan(second.measure(), frozenset(second.patterns), frozenset(first.unreadable))
    except _Over as over:
        raise Unbounded(over.message(second)) from None


class _Over(Exception):
    def __init__(self, why: str, node: Any = None) -> None:
        super().__init__(why)
        self.why, self.node = why, node

    def message(self, bound: _Bound) -> str:
        where = bound.paths.get(id(self.node), "#") if self.node is not None else "#"
        return f"JSON schema at '{where}': {self.why}"


_NUMBER = "num"  # first "character" of a number: any of -0123456789


# a string's quote and its first two characters: values that share no more part within a token or two
SHARED_LITERAL = 3


def _literal_text(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return ""


def _first_of_literal(value: Any) -> str:
    text = json.dumps(value)
    return _NUMBER if text[0] in "-0123456789" else text[0]


class _Bound:
    def __init__(self, schema: dict[str, Any], *, keep_patterns: bool) -> None:
        self.root = schema
        self.keep = keep_patterns
        self.work = 0
        self.depth = 0
        self.memo: dict[tuple[int, ...], int] = {}
        self.active: dict[tuple[int, ...], int] = {}  # alternatives sets being measured -> their depth
        self.reentered = _HUGE  # the shallowest open set met again below (its value there is partial)
        self.derived: dict[tuple[int, str], dict[str, Any]] = {}  # stable copies: type-list members
        self.leaves: dict[str, dict[str, Any]] = {}  # scalar-only schemas by content (_interned)
        self.paths: dict[int, str] = {}
        self.patterns: set[str] = set()  # every pattern met
        self.dropped: set[str] = set()  # patterns above the bound alone
        self.unreadable: set[str] = set()  # patterns the bound cannot read (counted as plain strings)
        self._index(schema, "#")

    def _index(self, node: Any, where: str) -> None:
        if isinstance(node, dict):
            self.paths.setdefault(id(node), where)
            for key, value in node.items():
                self._index(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                self._index(value, f"{where}/{i}")

    def measure(self) -> int:
        return self.joint([self.root])

    # the converter's reading of a node: $ref first, then oneOf/anyOf, type lists, const, enum...
    def _resolve(self, node: Any) -> Any:
        seen: set[str] = set()
        while isinstance(node, dict) and isinstance(ref := node.get("$ref"), str):
            if ref in seen or not ref.startswith("#/"):
                return {}  # refused elsewhere (a cycle of references, a remote one)
            seen.add(ref)
            target: Any = self.root
            for part in ref[2:].split("/"):
                target = target.get(part) if isinstance(target, dict) else None
            node = target if isinstance(target, dict) else {}
        return node

    def _branches(self, node: Any, out: list[dict[str, Any]], seen: frozenset[int]) -> None:
        self.work += 1  # alternatives of alternatives can be a lattice: every path through it counts
        if self.work > MAX_BOUND_WORK:
            raise _Over("too many alternatives and references to bound its grammar's work", node)
        node = self._resolve(node)
        if not isinstance(node, dict) or id(node) in seen:
            return  # an alternative that is itself: left recursion, which llama.cpp refuses
        inner = seen | {id(node)}
        alts = node.get("oneOf") or node.get("anyOf")
        if isinstance(alts, list):
            for alt in alts:
                self._branches(alt, out, inner)
        elif isinstance(node.get("type"), list):
            for t in node["type"]:
                key = (id(node), str(t))
                if key not in self.derived:
                    self.derived[key] = {**node, "type": t}
                    self.paths[id(self.derived[key])] = self.paths.get(id(node), "#")
                out.append(self._interned(self.derived[key]))
        else:
            out.append(self._interned(node))

    def _interned(self, node: dict[str, Any]) -> dict[str, Any]:
        """One node per content for schemas of scalars alone (`{"type": "null"}` written in forty
        places), so that alike alternatives sets are one set to measure and remember."""
        if any(isinstance(v, (dict, list)) for v in node.values()):
            return node
        try:
            return self.leaves.setdefault(json.dumps(node, sort_keys=True), node)
        except (TypeError, ValueError):
            return node

    @staticmethod
    def _kind(node: dict[str, Any]) -> str:
        t = node.get("type")
        if "const" in node:
            return "literal"
        if "enum" in node:
            return "literal"
        if t in (None, "object") and (
            "properties" in node or ("additionalProperties" in node and node["additionalProperties"] is not True)
        ):
            return "object"
        if t in (None, "object") and "allOf" in node:
            return "object"
        if t in (None, "array") and ("items" in node or "prefixItems" in node):
            return "array"
        if t in (None, "string") and "pattern" in node:
            return "pattern"
        if t in (None, "string") and isinstance(node.get("format"), str):
            return "string"
        if t == "object" or not node:
            return "free"  # any JSON object: llama.cpp's own JSON rules, which part at each character
        return str(t) if t in ("string", "number", "integer", "boolean", "null", "array") else "free"

    def _firsts(self, node: dict[str, Any], kind: str) -> set[str]:
        if kind == "literal":
            return {_first_of_literal(v) for v in self._values(node)} or {"*"}
        return {
            "object": {"{"},
            "free": {"{"},
            "array": {"["},
            "pattern": {'"'},
            "string": {'"'},
            "number": {_NUMBER},
            "integer": {_NUMBER},
            "boolean": {"t", "f"},
            "null": {"n"},
        }.get(kind, {"*"})

    def joint(self, nodes: list[Any]) -> int:
        """Live stacks while all of `nodes` are alive at the same place of the answer."""
        expanded: list[dict[str, Any]] = []
        for node in nodes:
            self._branches(node, expanded, frozenset())
            # each alternative is a stack before the first character (literal values cheaper: _literals)
            alive = sum(1 if "const" in n or "enum" in n else 8 for n in expanded) // 8
            if alive > MAX_GRAMMAR_STACKS:
                raise _Over(self._too_many(alive), expanded[0])
        self.work += len(expanded) + 1
        if self.work > MAX_BOUND_WORK:
            raise _Over("too many alternatives and references to bound its grammar's work", nodes[0])
        if not expanded:
            return 0
        key = tuple(sorted(id(n) for n in expanded))
        if key in self.active:
            # the same alternatives again, deeper: no stack more than the first time
            self.reentered = min(self.reentered, self.active[key])
            return 0
        if key in self.memo:
            return self.memo[key]
        depth = len(self.active) + 1
        if depth > MAX_REF_NESTING:
            raise _Over(f"values nest more than {MAX_REF_NESTING} levels deep through its references", nodes[0])
        self.active[key] = depth
        outer, self.reentered = self.reentered, _HUGE
        try:
            kinds = [(n, self._kind(n)) for n in expanded]
            stacks = max(self._initial(kinds), max(self._group(g) for g in self._groups(kinds)))
        finally:
            del self.active[key]
        if self.reentered >= depth:  # no reentry into a set opened above this one: the value is whole
            self.memo[key] = stacks
        self.reentered = min(outer, self.reentered)
        if stacks > MAX_GRAMMAR_STACKS:
            raise _Over(self._too_many(stacks), expanded[0])
        return stacks

    def _initial(self, kinds: list[tuple[dict[str, Any], str]]) -> int:
        """Stacks before the first character: one per alternative, literal values as in _literals."""
        values = [v for n, k in kinds if k == "literal" for v in self._values(n)]
        return sum(k != "literal" for _, k in kinds) + self._literals(values)

    @staticmethod
    def _values(node: dict[str, Any]) -> list[Any]:
        if "const" in node:
            return [node["const"]]
        enum = node.get("enum")
        return enum if isinstance(enum, list) else []

    @staticmethod
    def _literals(values: list[Any]) -> int:
        """One stack per value until its first differing character; measured, 500 values cost about
        what 30 stacks of a pattern do (shallow stacks, each with one way on) when they part early.
        Values that share a beginning stay alive together past it, and a check of the vocabulary
        then costs what as many pattern stacks do (850 values sharing 30 characters: 505 ms a
        scan, 256 of them 179 ms, the bound's own pattern 176 ms): the largest group sharing the
        first SHARED_LITERAL characters of their JSON text counts whole."""
        texts = {_literal_text(v) for v in values}
        shared: dict[str, int] = {}
        for text in texts:
            shared[text[:SHARED_LITERAL]] = shared.get(text[:SHARED_LITERAL], 0) + 1
        return max(math.ceil(len(values) / 8), max(shared.values(), default=0))

    @staticmethod
    def _too_many(stacks: int) -> str:
        return (
            f"its alternatives (anyOf/oneOf, type lists, enums, patterns) overlap so that decoding under "
            f"it could keep about {stacks} parse states alive at once; at most {MAX_GRAMMAR_STACKS} are "
            "served (make alternatives differ early, e.g. by a const first property)"
        )

    def _groups(self, kinds: list[tuple[dict[str, Any], str]]) -> list[list[tuple[dict[str, Any], str]]]:
        """Alternatives that may share a first character, together (they part at the first otherwise)."""
        firsts = [self._firsts(*item) for item in kinds]
        if any("*" in f for f in firsts):
            return [kinds]
        parent: dict[str, str] = {}  # union-find over first characters

        def find(c: str) -> str:
            while parent.setdefault(c, c) != c:
                c = parent[c]
            return c

        for f in firsts:
            root, *rest = (find(c) for c in f)
            for other in rest:
                parent[other] = root
        groups: dict[str, list[tuple[dict[str, Any], str]]] = {}
        for item, f in zip(kinds, firsts, strict=True):
            groups.setdefault(find(next(iter(f))), []).append(item)
        return list(groups.values())

    def _group(self, group: list[tuple[dict[str, Any], str]]) -> int:
        total = 0
        objects = [n for n, k in group if k == "object"]
        arrays = [n for n, k in group if k == "array"]
        total += self._literals([v for n, k in group if k == "literal" for v in self._values(n)])
        for node, kind in group:
            total += self._scalar(node, kind)
        if objects:
            total += self._objects(objects)
        if arrays:
            items: list[Any] = []
            for a in arrays:
                items += a["prefixItems"] if isinstance(a.get("prefixItems"), list) else []
                items += a["items"] if isinstance(a.get("items"), list) else []
                items += [a["items"]] if isinstance(a.get("items"), dict) else []
            total += len(arrays) + (self.joint(items) if items else 0)
        return total

    def _scalar(self, node: dict[str, Any], kind: str) -> int:
        if kind == "pattern":
            pattern = node["pattern"]
            if not isinstance(pattern, str):
                return 2
            self.patterns.add(pattern)
            if not self.keep:
                return 2
            try:
                stacks = pattern_stacks(pattern)
            except ValueError:
                self.unreadable.add(pattern)
                return 2
            if stacks > MAX_GRAMMAR_STACKS:
                self.dropped.add(pattern)
                return 2
            return stacks
        # llama.cpp's rules for these are deterministic: a few stacks at any character (literals: _group)
        return {"number": 4, "integer": 2, "boolean": 2, "null": 1, "string": 2, "free": 4, "array": 4}.get(kind, 0)

    def _objects(self, objects: list[dict[str, Any]]) -> int:
        parts = self._by_discriminator(objects)
        if len(parts) > 1:
            firsts = [self._properties(o)[0][0][1] for o in objects]
            return max(len(objects) + self.joint(firsts), max(self._objects(p) for p in parts))
        values: dict[str, list[Any]] = {}
        extras: list[Any] = []
        for o in objects:
            props, extra = self._properties(o)
            for name, sub in props:
                values.setdefault(name, []).append(sub)
            if extra is not None:
                extras.append(extra)
        # keys are literals read before their value: about as cheap as an enum of them
        stacks = len(objects) + math.ceil(len(values) / 8)
        for subs in values.values():
            stacks = max(stacks, self.joint(subs + extras))
        if extras:
            stacks = max(stacks, self.joint(extras))
        return stacks

    def _properties(self, node: dict[str, Any]) -> tuple[list[tuple[str, Any]], Any]:
        """(name, schema) in the converter's order (required first), and the schema of other
        properties (None when there may be none)."""
        props: list[tuple[str, Any]] = []
        required: set[str] = set()
        parts = [node, *(self._resolve(p) for p in node.get("allOf") or [] if isinstance(p, (dict,)))]
        for part in parts:
            if isinstance(part, dict) and isinstance(part.get("properties"), dict):
                props += list(part["properties"].items())
                if isinstance(part.get("required"), list):
                    required |= {r for r in part["required"] if isinstance(r, str)}
        ordered = [p for p in props if p[0] in required] + [p for p in props if p[0] not in required]
        extra = node.get("additionalProperties")
        return ordered, ({} if extra is True else extra if isinstance(extra, dict) else None)

    def _by_discriminator(self, objects: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """Objects whose first property is a literal of values no other one shares: each apart."""
        if len(objects) < 2:
            return [objects]
        firsts = []
        for o in objects:
            props, _ = self._properties(o)
            if not props or props[0][0] not in (o.get("required") or []):
                return [objects]
            sub = self._resolve(props[0][1])
            if not isinstance(sub, dict) or self._kind(sub) != "literal":
                return [objects]
            firsts.append((props[0][0], {json.dumps(v, sort_keys=True) for v in self._values(sub)}))
        if len({name for name, _ in firsts}) != 1:
            return [objects]
        parts: list[tuple[set[str], list[dict[str, Any]]]] = []
        for o, (_, values) in zip(objects, firsts, strict=True):
            merged = [p for p in parts if p[0] & values]
            for p in merged:
                parts.remove(p)
                values = values | p[0]
            parts.append((values, [m for p in merged for m in p[1]] + [o]))
        return [p[1] for p in parts]
