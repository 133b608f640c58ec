"""JSON Schemas as llama.cpp grammars: what a client's schema may contain, and its GBNF.

A local tier honours `response_format` by decoding under a grammar (GBNF) that only JSON of the
asked shape can satisfy. llama-cpp-python's converter (`llama_cpp.llama_grammar`) writes it, but
it was made for trusted schemas: keywords it does not know it skips silently, `maxLength: 10**6`
becomes a million-rule expansion, and a non-local `$ref` fails with an assertion. So a client's
schema is read here first, once, before any model sees it:

- Keywords the grammar enforces (types, properties, required, items, enum, const, anyOf/oneOf,
  local `$ref`s, string patterns and formats, small length and count bounds) are converted.
- Keywords the grammar cannot enforce but a validator can (numeric bounds, `uniqueItems`,
  property counts; length or count bounds above `MAX_GRAMMAR_REPEAT`) are left out of the grammar
  and checked on the answer by the `format` verifier, so a breach escalates instead of passing.
- Annotations (title, description, default, examples...) are ignored, as JSON Schema says.
- Anything else (`not`, `if`/`then`, `patternProperties`, a remote `$ref`, an unknown keyword)
  is refused with a 400 that names the keyword and where it sits: a grammar that silently ignored
  it would let answers through that the client's own validation then rejects.
- Except in a function that is not `strict`: there OpenAI takes any schema as a hint the model may
  not follow, so the service does too (`loosened_tool_schema`). What the grammar cannot honour is
  taken out of the schema this service enforces and validates (a looser one: `not`, `nullable`,
  `if`/`then`, `patternProperties`... never reach the validator, whose own `patternProperties`
  would run client regexes unbounded); the model and a remote tier still see the client's schema.
  Remote `$ref`s, invalid types and oversized patterns are refused there too.

Sizes are capped (schema bytes, nesting depth, grammar size), so one request cannot make the
conversion or llama.cpp's grammar parser expensive. Decoding under the grammar is bounded too:
`router.structured.grammar_bound` bounds the parse stacks it can keep alive (what llama.cpp's work per token
grows with; nested repetitions and alike alternatives multiply them), leaves a pattern above the
bound to the verifier, and refuses a schema above it even without patterns. Grammars and checks
are cached per schema (its compact JSON, property order kept: the grammar writes properties in
that order).

JSON mode (`json_object`) has no schema, and a grammar of "any object" lets a model write one
string, or one array, until `max_tokens` cuts it off: unparseable JSON, which the format verifier
rejects, but the last tier's answer is returned all the same. So JSON mode's grammar is bounded
by the request's token budget (`json_object_grammar`): strings of at most about two characters
per token of budget, arrays and objects of at most a sixteenth of it in items, four levels of
nesting. A model that loops on an array item or a sentence is made to close it and finish; an
answer that still runs past the budget (many long members) is cut off and escalates as before.

A request that must call a function (`tool_choice` `required` or a named function) is decoded
under the grammar of one call (`router.structured.tools.forced_call_schema`): the function's name and, for a
`strict` function, arguments valid for its schema. `request_grammar` picks what a request gets.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

from router.errors import RequestError
from router.generation import GenerationRequest, ResponseFormat
from router.structured import grammar_bound, tools

MAX_SCHEMA_BYTES = 32_000  # compact JSON; OpenAI's own structured-output limits are of this order
MAX_SCHEMA_DEPTH = 24  # nested objects and arrays in the schema document itself
MAX_PATTERN_CHARS = 500
MAX_GRAMMAR_CHARS = 256_000  # the GBNF handed to llama.cpp
MAX_GRAMMAR_REPEAT = 64  # a length or count bound above this is left to the verifier
GRAMMAR_CACHE = 128
CHECK_CACHE = 512  # schemas whose check's outcome is remembered (by digest: a few hundred bytes each)
MAX_REQUEST_SCHEMA_BYTES = 262_144  # one request's schemas together: response_format's and its tools'
PARAM = "response_format"

# enforced by the grammar
_SUBSCHEMA_MAPS = {"properties", "$defs", "definitions"}
_SUBSCHEMA_LISTS = {"anyOf", "oneOf", "allOf", "prefixItems"}
_BOUNDS = {"minLength", "maxLength", "minItems", "maxItems"}
_ENFORCED = {
    "type",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "$ref",
    "pattern",
    "format",
    *_SUBSCHEMA_MAPS,
    *_SUBSCHEMA_LISTS,
    *_BOUNDS,
}
# checked on the answer by the format verifier, not by the grammar
_VALIDATED = {
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "uniqueItems",
    "minProperties",
    "maxProperties",
}
_ANNOTATIONS = {
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "readOnly",
    "writeOnly",
    "deprecated",
    "contentEncoding",
    "contentMediaType",
    "discriminator",  # OpenAPI's, emitted by pydantic for tagged unions; the union itself is enforced
}
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


class _Checked:
    """Outcomes of schema checks, by the digest of the schema's compact JSON (order kept), for
    any thread: a check costs up to half a second of CPU (the meta-schema validation of a 30 KB
    schema), and clients send the same schemas again and again. Bounded, least recently used out."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._outcomes: OrderedDict[bytes, Any] = OrderedDict()

    @staticmethod
    def key(schema: Any) -> bytes:
        text = schema if isinstance(schema, str) else schema_key(schema)  # order kept: the grammar's
        return hashlib.sha256(text.encode()).digest()

    def get(self, key: bytes) -> Any:
        with self._lock:
            if key in self._outcomes:
                self._outcomes.move_to_end(key)
            return self._outcomes.get(key, _UNKNOWN)

    def put(self, key: bytes, outcome: Any) -> None:
        with self._lock:
            self._outcomes[key] = outcome
            while len(self._outcomes) > self.size:
                self._outcomes.popitem(last=False)


