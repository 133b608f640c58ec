"""What the Responses and Messages surfaces share: reading a body into its chat twin, and naming
every refusal by the surface's own fields.

A surface's body is read into the chat completions request it amounts to (its *twin*,
`router.api.requests.ChatCompletionRequest`), built from already checked parts, and the pipeline
serves the twin: the same checks of messages, tool histories, tools and schemas, the same typed
`GenerationRequest`, the same cache key form and the same worst-case price. So a Responses or
Messages request is priced, limited, cached and recorded as its chat twin is, by construction.

A check the twin makes names a chat parameter (`messages.4.tool_call_id`, `tools.0.function.
parameters`); `Renames` holds where each part of the twin came from, so the refusal a client gets
names the field it sent (`input.7.call_id`, `tools.0.input_schema`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from router.api.errors import validation_message
from router.api.request_parts import ChatMessage, count_first
from router.api.requests import ChatCompletionRequest
from router.errors import RequestError

M = TypeVar("M", bound=BaseModel)
__all__ = ["MAX_BLOCKS", "MAX_ITEMS", "Renames", "chat_message", "checked", "count_first", "one_of", "twin"]

MAX_ITEMS = 2048  # items of a Responses input or messages of a Messages body: chat's own bound
MAX_BLOCKS = 256  # content parts or blocks of one item: chat's bound on a message's parts


def checked(model: type[M], value: Any, where: str) -> M:
    """`value` validated as `model`; a refusal names the field under `where` ('input.3')."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors()), where)
        raise RequestError(message, param=param) from None


def chat_message(fields: dict[str, Any], where: str, names: dict[str, str] | None = None) -> ChatMessage:
    """One message of the twin, validated as a chat body's message is (its role, its bounds, at
    most 128 tool calls): the twin takes its messages as they are, so a message constructed
    around these checks would carry what chat refuses, and a pydantic error raised outside a
    check is a 500. A refusal names `where`; `names` gives a chat field's name on the surface
    (`{"tool_calls": "messages.3.content"}`)."""
    try:
        return checked(ChatMessage, fields, where)
    except RequestError as exc:
        raise Renames({f"{where}.{k}": v for k, v in (names or {}).items()}).rename(exc) from None


def one_of(value: Any, where: str, allowed: tuple[str, ...], what: str) -> str:
    """The `type` of an item or block, checked against the ones the surface serves."""
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(kind, str):
        raise RequestError(f"{what} must be an object with a string 'type'", param=where)
    if kind not in allowed:
        raise RequestError(
            f"{what} of type {kind[:64]!r} are not supported; only {', '.join(allowed)}", param=f"{where}.type"
        )
    return kind


@dataclass
class Renames:
    """Where each part of the twin came from: chat path prefix -> the surface's path."""

    paths: dict[str, str] = field(default_factory=dict)

    def add(self, chat: str, surface: str) -> None:
        self.paths[chat] = surface

    def of(self, param: str | None) -> str | None:
        """The surface's name for a chat parameter: its longest known prefix replaced."""
        if param is None:
            return None
        parts = param.split(".")
        for cut in range(len(parts), 0, -1):
            head = ".".join(parts[:cut])
            if head in self.paths:
                return ".".join([self.paths[head], *parts[cut:]]).strip(".") or None
        return param

    def rename(self, exc: RequestError) -> RequestError:
        """`exc` naming the surface's field: the same exception (its type decides its status),
        its param and the words that quote it renamed."""
        old, new = exc.param, self.of(exc.param)
        if old is not None and new is not None and new != old:
            exc.param = new
            exc.args = (str(exc).replace(f"'{old}'", f"'{new}'"), *exc.args[1:])
        return exc


def twin(fields: dict[str, Any], renames: Renames) -> ChatCompletionRequest:
    """The chat completions request a surface's body amounts to. Its parts are checked already
    (`ChatMessage` and `Tool` instances are taken as they are); what the chat body still checks
    (counts, ranges, tool_choice) is refused under the surface's names."""
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors()))
        raise renames.rename(RequestError(message, param=param)) from None
