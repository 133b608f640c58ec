"""Structured outputs: extract a short text into JSON that follows a given schema.

Much of the traffic a router sees asks for structure (`response_format` with a JSON schema), and
an answer there is right only when it is the object the caller wanted, field for field. The items
(``evals/data/structured.jsonl``, 60 of them, written for this project: receipts, short bios,
event announcements, product and property listings, job posts, recipes, bookings, appointments,
book notes, forecasts, support tickets) each pair a text with a schema (nested objects, arrays,
enums, numbers, optional fields) and the reference object.

Each item is asked as a chat request whose message holds the schema and the text, and whose
request carries the schema as a `response_format` (see `_with_response_format`), so a tier that
constrains decoding to a schema does so here as it would for a caller.

Grading is exact match after normalisation, with a per-field account in the grade's detail:

- the answer is parsed as JSON (a Markdown code fence around it is allowed; anything else is
  invalid, and so is an answer cut off by `max_tokens`);
- objects compare by key, in any order; a key whose value is null or empty (`""`, `[]`, `{}`)
  counts as absent (optional fields are left out of the references);
- numbers compare as numbers (2 equals 2.0; relative tolerance 1e-9), and a boolean is not a number;
- strings are trimmed and their runs of whitespace collapsed; they are case-folded only at the
  free-text paths the item lists in ``fold`` (a name written in capitals on a receipt, a skill);
  enum values, codes and dates compare exactly;
- arrays compare element by element, in order (the order the text gives them).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from evals.data import read_jsonl
from evals.grading import Grade
from evals.suites.base import AnswerKey, Item, Suite
from router.errors import ConfigError
from router.generation import GenerationRequest, Message, ResponseFormat

DATA = Path(__file__).resolve().parents[1] / "data" / "structured.jsonl"

PROMPT = (
    "Extract the information in the text below as a JSON object that follows this JSON schema. "
    "Reply with the JSON object only. Leave out optional fields the text does not give.\n\n"
    "Schema:\n{schema}\n\nText:\n{text}"
)


def _with_response_format(
    request: GenerationRequest, schema: dict[str, Any], name: str = "extraction"
) -> GenerationRequest:
    """The request asking for `schema` as OpenAI's `response_format` would (strict, as
    `client.beta.chat.completions.parse` sends it); the metadata names the format's type as the
    API's does, which is what `router.tasks` reads to label the request `structured`."""
    return request.with_(
        response_format=ResponseFormat("json_schema", schema, name, True),
        metadata={**request.metadata, "response_format": "json_schema"},
    )


class Structured(Suite):
    name = "structured"
    task = "structured"
    max_tokens = 384
    version = "2"  # 2: an empty string, list or object counts as absent, as null did
    source = "tierroute's own JSON-schema extraction items, 60 (evals/data/structured.jsonl)"

    def __init__(self, path: Path = DATA) -> None:
        self.path = path
        self._schemas: dict[str, tuple[str, dict[str, Any]]] = {}

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        items = []
        for n, row in enumerate(read_jsonl(self.path), 1):
            try:
                schema, text, domain = row["schema"], row["text"], row["domain"]
                prompt = PROMPT.format(schema=json.dumps(schema, ensure_ascii=False), text=text)
                item = Item(
                    id=str(row["id"]),
                    messages=(Message("user", prompt),),
                    answer_key=AnswerKey(reference={"object": row["reference"], "fold": list(row.get("fold", []))}),
                    group=str(domain),
                )
            except (KeyError, TypeError) as exc:
                raise ConfigError(f"{self.path} item {n}: {exc}") from None
            self._schemas[item.id] = (f"extract_{domain}", schema)
            items.append(item)
        return items

    def request(self, item: Item, request: GenerationRequest) -> GenerationRequest:
        if not self._schemas:
            self.load()
        name, schema = self._schemas[item.id]
        return _with_response_format(request, schema, name)

    async def grade(self, item: Item, text: str) -> Grade:
        ref = item.answer_key.reference
        return grade_structured(text, ref["object"], ref["fold"])


def parse_json_answer(text: str) -> Any:
    """The JSON value an answer holds (a code fence around it allowed), or raise ValueError."""
    body = text.strip()
    if body.startswith("```"):
        first, _, rest = body.partition("\n")
        if not rest.rstrip().endswith("```"):
            raise ValueError("an unclosed code fence")
        body = rest.rstrip()[:-3]
    try:
        return json.loads(body, parse_constant=_refuse)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def normalise(value: Any, fold: frozenset[str], path: str = "") -> Any:
    """A value in the form two equal answers share (see the module docstring)."""
    if isinstance(value, dict):
        return {k: normalise(v, fold, f"{path}.{k}" if path else k) for k, v in sorted(value.items()) if not _empty(v)}
    if isinstance(value, list):
        return [normalise(v, fold, f"{path}[]") for v in value]
    if isinstance(value, str):
        s = " ".join(value.split())
        return s.casefold() if path in fold else s
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return _Number(float(value))
    return value


def _empty(value: Any) -> bool:
    """Nothing given: null, an empty string, list or object. An answer that writes `"awards": []`
    says what a reference that leaves the field out says."""
    return value is None or (
        isinstance(value, str | list | dict) and not (value.strip() if isinstance(value, str) else value)
    )


class _Number(float):
    """A JSON number: equal to another within a relative 1e-9, never to a boolean."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Number) and math.isclose(self, other, rel_tol=1e-9, abs_tol=1e-12)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = float.__hash__


def grade_structured(text: str, reference: dict[str, Any], fold: list[str]) -> Grade:
    try:
        got = parse_json_answer(text)
    except ValueError as exc:
        return Grade(False, text.strip()[:200], f"not JSON: {exc}")
    folded = frozenset(fold)
    want = normalise(reference, folded)
    have = normalise(got, folded)
    if not isinstance(have, dict):
        return Grade(False, text.strip()[:200], f"not a JSON object but {type(got).__name__}")
    fields = sorted(set(want) | set(have))
    wrong = [k for k in fields if want.get(k) != have.get(k)]
    detail = f"fields {len(fields) - len(wrong)}/{len(fields)} right" + (
        f"; wrong: {', '.join(wrong)}" if wrong else ""
    )
    return Grade(not wrong, json.dumps(got, ensure_ascii=False)[:200], detail)