_UNKNOWN = object()
_CHECKED = _Checked(CHECK_CACHE)
Verdict = tuple[str, str | None] | None  # a check's outcome: None, or the refusal's message and code
# verdicts made elsewhere (a worker process) for the request being made typed in this context:
# kept apart from the shared cache, which other requests' schemas may evict in the meantime
_PINNED: ContextVar[dict[bytes, Verdict] | None] = ContextVar("pinned_schema_verdicts", default=None)


def schema_verdict(schema: Any) -> Verdict:
    """`check_schema`'s outcome for `schema`, computed afresh and returned rather than raised (for
    a worker process: router.api.schema_checks)."""
    try:
        _check_schema(schema)
        return None
    except RequestError as exc:
        return str(exc), exc.code
    except RecursionError:  # nesting past what the checks themselves can walk
        return "the JSON schema nests too deeply to check", None


@contextmanager
def pinned(verdicts: list[tuple[Any, Verdict]]) -> Iterator[None]:
    """Within the block, `check_schema` takes these (schema, verdict) pairs as its outcomes, and the
    shared cache remembers them for later requests."""
    table = {}
    for schema, verdict in verdicts:
        key = _Checked.key(schema)
        _CHECKED.put(key, verdict)
        table[key] = verdict
    token = _PINNED.set(table)
    try:
        yield
    finally:
        _PINNED.reset(token)


def schema_known(schema: Any) -> bool:
    """Whether `check_schema(schema)` has run before: its outcome is then a look-up, cheap enough
    for the event loop. `schema` may be given as its compact JSON (`schema_key`'s)."""
    try:
        return _CHECKED.get(_Checked.key(schema)) is not _UNKNOWN
    except (TypeError, ValueError, RecursionError, RequestError):
        return False  # not JSON, or too deep to encode: the check itself says so


