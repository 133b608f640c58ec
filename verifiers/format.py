"""Whether the answer has the shape the caller asked for: a regex, JSON, a JSON Schema.

Two sources of a shape. The config's (`regex`, `json`, `json_schema` params): checks run in that
order and the first failure names itself in the reason; JSON may be the whole answer or sit in a
```json (or unlabelled) fenced block, the way chat models like to wrap it. And the request's own
`response_format`, checked whenever a request carries one: the whole answer must be JSON (the
client parses the message content as it is, fences and all), an object for `json_object`, valid
against the schema for `json_schema`. The grammar a local tier decodes under enforces most of a
schema, not all of it (numeric bounds, `uniqueItems`, long length bounds: see `router.grammars`),
and an answer cut off at `max_tokens` is unfinished JSON; both fail here, so they escalate.

With no params the verifier checks only the request's format, and abstains on a request without
one: it can sit in every policy at no cost to free-text traffic.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import regex

from router.generation import Generation, GenerationRequest, ResponseFormat
from router.grammars import GRAMMAR_CACHE, schema_key
from verifiers.base import Score, VerifierContext
from verifiers.extract import fenced_blocks


def parse_json_answer(text: str) -> Any:
    """The JSON value of an answer: the whole text, else the first ```json / unlabelled fenced
    block that parses. Raises ValueError (json.JSONDecodeError) when there is none."""
    try:
        return json.loads(text)
    except ValueError as exc:
        first_error = exc
    for block in fenced_blocks(text):
        if block.lang in ("json", "jsonc", ""):
            try:
                return json.loads(block.body)
            except ValueError:
                continue
    raise first_error


@dataclass(frozen=True)
class FormatVerifier:
    regex: str | None = None
    json: bool = False
    json_schema: dict[str, Any] | None = None
    name: str = "format"
    _pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)
    _validator: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.json, bool):
            raise TypeError("json must be true or false")
        if self.regex is not None:
            if not isinstance(self.regex, str):
                raise TypeError("regex must be a string")
            try:
                object.__setattr__(self, "_pattern", re.compile(self.regex))
            except re.error as exc:
                raise ValueError(f"regex {self.regex!r} does not compile: {exc}") from None
        if self.json_schema is not None:
            if not isinstance(self.json_schema, dict):
                raise TypeError("json_schema must be a table (a JSON Schema object)")
            import jsonschema  # only configs that ask for schemas pay for the import

            cls = jsonschema.validators.validator_for(self.json_schema)
            try:
                cls.check_schema(self.json_schema)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"json_schema is not a valid schema: {exc.message}") from None
            object.__setattr__(self, "_validator", cls(self.json_schema))
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        text = candidate.text
        passed: list[str] = []
        configured = self._pattern is not None or self.json or self._validator is not None
        if request.response_format is not None:
            # off the event loop: a client schema's patterns may each take up to PATTERN_TIMEOUT_S
            asked = await asyncio.to_thread(_check_response_format, request.response_format, candidate)
            if asked.value == 0.0 or not configured:
                return asked
            passed.append("response_format")
        elif not configured:
            return Score.abstain("the request asks for no response_format", details={"check": "response_format"})
        if self._pattern is not None:
            if self._pattern.search(text) is None:
                return Score(0.0, f"does not match regex {self.regex!r}", {"failed": "regex", "passed": passed})
            passed.append("regex")
        if self.json or self._validator is not None:
            try:
                value = parse_json_answer(text.strip())
            except ValueError as exc:
                return Score(0.0, f"not JSON: {exc}", {"failed": "json", "passed": passed})
            passed.append("json")
            if self._validator is not None:
                error = _first_schema_error(self._validator, value)
                if error is not None:
                    return Score(
                        0.0, f"JSON does not match the schema: {error}", {"failed": "json_schema", "passed": passed}
                    )
                passed.append("json_schema")
        return Score(1.0, "format ok: " + ", ".join(passed), {"passed": passed})


def _check_response_format(fmt: ResponseFormat, candidate: Generation) -> Score:
    details: dict[str, Any] = {"check": "response_format", "kind": fmt.kind}
    try:
        value = json.loads(candidate.text)
    except ValueError as exc:
        cut = " (cut off at max_tokens)" if candidate.finish_reason == "length" else ""
        return Score(0.0, f"not JSON{cut}: {exc}", {**details, "failed": "json"})
    if fmt.kind == "json_object" and not isinstance(value, dict):
        return Score(0.0, f"JSON mode asks for an object, not {type(value).__name__}", {**details, "failed": "object"})
    if fmt.schema is not None:
        error = _first_schema_error(_request_validator(schema_key(fmt.schema)), value)
        if error is not None:
            return Score(0.0, f"JSON does not match the request's schema: {error}", {**details, "failed": "schema"})
    return Score(1.0, f"answer is valid for the request's {fmt.kind}", details)


# A request's schema is the client's, and its `pattern`s run against text a model wrote (or an
# upstream sent): with Python's backtracking `re`, a pattern such as ^(a+)+$ against "aaaa…a!"
# takes exponential time while holding the event loop. Client patterns run under the `regex`
# package with a time limit instead; a check that runs out of time fails the answer.
PATTERN_TIMEOUT_S = 0.05
MAX_ERRORS_READ = 8  # so one answer costs at most about 8 x PATTERN_TIMEOUT_S of pattern checks


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
def _request_validator(key: str) -> Any:
    """A validator per schema: a request's schema was checked when the request was read
    (router.grammars.check_schema), and a cascade scores the same schema at every tier. Its
    `pattern` keyword runs with a time limit (above)."""
    import jsonschema

    schema = json.loads(key)
    base = jsonschema.validators.validator_for(schema)
    bounded = jsonschema.validators.extend(base, {"pattern": _bounded_pattern})  # type: ignore[no-untyped-call]
    return bounded(schema)


def _first_schema_error(validator: Any, value: Any) -> str | None:
    # the most relevant error first, as jsonschema ranks them
    import jsonschema

    # the best of the first few: every further error may be another pattern run to its time limit
    error = jsonschema.exceptions.best_match(itertools.islice(validator.iter_errors(value), MAX_ERRORS_READ))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"at '/{where}': {error.message}" if where else error.message


def make_format(params: dict[str, Any], ctx: VerifierContext) -> FormatVerifier:
    return FormatVerifier(**params)
