"""The pieces an OpenAI request is made of (messages and their content, tools and calls,
response_format, our `tierroute` extension), each checked as it is read.

They live apart from the two request bodies (router.api.requests) because they are the bulk of
what a client can send and the place most of its hostility lands: a tool's schema is bounded in
depth and size before anything walks it, a message's content is text only, a call's id and
arguments are capped, and every field is strictly typed. Each model ignores parameters it does not
know, as OpenAI's newer clients send them freely.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictStr, field_validator

from router.errors import RequestError
from router.generation import ResponseFormat as GenerationFormat
from router.generation import ToolSpec
from router.structured.grammars import check_schema, loosened_form, schema_key

MAX_CONTENT_PARTS = 256


def _printable_model(v: str) -> str:
    # the name is echoed in a 404 and written to logs: no control characters, no spaces
    if not v.isprintable() or any(c.isspace() for c in v):
        raise ValueError("a model name is printable characters without spaces")
    return v


# the `model` field of every surface's body (chat completions, completions, responses, messages)
ModelName = Annotated[StrictStr, Field(min_length=1, max_length=256), AfterValidator(_printable_model)]
MAX_TESTS_CHARS = 100_000


def count_first(limit: int, what: str) -> Callable[[Any], Any]:
    """A before-validator counting a list before any item is read: 100,000 items are refused for
    their number, unread; and a content field that is a string or a list says its bound when the
    list is too long (the union's own error would say only that it is not a string)."""

    def check(v: Any) -> Any:
        if isinstance(v, list) and len(v) > limit:
            raise ValueError(f"at most {limit} {what}")
        return v

    return check


class Lenient(BaseModel):
    # Unknown OpenAI parameters are ignored rather than refused: clients send newer ones freely.
    model_config = ConfigDict(extra="ignore")


class ContentPart(Lenient):
    type: StrictStr = Field(max_length=64)
    text: StrictStr | None = None

    @field_validator("type")
    @classmethod
    def _text_only(cls, v: str) -> str:
        if v != "text":
            raise ValueError(f"content parts of type {v[:64]!r} are not supported; only 'text'")
        return v


FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for a function's name
MAX_TOOLS = 128  # OpenAI's own limit on tools per request
MAX_DESCRIPTION_CHARS = 16_384
MAX_SCHEMA_CHARS = 65_536  # one function's parameters, as compact JSON
MAX_TOOLS_CHARS = 524_288  # all of a request's tools together, as compact JSON
MAX_SCHEMA_DEPTH = 32  # nesting of a parameters schema: deeper is no real function's signature
MAX_ARGUMENTS_CHARS = 100_000  # a call's arguments in the history
MAX_CALL_ID_CHARS = 256


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value, without recursion (a hostile schema cannot exhaust the stack),
    level by level: it runs on the event loop for every tool, so each node costs one type check."""
    depth, level = 0, [value]
    while level:
        depth += 1
        below: list[Any] = []
        for node in level:
            if isinstance(node, dict):
                below.extend(node.values())
            elif isinstance(node, list):
                below.extend(node)
        level = below
    return depth


def shallow_schema(v: dict[str, Any] | None) -> dict[str, Any] | None:
    """A response format's schema, refused when it nests past MAX_SCHEMA_DEPTH as it is read:
    what walks it next (its encoding as the cache key and the size check, the grammar's checks)
    recurses, and a schema ~1000 levels deep would exhaust the stack there, a 500. Deeper than
    any real answer's shape; the grammar's own bound (router.structured.grammars) is tighter."""
    if v is not None and _depth(v) > MAX_SCHEMA_DEPTH:
        raise ValueError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
    return v


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


class _EncodedSchema(dict[str, Any]):
    """A parameters schema that keeps the compact JSON its size check made: the tool's spec takes
    that text rather than encoding the schema again (a request may carry 256 KB of them, read on
    the event loop)."""

    __slots__ = ("json",)

    def __init__(self, schema: dict[str, Any], text: str) -> None:
        super().__init__(schema)
        self.json = text


class FunctionDefinition(Lenient):
    name: StrictStr = Field(pattern=FUNCTION_NAME)
    description: StrictStr | None = Field(None, max_length=MAX_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None

    @field_validator("parameters")
    @classmethod
    def _bounded(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        # the schema is rendered into every prompt and walked by the tool_call verifier: bounded here
        if v is None:
            return v
        if _depth(v) > MAX_SCHEMA_DEPTH:
            raise ValueError(f"a parameters schema may nest at most {MAX_SCHEMA_DEPTH} levels deep")
        text = compact_json(v)
        if len(text) > MAX_SCHEMA_CHARS:
            raise ValueError(f"a parameters schema may be at most {MAX_SCHEMA_CHARS} characters of JSON")
        return _EncodedSchema(v, text)


class Tool(Lenient):
    type: StrictStr = Field(max_length=64)
    function: FunctionDefinition

    @field_validator("type")
    @classmethod
    def _function_only(cls, v: str) -> str:
        if v != "function":
            raise ValueError(f"tools of type {v[:64]!r} are not supported; only 'function'")
        return v

    # made once: its parameters are encoded and parsed again only as often as they must be (a
    # request may carry 256 KB of them, read on the event loop)
    _spec: ToolSpec | None = PrivateAttr(default=None)
    _loose: tuple[dict[str, Any], list[str], str] | None = PrivateAttr(default=None)

    def spec(self) -> ToolSpec:
        if self._spec is None:
            f, params = self.function, self.function.parameters
            self._spec = ToolSpec(
                name=f.name,
                description=f.description,
                parameters_json=params.json if isinstance(params, _EncodedSchema) else _json_or_none(params),
                strict=bool(f.strict),
            )
        return self._spec

    def loosened(self, param: str) -> tuple[dict[str, Any], list[str], str]:
        """A non-strict function's parameters as the service checks them
        (router.structured.grammars.loosened_form), where keywords were dropped, and the loosened
        schema's compact JSON (its check's key, and the spec's checked_json): made once per request,
        for both the look-up of known schemas and the typed request. RequestError as loosened_form."""
        if self._loose is None:
            spec = self.spec()
            loose, dropped = loosened_form(spec.parameters, param)
            self._loose = loose, dropped, schema_key(loose)
        return self._loose


def _json_or_none(schema: dict[str, Any] | None) -> str | None:
    return None if schema is None else compact_json(schema)  # a schema set after validation


class CalledFunction(Lenient):
    name: StrictStr = Field(pattern=FUNCTION_NAME)
    arguments: StrictStr = Field(max_length=MAX_ARGUMENTS_CHARS)


class MessageToolCall(Lenient):
    """A call an assistant made earlier in the conversation."""

    id: StrictStr = Field(min_length=1, max_length=MAX_CALL_ID_CHARS)
    type: Literal["function"]
    function: CalledFunction


class ChosenFunction(Lenient):
    name: StrictStr = Field(pattern=FUNCTION_NAME)


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: ChosenFunction


class ChatMessage(Lenient):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: StrictStr | Annotated[list[ContentPart], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    name: StrictStr | None = Field(None, max_length=256)
    tool_calls: Annotated[list[MessageToolCall], Field(max_length=MAX_TOOLS)] | None = None
    tool_call_id: StrictStr | None = Field(None, min_length=1, max_length=MAX_CALL_ID_CHARS)

    _count_parts = field_validator("content", mode="before")(count_first(MAX_CONTENT_PARTS, "content parts"))

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class TierrouteOptions(Lenient):
    """Our extension of the request: what the caller can give the verifiers."""

    tests: StrictStr | Annotated[list[StrictStr], Field(max_length=256)] | None = Field(
        None, description="Python test code for the code_tests verifier (a script, or one string per test)."
    )

    @field_validator("tests")
    @classmethod
    def _size(cls, v: str | list[str] | None) -> str | list[str] | None:
        total = len(v) if isinstance(v, str) else sum(map(len, v or ()))
        if total > MAX_TESTS_CHARS:
            raise ValueError(f"at most {MAX_TESTS_CHARS} characters of tests")
        return v

    def carries_tests(self) -> bool:
        return any(self.tests) if isinstance(self.tests, list) else bool(self.tests)


class JsonSchemaSpec(Lenient):
    name: StrictStr = Field(min_length=1, max_length=64)
    description: StrictStr | None = Field(None, max_length=4096)
    # `schema` would shadow BaseModel.schema; the wire name is kept by the alias. Its contents are
    # checked by router.structured.grammars (size, depth, constructs) when the typed request is made.
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: StrictBool | None = None

    _shallow = field_validator("schema_")(shallow_schema)


class ResponseFormat(Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    def typed(self) -> GenerationFormat | None:
        """The format as the backends and verifiers take it; None for free text."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return GenerationFormat("json_object")
        if self.json_schema is None:
            raise RequestError(
                "response_format of type json_schema needs a json_schema object", param="response_format"
            )
        schema = self.json_schema.schema_ if self.json_schema.schema_ is not None else {}
        check_schema(schema)
        return GenerationFormat("json_schema", schema, self.json_schema.name, self.json_schema.strict)


class StreamOptions(Lenient):
    include_usage: StrictBool | None = False