def check_schema(schema: Any, param: str = PARAM, *, text: str | None = None) -> None:
    """Refuse (RequestError, 400, naming `param`) a schema too large, too deep, using a construct
    the grammar cannot honour, or whose grammar could cost too much to decode under; the message
    names the construct and where it is. Every schema a client sends goes through it: a
    response_format's and each function's parameters. Blocking (up to about a second for a large
    new schema; outcomes are remembered): the API runs it off the event loop. `text`: the
    schema's compact JSON (`schema_key`'s) when the caller has it, which spares encoding it again."""
    key = _Checked.key(schema if text is None else text)
    table = _PINNED.get()
    outcome = table[key] if table is not None and key in table else _CHECKED.get(key)
    if outcome is _UNKNOWN:
        outcome = schema_verdict(schema)
        _CHECKED.put(key, outcome)
    if outcome is not None:
        message, code = outcome
        raise RequestError(message, param=param, code=code)


def check_schema_bytes(schemas: list[Any], param: str) -> None:
    """Refuse a request whose schemas (each a schema, or its compact JSON) together pass
    MAX_REQUEST_SCHEMA_BYTES: each is checked (and its grammar built) on the service's CPU, and
    per-schema caps alone let one request carry a hundred of them."""
    try:
        total = sum(len((s if isinstance(s, str) else schema_key(s)).encode()) for s in schemas)
    except RequestError as exc:  # nested past what the encoder can walk
        raise RequestError(str(exc), param=param) from None
    if total > MAX_REQUEST_SCHEMA_BYTES:
        raise RequestError(
            f"the request's JSON schemas (response_format's and every tool's parameters, as compact JSON) "
            f"are {total} bytes together; at most {MAX_REQUEST_SCHEMA_BYTES} are accepted",
            param=param,
        )


def _check_schema(schema: Any) -> None:
    if not isinstance(schema, dict):
        raise RequestError("a JSON schema must be a JSON object", param=PARAM)
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_SCHEMA_BYTES:
        raise RequestError(f"the JSON schema is {size} bytes; at most {MAX_SCHEMA_BYTES} are accepted", param=PARAM)
    _check_depth(schema, 0)
    _check_node(schema, "#")
    grammar_bound.plan(_root_dereferenced(_loosened(schema)))  # before the slower meta-schema check
    import jsonschema  # the format verifier validates answers against it: it must be a valid schema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise RequestError(f"not a valid JSON schema at '#/{where}': {exc.message}"[:500], param=PARAM) from None


def loosened_tool_schema(schema: Any, param: str) -> tuple[dict[str, Any], list[str]]:
    """A non-strict function's parameters as this service enforces and validates them
    (`loosened_form`), then `check_schema`'s checks, so what stays is as safe as a strict schema.
    Returns it and where the keywords were dropped."""
    loose, dropped = loosened_form(schema, param)
    check_schema(loose, param)  # remembered by the loosened schema: a repeat costs the loosening alone
    return loose, dropped


def loosened_form(schema: Any, param: str) -> tuple[dict[str, Any], list[str]]:
    """The schema with each keyword the grammar cannot honour taken out (and `true`/`false`
    subschemas made `{}`), so it accepts at least what the client's accepts, and where the
    keywords were dropped; not yet checked (`check_schema`). RequestError (400, naming `param`)
    for a schema that is not an object or nests too deeply. It keeps the client's key order."""
    if not isinstance(schema, dict):
        raise RequestError("a JSON schema must be a JSON object", param=param)
    try:
        _check_depth(schema, 0)  # the client's schema is rendered into the prompt whole
    except RequestError as exc:
        raise RequestError(str(exc), param=param) from None
    dropped: list[str] = []
    return _loosen_node(schema, "#", dropped), dropped


def _loosen_node(node: Any, where: str, dropped: list[str]) -> Any:
    if isinstance(node, bool):
        dropped.append(where)
        return {}
    if not isinstance(node, dict):
        return node  # not a schema: check_schema refuses it with its place
    out: dict[str, Any] = {}
    for key, value in node.items():
        at = f"{where}/{key}"
        if key in _ANNOTATIONS or key in _VALIDATED:
            out[key] = value
        elif key not in _ENFORCED:
            dropped.append(at)  # its value is never read: a hidden remote $ref inside `not` goes with it
        elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _loosen_node(sub, f"{at}/{name}", dropped) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            parts = [_loosen_node(sub, f"{at}/{i}", dropped) for i, sub in enumerate(value)]
            if key == "allOf" and any(not _is_object_part(p) for p in parts):
                dropped.append(at)  # the grammar merges allOf only over objects
                continue
            out[key] = parts
        elif key == "items" and isinstance(value, list):
            out[key] = [_loosen_node(sub, f"{at}/{i}", dropped) for i, sub in enumerate(value)]
        elif key in ("items", "additionalProperties") and not isinstance(value, bool):
            out[key] = _loosen_node(value, at, dropped)
        else:
            out[key] = value
    return out


