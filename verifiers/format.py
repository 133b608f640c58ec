"""Whether the answer has the shape the caller asked for: a regex, JSON, a JSON Schema.

Two sources of a shape. The config's (`regex`, `json`, `json_schema` params): checks run in that
order and the first failure names itself in the reason; JSON may be the whole answer or sit in a
```json (or unlabelled) fenced block, the way chat models like to wrap it. And the request's own
`response_format`, checked whenever a request carries one: the whole answer must be JSON (the
client parses the message content as it is, fences and all), an object for `json_object`, valid
against the schema for `json_schema` (`verifiers.jsonschema_check`, the checker the `tool_call`
verifier uses too). The grammar a local tier decodes under enforces most of a
schema, not all of it (numeric bounds, `uniqueItems`, long length bounds: see `router.structured.grammars`),
and an answer cut off at `max_tokens` is unfinished JSON; both fail here, so they escalate.

With no params the verifier checks only the request's format, and abstains on a request without
one: it can sit in every policy at no cost to free-text traffic.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

from router.generation import Generation, GenerationRequest, ResponseFormat
from verifiers.base import Score, VerifierContext
from verifiers.extract import fenced_blocks
from verifiers.jsonschema_check import PatternBudget, first_error


def parse_json_answer(text: str) -> Any:
    """The JSON value of an answer: the whole text, else the first ```json / unlabelled fenced
    block that parses. Raises ValueError (json.JSONDecodeError) when there is none."""
    try:
        return _loads(text)
    except ValueError as exc:
        first_error = exc
    for block in fenced_blocks(text):
        if block.lang in ("json", "jsonc", ""):
            try:
                return _loads(block.body)
            except ValueError:
                continue
    raise first_error


def _loads(text: str) -> Any:
    """`json.loads`, with JSON nested past Python's recursion limit (a few hundred tokens of
    brackets, which a model can be asked to write) raised as the ValueError of any text that is
    not JSON, not as a RecursionError out of the verifier (a 500)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested deeper than the JSON reader can follow") from None


@dataclass(frozen=True)
class FormatVerifier:
    regex: str | None = None
    json: bool = False
    json_schema: dict[str, Any] | None = None
    name: str = "format"
    _pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

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
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        text = candidate.text
        passed: list[str] = []
        configured = self._pattern is not None or self.json or self.json_schema is not None
        budget = PatternBudget()  # one answer's pattern checks, the request's schema and the config's
        if request.response_format is not None:
            # off the event loop: a client schema's patterns run up to the budget
            asked = await asyncio.to_thread(_check_response_format, request.response_format, candidate, budget)
            if asked.value == 0.0 or not configured:
                return asked
            passed.append("response_format")
        elif not configured:
            return Score.abstain("the request asks for no response_format", details={"check": "response_format"})
        if self._pattern is not None:
            if self._pattern.search(text) is None:
                return Score(0.0, f"does not match regex {self.regex!r}", {"failed": "regex", "passed": passed})
            passed.append("regex")
        if self.json or self.json_schema is not None:
            try:
                value = parse_json_answer(text.strip())
            except ValueError as exc:
                return Score(0.0, f"not JSON: {exc}", {"failed": "json", "passed": passed})
            passed.append("json")
            if self.json_schema is not None:
                error = await asyncio.to_thread(first_error, self.json_schema, value, budget)
                if error is not None:
                    return Score(
                        0.0, f"JSON does not match the schema: {error}", {"failed": "json_schema", "passed": passed}
                    )
                passed.append("json_schema")
        return Score(1.0, "format ok: " + ", ".join(passed), {"passed": passed})


def _check_response_format(fmt: ResponseFormat, candidate: Generation, budget: PatternBudget) -> Score:
    details: dict[str, Any] = {"check": "response_format", "kind": fmt.kind}
    try:
        value = _loads(candidate.text)
    except ValueError as exc:
        cut = " (cut off at max_tokens)" if candidate.finish_reason == "length" else ""
        return Score(0.0, f"not JSON{cut}: {exc}", {**details, "failed": "json"})
    if fmt.kind == "json_object" and not isinstance(value, dict):
        return Score(0.0, f"JSON mode asks for an object, not {type(value).__name__}", {**details, "failed": "object"})
    if fmt.schema is not None:
        error = first_error(fmt.schema, value, budget)
        if error is not None:
            return Score(0.0, f"JSON does not match the request's schema: {error}", {**details, "failed": "schema"})
    return Score(1.0, f"answer is valid for the request's {fmt.kind}", details)


def make_format(params: dict[str, Any], ctx: VerifierContext) -> FormatVerifier:
    return FormatVerifier(**params)
