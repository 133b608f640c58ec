"""The one JSON Schema check of answers against a client's schema: a `response_format` schema
(the `format` verifier) and a function's parameters (the `tool_call` verifier) alike.

Both schemas come from the client, so both were read before any model saw them by
`router.structured.grammars.check_schema` (size, depth, only local `$ref`s, only keywords constrained
decoding and validation honour, a valid JSON Schema): what reaches this module is a schema the
`jsonschema` library can validate against without fetching anything. One thing stays hostile: a
`pattern` runs against text a model wrote (or an upstream sent), and Python's backtracking `re`
takes exponential time on patterns such as ^(a+)+$. Patterns run under the `regex` package with
a time limit instead, and at most `MAX_ERRORS_READ` errors are read, so one answer costs at most
about `MAX_ERRORS_READ * PATTERN_TIMEOUT_S` of pattern checks; a check that runs out of time fails
the answer. Callers on the event loop run it in a worker thread (regex releases the GIL).

Validators are cached per schema (its compact JSON): a cascade checks the same schema at every
tier, and an agent sends the same tools with every turn.
"""

from __future__ import annotations

import itertools
import json
from functools import lru_cache
from typing import Any

import regex

from router.structured.grammars import GRAMMAR_CACHE, schema_key

PATTERN_TIMEOUT_S = 0.05
MAX_ERRORS_READ = 8


def first_error(schema: dict[str, Any], value: Any) -> str | None:
    """Why `value` does not match `schema` (the most relevant error, as jsonschema ranks the
    first few, with where it is), or None when it does. Blocking: patterns may run."""
    import jsonschema

    try:
        errors = _validator(schema_key(schema)).iter_errors(value)
        error = jsonschema.exceptions.best_match(itertools.islice(errors, MAX_ERRORS_READ))
    except Exception as exc:  # noqa: BLE001 - a schema that skipped check_schema (made in code) fails, never crashes
        return f"the schema cannot be applied: {type(exc).__name__}: {exc}"[:300]
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"at '/{where}': {error.message}" if where else error.message


def _bounded_pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Any:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "string") or not isinstance(pattern, str):
        return
    try:
        found = regex.search(pattern, instance, timeout=PATTERN_TIMEOUT_S, concurrent=True)
    except TimeoutError:
        yield ValidationError(f"the pattern {pattern[:60]!r} took too long to check")
        return
    except regex.error:
        yield ValidationError(f"the pattern {pattern[:60]!r} does not compile")
        return
    if found is None:
        yield ValidationError(f"{instance[:60]!r} does not match {pattern[:60]!r}")


@lru_cache(maxsize=GRAMMAR_CACHE)
def _validator(key: str) -> Any:
    import jsonschema

    schema = json.loads(key)
    base = jsonschema.validators.validator_for(schema)
    bounded = jsonschema.validators.extend(base, {"pattern": _bounded_pattern})  # type: ignore[no-untyped-call]
    return bounded(schema)