def _check_depth(value: Any, depth: int) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise RequestError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels", param=PARAM)
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        _check_depth(child, depth + 1)


def _refuse(where: str, what: str) -> RequestError:
    return RequestError(f"JSON schema at '{where}': {what}"[:500], param=PARAM)


def _check_node(node: Any, where: str) -> None:
    if isinstance(node, bool):  # `true` / `false` as a schema: JSON Schema allows them, the converter does not
        raise _refuse(where, "boolean schemas are not supported; use {} for any value")
    if not isinstance(node, dict):
        raise _refuse(where, "a schema must be a JSON object")
    for key, value in node.items():
        at = f"{where}/{key}"
        if key in _ANNOTATIONS or key in _VALIDATED:
            continue
        if key not in _ENFORCED:
            raise _refuse(where, f"keyword {key[:64]!r} is not supported by constrained decoding")
        if key in _SUBSCHEMA_MAPS:
            if not isinstance(value, dict):
                raise _refuse(at, "must be an object of schemas")
            for name, sub in value.items():
                _check_node(sub, f"{at}/{name}")
        elif key in _SUBSCHEMA_LISTS:
            if not isinstance(value, list) or not value:
                raise _refuse(at, "must be a non-empty array of schemas")
            for i, sub in enumerate(value):
                _check_node(sub, f"{at}/{i}")
            if key == "allOf" and any(not _is_object_part(sub) for sub in value):
                raise _refuse(at, "allOf is supported only over object schemas (properties, or a $ref to them)")
        elif key == "items":
            if isinstance(value, list):
                for i, sub in enumerate(value):
                    _check_node(sub, f"{at}/{i}")
            else:
                _check_node(value, at)
        elif key == "additionalProperties":
            if not isinstance(value, bool):
                _check_node(value, at)
        elif key == "type":
            kinds = value if isinstance(value, list) else [value]
            if not kinds or any(not isinstance(k, str) or k not in _TYPES for k in kinds):
                raise _refuse(at, f"type must be one of {sorted(_TYPES)} or a list of them")
        elif key == "required":
            if not isinstance(value, list) or any(not isinstance(r, str) for r in value):
                raise _refuse(at, "must be an array of property names")
        elif key == "enum":
            if not isinstance(value, list) or not value:
                raise _refuse(at, "must be a non-empty array")
        elif key == "$ref":
            if not isinstance(value, str) or not value.startswith("#/"):
                raise _refuse(at, "only local references ('#/$defs/...') are supported")
        elif key == "pattern":
            if not isinstance(value, str) or len(value) > MAX_PATTERN_CHARS:
                raise _refuse(at, f"must be a string of at most {MAX_PATTERN_CHARS} characters")
            # the converter writes `x{n}` out as n copies of x, nested repetitions multiplied
            if any(len(n) > 3 or int(n) > MAX_GRAMMAR_REPEAT for m in _REPEAT.finditer(value) for n in m.groups() if n):
                raise _refuse(at, f"a pattern may repeat at most {MAX_GRAMMAR_REPEAT} times (x{{n,m}})")
        elif key == "format":
            if not isinstance(value, str):
                raise _refuse(at, "must be a string")
        elif key in _BOUNDS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _refuse(at, "must be a non-negative integer")


def _is_object_part(node: Any) -> bool:
    return isinstance(node, dict) and ("properties" in node or "$ref" in node or "anyOf" in node)


