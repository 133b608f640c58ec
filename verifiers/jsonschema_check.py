"""A small JSON Schema checker for the subset function signatures use.

Tool parameters come from the client, so their schema is untrusted input: it is checked here by a
walk that knows `type`, `enum`, `const`, `properties`, `required`, `additionalProperties`,
`items`, `anyOf`/`oneOf`/`allOf`, and the length and range bounds, and ignores every other keyword
(a `$ref`, a `pattern`) rather than following it. Nothing is fetched, no regex is compiled, and the
walk stops at a fixed depth, so a hostile schema costs no more than its size (which the API caps).
Ignoring a keyword makes the check more lenient, never a crash: an answer it passes may still
break a keyword it does not read.

`verifiers/format.py` checks whole answers against a `response_format` schema with the
`jsonschema` library; the two could share one checker once both exist (the integrator's call).
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 64

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
}


def first_error(schema: Any, value: Any) -> str | None:
    """Why `value` does not match `schema`, or None when it does (as far as the subset reads)."""
    return _check(schema, value, "", 0)


def _check(schema: Any, value: Any, at: str, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        return f"at '{at or '/'}': nested deeper than {MAX_DEPTH} levels"
    if schema is False:
        return f"at '{at or '/'}': no value is allowed here"
    if not isinstance(schema, dict):
        return None  # `true`, or a schema too odd to read: allows anything
    where = at or "/"
    kind = schema.get("type")
    listed = kind if isinstance(kind, list) else [kind]
    known = [k for k in listed if isinstance(k, str) and k in _TYPES]
    if known and not any(_TYPES[k](value) for k in known):
        return f"at '{where}': {_name(value)} is not of type {' or '.join(known)}"
    if "const" in schema and not _same(value, schema["const"]):
        return f"at '{where}': must be {schema['const']!r}"
    enum = schema.get("enum")
    if isinstance(enum, list) and not any(_same(value, option) for option in enum):
        return f"at '{where}': {_short(value)} is not one of {enum[:10]!r}"
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options and all(_check(o, value, at, depth + 1) for o in options):
            return f"at '{where}': matches none of the {key} options"
    for option in schema.get("allOf", ()) if isinstance(schema.get("allOf"), list) else ():
        error = _check(option, value, at, depth + 1)
        if error:
            return error
    if isinstance(value, dict):
        return _object(schema, value, at, depth)
    if isinstance(value, list):
        return _array(schema, value, at, depth)
    if isinstance(value, str):
        return _bounds(schema, len(value), "minLength", "maxLength", where, "characters")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = _bound(schema, "minimum"), _bound(schema, "maximum")
        if low is not None and value < low:
            return f"at '{where}': {value} is less than the minimum {low}"
        if high is not None and value > high:
            return f"at '{where}': {value} is more than the maximum {high}"
    return None


def _object(schema: dict[str, Any], value: dict[str, Any], at: str, depth: int) -> str | None:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    for key in required if isinstance(required, list) else ():
        if isinstance(key, str) and key not in value:
            return f"at '{at or '/'}': missing required property {key!r}"
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            error = _check(properties[key], item, f"{at}/{key}", depth + 1)
        elif extra is False:
            return f"at '{at or '/'}': property {key[:64]!r} is not allowed"
        else:
            error = _check(extra, item, f"{at}/{key}", depth + 1)
        if error:
            return error
    return None


def _array(schema: dict[str, Any], value: list[Any], at: str, depth: int) -> str | None:
    error = _bounds(schema, len(value), "minItems", "maxItems", at or "/", "items")
    if error:
        return error
    items = schema.get("items")
    if isinstance(items, (dict, bool)):
        for i, item in enumerate(value):
            error = _check(items, item, f"{at}/{i}", depth + 1)
            if error:
                return error
    return None


def _bounds(schema: dict[str, Any], size: int, low_key: str, high_key: str, where: str, unit: str) -> str | None:
    low, high = _bound(schema, low_key), _bound(schema, high_key)
    if low is not None and size < low:
        return f"at '{where}': fewer than {low} {unit}"
    if high is not None and size > high:
        return f"at '{where}': more than {high} {unit}"
    return None


def _bound(schema: dict[str, Any], key: str) -> float | None:
    v = schema.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _same(a: Any, b: Any) -> bool:
    # JSON equality: true is not 1
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."
