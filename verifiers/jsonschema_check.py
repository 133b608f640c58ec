"""The one JSON Schema check of answers against a client's schema: a `response_format` schema
(the `format` verifier) and a function's parameters (the `tool_call` verifier) alike.

Both schemas come from the client, so both were read before any model saw them by
`router.structured.grammars.check_schema` (size, depth, only local `$ref`s, only keywords constrained
decoding and validation honour, a valid JSON Schema): what reaches this module is a schema the
`jsonschema` library can validate against without fetching anything. One thing stays hostile: a
`pattern` runs against text a model wrote (or an upstream sent), and Python's backtracking `re`
takes exponential time on patterns such as ^(a+)+$. Patterns run under the `regex` package with
a time limit instead (`PATTERN_TIMEOUT_S` each), and a check that runs out of time fails the
answer. A limit per search does not bound an answer: a slow pattern that still *matches* (a few
tens of milliseconds each) yields no error, and an array of a thousand such strings took tens of
seconds. So the pattern checks of one answer share one budget (`PatternBudget`, `PATTERN_BUDGET_S`
of wall time, every tool call of one answer included): each search may take at most what is
left of it, and once it is spent every further pattern check fails the answer at once. regex
checks its limit coarsely (a 0.05 s limit was seen to end after 0.19 s), so an answer's pattern
time is at most the budget and one search's overrun. At most `MAX_ERRORS_READ` errors are read.
Callers on the event loop run it in a worker thread (regex releases the GIL).

Validators are cached per schema (its compact JSON): a cascade checks the same schema at every
tier, and an agent sends the same tools with every turn.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

import regex

from router.structured.grammars import GRAMMAR_CACHE, schema_key

PATTERN_TIMEOUT_S = 0.05
PATTERN_BUDGET_S = 0.5
MAX_ERRORS_READ = 8


class PatternBudget:
    """The wall time the pattern checks of one answer may still take. One per answer: a verifier
    that checks several values of one answer (each tool call's arguments) passes the same one."""

    def __init__(self, seconds: float = PATTERN_BUDGET_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.left = seconds
        self.searches = 0
        self._clock = clock

    def search(self, pattern: str, text: str) -> Any:
        """`regex.search` within what is left; TimeoutError when it runs out (or already has)."""
        if self.left <= 0:
            raise TimeoutError
        self.searches += 1
        start = self._clock()
        try:
            return regex.search(pattern, text, timeout=min(PATTERN_TIMEOUT_S, self.left), concurrent=True)
        finally:
            self.left -= self._clock() - start


# the budget of the answer being checked: the cached validator is shared, the budget is per call
_BUDGET: ContextVar[PatternBudget | None] = ContextVar("pattern_budget", default=None)


def first_error(schema: dict[str, Any], value: Any, budget: PatternBudget | None = None) -> str | None:
    """Why `value` does not match `schema` (the most relevant error, as jsonschema ranks the
    first few, with where it is), or None when it does. Blocking: patterns may run, within
    `budget` (a fresh `PATTERN_BUDGET_S` when None)."""
    import jsonschema

    token = _BUDGET.set(budget if budget is not None else PatternBudget())
    try:
        errors = _validator(schema_key(schema)).iter_errors(value)
        error = jsonschema.exceptions.best_match(itertools.islice(errors, MAX_ERRORS_READ))
    except Exception as exc:  # noqa: BLE001 - a schema that skipped check_schema (made in code) fails, never crashes
        return f"the schema cannot be applied: {type(exc).__name__}: {exc}"[:300]
    finally:
        _BUDGET.reset(token)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"at '/{where}': {error.message}" if where else error.message


def _bounded_pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Any:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "string") or not isinstance(pattern, str):
        return
    budget = _BUDGET.get() or PatternBudget()
    spent = budget.left <= 0
    try:
        found = budget.search(pattern, instance)
    except TimeoutError:
        if spent or budget.left <= 0:
            yield ValidationError("the answer's pattern checks took too long in all")
        else:
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