def _loosened(node: Any) -> Any:
    """The schema with what the grammar leaves to the verifier taken out: bounds too large to
    expand into grammar rules."""
    if isinstance(node, dict):
        out = {k: _loosened(v) for k, v in node.items()}
        if any(isinstance(out.get(b), int) and out[b] > MAX_GRAMMAR_REPEAT for b in _BOUNDS):
            for b in _BOUNDS:
                out.pop(b, None)
        return out
    if isinstance(node, list):
        return [_loosened(v) for v in node]
    return node


def _without_patterns(node: Any, dropped: frozenset[str]) -> Any:
    """The schema without the patterns in `dropped`, read as a schema (a property named "pattern",
    or a const holding one, is not a pattern)."""
    if not dropped or not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "pattern" and isinstance(value, str) and value in dropped:
            continue
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            value = {name: _without_patterns(sub, dropped) for name, sub in value.items()}
        elif (key in _SUBSCHEMA_LISTS or key == "items") and isinstance(value, list):
            value = [_without_patterns(sub, dropped) for sub in value]
        elif key in ("items", "additionalProperties"):
            value = _without_patterns(value, dropped)
        out[key] = value
    return out


def schema_key(schema: dict[str, Any]) -> str:
    """The cache key of a schema: its compact JSON, property order kept. RequestError (400) for
    a schema nested past what the encoder can walk: the request bodies bound a schema's depth as
    they read it, and this keeps a path that missed that bound from being a 500."""
    try:
        return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    except RecursionError:
        raise RequestError("the JSON schema nests too deeply to encode", param=PARAM) from None


def grammar_source(request: GenerationRequest) -> str:
    """The parameter `request_grammar`'s grammar is made from, as chat names it (a surface renames
    it): the one function a forced call allows (`tools.N.function.parameters`), `tools` when it
    allows several, else `response_format`. A refusal of that grammar names it."""
    if tools.forced_call_schema(request) is None:
        return PARAM
    names = {t.name for t in tools.allowed_tools(request)}
    allowed = [i for i, t in enumerate(request.tools) if t.name in names]
    return f"tools.{allowed[0]}.function.parameters" if len(allowed) == 1 else "tools"


def request_grammar(request: GenerationRequest) -> str | None:
    """The GBNF a local tier decodes `request` under, None for free text: a call the request
    forces, else its response_format. RequestError (400) when a schema cannot be made one,
    naming its source (`grammar_source`)."""
    call = tools.forced_call_schema(request)
    if call is not None:
        try:
            return _compile(schema_key(call))  # the functions' schemas were checked with the request
        except RequestError as exc:  # the forced call's grammar: named by the functions it is made of
            raise RequestError(str(exc), param=grammar_source(request), code=exc.code) from None
    if request.response_format is None:
        return None
    return grammar_for(request.response_format, request.max_tokens)


def grammar_for(fmt: ResponseFormat, max_tokens: int = 256) -> str:
    """The GBNF that constrains an answer to `fmt` (cached); JSON mode's is bounded by the
    answer's `max_tokens`. RequestError (400) when the schema cannot be turned into one."""
    if fmt.kind == "json_object" or fmt.schema is None:
        return json_object_grammar(max_tokens)  # OpenAI's JSON mode answers an object
    check_schema(fmt.schema)
    return _compile(schema_key(fmt.schema))


JSON_DEPTH = 4  # objects and arrays nested in a JSON-mode answer, the outer object included
MAX_KEY_CHARS = 64


def json_object_bounds(max_tokens: int) -> tuple[int, int]:
    """(characters per string, items per array or object) for a JSON-mode answer of at most
    `max_tokens`: one string can take about half the budget (prose runs near four characters a
    token), one container a sixteenth of it in items, so a loop closes long before the cut-off."""
    return min(max(2 * max_tokens, 16), 4096), min(max(max_tokens // 16, 4), 64)


def json_object_grammar(max_tokens: int) -> str:
    """JSON mode's grammar: any JSON object, within `json_object_bounds(max_tokens)` (cached per bound)."""
    return _bounded_object(*json_object_bounds(max_tokens))


@lru_cache(maxsize=GRAMMAR_CACHE)
def _bounded_object(chars: int, items: int) -> str:
    rules = [
        "root ::= obj" + str(JSON_DEPTH),
        f'key ::= "\\"" char{{0,{MAX_KEY_CHARS}}} "\\"" space',
        f'string ::= "\\"" char{{0,{chars}}} "\\"" space',
        f'char ::= {_JSON_CHAR} | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{{4}})',
        'number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? space',
        'scalar ::= string | number | ("true" | "false" | "null") space',
        'space ::= " "?',
    ]
    more = items - 1
    for level in range(1, JSON_DEPTH + 1):
        inner = "scalar" if level == 1 else f"val{level - 1}"
        rules += [
            f'obj{level} ::= "{{" space (kv{level} ("," space kv{level}){{0,{more}}})? "}}" space',
            f'kv{level} ::= key ":" space {inner}',
        ]
        if level < JSON_DEPTH:  # the outer level is the answer's object, never an array
            rules.append(f'arr{level} ::= "[" space ({inner} ("," space {inner}){{0,{more}}})? "]" space')
            rules.append(f"val{level} ::= obj{level} | arr{level} | scalar")
    return "\n".join(rules) + "\n"


def _root_dereferenced(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with a root `$ref` (pydantic writes one for a recursive model) replaced by what
    it points to, `$defs` kept: the converter resolves references only outside a node that is
    itself a reference, so the definitions beside a root `$ref` would stay unresolved."""
    seen: set[str] = set()
    while isinstance(ref := schema.get("$ref"), str):
        if ref in seen:
            raise RequestError(f"the JSON schema's $ref {ref[:100]!r} refers back to itself", param=PARAM)
        seen.add(ref)
        target: Any = schema
        for part in ref[2:].split("/"):
            if not isinstance(target, dict) or part not in target:
                raise RequestError(f"the JSON schema's $ref {ref[:100]!r} points to nothing", param=PARAM)
            target = target[part]
        if not isinstance(target, dict):
            raise RequestError(f"the JSON schema's $ref {ref[:100]!r} points to a non-schema", param=PARAM)
        defs: dict[str, Any] = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
        schema = {**{k: v for k, v in target.items() if k not in defs}, **defs}
    return schema


# The converter's string character (`[^"\\]`) lets raw control characters into a string, which
# JSON forbids (a model that writes a newline inside a string makes unparseable JSON); llama.cpp's
# own converter excludes them, as this does.
_LOOSE_CHAR = '[^"\\\\]'
_JSON_CHAR = '[^"\\\\\\x7F\\x00-\\x1F]'


@lru_cache(maxsize=GRAMMAR_CACHE)
def _compile(key: str) -> str:
    schema = _root_dereferenced(_loosened(copy.deepcopy(json.loads(key))))
    # patterns whose grammar could be costly to decode under are left to the format verifier
    plan = grammar_bound.plan(schema)
    schema = _without_patterns(schema, plan.dropped)
    gbnf = _converted(schema)  # a pattern the bound could not read is refused here, in the converter's words
    if plan.unreadable:  # or, where the converter read it after all, left out: its cost is unknown
        gbnf = _converted(_without_patterns(schema, plan.unreadable))
    gbnf = gbnf.replace(_LOOSE_CHAR, _JSON_CHAR)
    if len(gbnf) > MAX_GRAMMAR_CHARS:
        raise RequestError(
            f"the JSON schema makes a grammar of {len(gbnf)} characters; at most {MAX_GRAMMAR_CHARS}", param=PARAM
        )
    return gbnf


def _converted(schema: dict[str, Any]) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        gbnf: str = json_schema_to_gbnf(json.dumps(schema))
    except RecursionError:
        raise RequestError("the JSON schema's references nest too deeply", param=PARAM) from None
    except KeyError as exc:
        raise RequestError(f"the JSON schema's $ref {exc} cannot be resolved", param=PARAM) from None
    except (ValueError, AssertionError, TypeError, AttributeError, IndexError) as exc:
        # the converter's own words name the construct (an unsupported pattern, an unresolvable $ref)
        raise RequestError(f"the JSON schema cannot be turned into a grammar: {exc}"[:500], param=PARAM) from None
    return gbnf
