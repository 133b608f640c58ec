"""OpenAI's Responses API request (`POST /v1/responses`), read into its chat twin.

Served: `input` as a string or a list of items (messages with text content, `function_call` and
`function_call_output` items, as the official SDK and the Agents SDK send a conversation back),
`instructions` (the first system message), `max_output_tokens`, `temperature`, `top_p`, function
`tools` (strict unless `strict: false`, as OpenAI's Responses tools are) with `tool_choice` and
`parallel_tool_calls`, `text.format` (`text`, `json_object`, `json_schema`), `stream`, `user`, and
our `tierroute` extension. Bookkeeping of OpenAI's own service (`metadata`, `service_tier`,
`prompt_cache_key`, `safety_identifier`, `stream_options`) is ignored, as on chat.

Refused with a 400 naming the field, never ignored, because each would change the answer or
promise what is not kept: state (`store: true`, `previous_response_id`, `conversation`,
`item_reference` items: tierroute keeps no responses to continue from), `background`, `include`
(any entry), `top_logprobs`, `reasoning`, `truncation: "auto"`, `max_tool_calls`, `prompt`
templates, `context_management`, `moderation`, `text.verbosity`, built-in tools (web search, file
search, computer use, code interpreter, MCP, ...), content that is not text (images, files,
audio), and every item type but the three above (`reasoning` included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator

from router.api.request_parts import (
    FUNCTION_NAME,
    MAX_ARGUMENTS_CHARS,
    MAX_CALL_ID_CHARS,
    MAX_TOOLS,
    ChatMessage,
    FunctionDefinition,
    JsonSchemaSpec,
    Lenient,
    MessageToolCall,
    ModelName,
    ResponseFormat,
    TierrouteOptions,
    Tool,
)
from router.api.requests import MAX_TOKENS_BOUND, ChatCompletionRequest, Number
from router.api.surfaces.common import (
    MAX_BLOCKS,
    MAX_ITEMS,
    Renames,
    chat_message,
    checked,
    count_first,
    one_of,
    twin,
)
from router.errors import RequestError

ITEM_TYPES = ("message", "function_call", "function_call_output")
TEXT_PARTS = ("input_text", "output_text")
ROLES = ("user", "assistant", "system", "developer")


class Part(Lenient):
    """A text content part: `input_text` (what a user or system says), `output_text` (an
    assistant's earlier answer, as a response's output item carries it)."""

    type: StrictStr
    text: StrictStr


class MessageItem(Lenient):
    type: StrictStr | None = None
    role: StrictStr
    content: StrictStr | Annotated[list[dict[str, Any]], Field(max_length=MAX_BLOCKS)]

    _count_parts = field_validator("content", mode="before")(count_first(MAX_BLOCKS, "content parts"))

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        if v not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        return v


class FunctionCallItem(Lenient):
    type: StrictStr
    call_id: StrictStr = Field(min_length=1, max_length=MAX_CALL_ID_CHARS)
    name: StrictStr = Field(pattern=FUNCTION_NAME)
    arguments: StrictStr = Field(max_length=MAX_ARGUMENTS_CHARS)


class FunctionCallOutputItem(Lenient):
    type: StrictStr
    call_id: StrictStr = Field(min_length=1, max_length=MAX_CALL_ID_CHARS)
    output: StrictStr | Annotated[list[dict[str, Any]], Field(max_length=MAX_BLOCKS)]

    _count_parts = field_validator("output", mode="before")(count_first(MAX_BLOCKS, "content parts"))


class FunctionTool(FunctionDefinition):
    """A Responses function tool: a chat function's fields, flat, beside its `type`."""

    type: StrictStr


class NamedFunction(Lenient):
    type: StrictStr
    name: StrictStr = Field(pattern=FUNCTION_NAME)


class TextFormat(Lenient):
    type: StrictStr
    name: StrictStr | None = Field(None, min_length=1, max_length=64)
    description: StrictStr | None = Field(None, max_length=4096)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(Lenient):
    format: TextFormat | None = None
    verbosity: Any = None


class ResponsesRequest(Lenient):
    """The body of `POST /v1/responses` (the module docstring says what is served)."""

    surface: ClassVar[str] = "responses"

    model: ModelName
    input: StrictStr | list[Any]
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1, le=MAX_TOKENS_BOUND)
    temperature: Number | None = Field(None, ge=0.0, le=2.0)
    top_p: Number | None = Field(None, ge=0.0, le=1.0)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    stream: StrictBool | None = False
    user: StrictStr | None = None
    tierroute: TierrouteOptions | None = None
    # what a client may send and tierroute does not do: refused by name (the module docstring)
    store: StrictBool | None = None
    previous_response_id: Any = None
    conversation: Any = None
    background: StrictBool | None = None
    include: list[Any] | None = None
    top_logprobs: Any = None
    reasoning: Any = None
    truncation: Any = None
    max_tool_calls: Any = None
    prompt: Any = None
    context_management: Any = None
    moderation: Any = None

    _count_input = field_validator("input", mode="before")(count_first(MAX_ITEMS, "input items"))
    _count_tools = field_validator("tools", mode="before")(count_first(MAX_TOOLS, "tools"))

    @field_validator("previous_response_id", "conversation", "prompt", "context_management", "moderation")
    @classmethod
    def _stateful(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError(
                "not supported by tierroute: it keeps no responses or conversations to continue from; "
                "send the whole conversation as input items"
            )
        return v

    @field_validator("store")
    @classmethod
    def _not_stored(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError("tierroute stores no responses (store: true is not supported; send false or omit it)")
        return v

    @field_validator("background")
    @classmethod
    def _foreground(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError("background responses are not supported")
        return v

    @field_validator("include")
    @classmethod
    def _nothing_included(cls, v: list[Any] | None) -> list[Any] | None:
        if v:
            raise ValueError("no include entries are supported (logprobs, reasoning and tool outputs are not kept)")
        return v

    @field_validator("top_logprobs", "reasoning", "max_tool_calls")
    @classmethod
    def _not_served(cls, v: Any) -> Any:
        if v is not None and v != 0:
            raise ValueError("not supported by tierroute on /v1/responses")
        return v

    @field_validator("truncation")
    @classmethod
    def _no_truncation(cls, v: Any) -> Any:
        if v is not None and v != "disabled":
            raise ValueError("only 'disabled' is supported: tierroute never drops input to fit a context")
        return v

    def to_chat(self) -> tuple[ChatCompletionRequest, Renames]:
        """The chat twin, and where each of its parts came from (400 naming this body's field)."""
        renames = Renames({"max_completion_tokens": "max_output_tokens", "response_format": "text.format"})
        messages: list[ChatMessage] = []
        if self.instructions is not None:
            renames.add(f"messages.{len(messages)}", "instructions")
            messages.append(chat_message({"role": "system", "content": self.instructions}, "instructions"))
        if isinstance(self.input, str):
            renames.add(f"messages.{len(messages)}", "input")
            messages.append(chat_message({"role": "user", "content": self.input}, "input", {"content": "input"}))
        else:
            _items(self.input, messages, renames)
        renames.add("messages", "input")
        tools = [self._tool(i, t, renames) for i, t in enumerate(self.tools or ())]
        fields: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": self.stream,
            "user": self.user,
            "tierroute": self.tierroute,
            "tools": tools or None,
            "tool_choice": self._tool_choice(),
            "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": self._format(),
        }
        return twin(fields, renames), renames

    @staticmethod
    def _tool(i: int, value: Any, renames: Renames) -> Tool:
        where = f"tools.{i}"
        one_of(value, where, ("function",), "tools")
        tool = checked(FunctionTool, value, where)
        renames.add(f"tools.{i}.function", where)
        # a Responses function is strict unless it says otherwise (OpenAI's default there)
        strict = True if tool.strict is None else tool.strict
        function = FunctionDefinition.model_construct(
            name=tool.name, description=tool.description, parameters=tool.parameters, strict=strict
        )
        return Tool.model_construct(type="function", function=function)

    def _tool_choice(self) -> Any:
        choice = self.tool_choice
        if choice is None or choice in ("auto", "none", "required"):
            return choice
        if isinstance(choice, dict) and choice.get("type") == "function":
            named = checked(NamedFunction, choice, "tool_choice")
            return {"type": "function", "function": {"name": named.name}}  # chat's form, read by the twin
        raise RequestError(
            "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...} "
            "(allowed_tools and built-in tools are not supported)",
            param="tool_choice",
        )

    def _format(self) -> ResponseFormat | None:
        text = self.text
        if text is None:
            return None
        if text.verbosity is not None:
            raise RequestError("text.verbosity is not supported by tierroute", param="text.verbosity")
        fmt = text.format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return checked(ResponseFormat, {"type": "json_object"}, "text.format")
        if fmt.type != "json_schema":
            raise RequestError("text.format.type must be 'text', 'json_object' or 'json_schema'", param="text.format")
        if fmt.name is None:
            raise RequestError("a json_schema format needs a name", param="text.format.name")
        if fmt.schema_ is None:  # required here, as OpenAI requires it (chat's response_format leaves it optional)
            raise RequestError("a json_schema format needs a schema", param="text.format.schema")
        spec = checked(
            JsonSchemaSpec,
            {"name": fmt.name, "description": fmt.description, "schema": fmt.schema_, "strict": fmt.strict},
            "text.format",
        )
        return checked(ResponseFormat, {"type": "json_schema", "json_schema": spec}, "text.format")


def _text(parts: str | list[dict[str, Any]], where: str, allowed: tuple[str, ...] = TEXT_PARTS) -> str:
    if isinstance(parts, str):
        return parts
    pieces = []
    for j, part in enumerate(parts):
        at = f"{where}.{j}"
        one_of(part, at, allowed, "content parts")
        pieces.append(checked(Part, part, at).text)
    return "".join(pieces)


def _items(items: list[Any], messages: list[ChatMessage], renames: Renames) -> None:
    """The input items as chat messages: an assistant's consecutive function calls (and the text
    before them) are one assistant message with tool calls, as chat carries them; each
    function_call_output is a `tool` message. The assistant message is made once its calls are
    all read, and checked as chat's is (at most 128 calls)."""
    gathering: _Calls | None = None  # the assistant message whose calls are being read
    for i, item in enumerate(items):
        where = f"input.{i}"
        if isinstance(item, dict) and "type" not in item and "role" in item:
            kind = "message"  # an easy input message: {"role", "content"}
        else:
            kind = one_of(item, where, ITEM_TYPES, "input items")
        if kind != "function_call" and gathering is not None:
            gathering.close(messages)
            gathering = None
        m = len(messages)
        if kind == "message":
            message = checked(MessageItem, item, where)
            renames.add(f"messages.{m}", where)
            content = _text(message.content, f"{where}.content")
            messages.append(chat_message({"role": message.role, "content": content}, where))
        elif kind == "function_call":
            call = checked(FunctionCallItem, item, where)
            if gathering is None:
                last = messages[-1] if messages else None
                if last is not None and last.role == "assistant" and not last.tool_calls:
                    gathering = _Calls(m - 1, last.content, where)  # the calls of the text before them
                else:
                    renames.add(f"messages.{m}", where)
                    gathering = _Calls(m, None, where)
                    messages.append(chat_message({"role": "assistant", "content": None}, where))
            k, at = len(gathering.calls), f"messages.{gathering.index}.tool_calls"
            if k == MAX_TOOLS:  # chat's bound on an assistant message's tool calls
                raise RequestError(
                    f"at most {MAX_TOOLS} function_call items in a row (one assistant turn's calls)", param=where
                )
            renames.add(f"{at}.{k}", where)
            renames.add(f"{at}.{k}.id", f"{where}.call_id")
            renames.add(f"{at}.{k}.function", where)
            function = {"name": call.name, "arguments": call.arguments}
            value = {"id": call.call_id, "type": "function", "function": function}
            gathering.calls.append(checked(MessageToolCall, value, where))
        else:
            result = checked(FunctionCallOutputItem, item, where)
            renames.add(f"messages.{m}", where)
            renames.add(f"messages.{m}.tool_call_id", f"{where}.call_id")
            renames.add(f"messages.{m}.content", f"{where}.output")
            output = _text(result.output, f"{where}.output", ("input_text",))
            fields = {"role": "tool", "content": output, "tool_call_id": result.call_id}
            messages.append(
                chat_message(fields, where, {"tool_call_id": f"{where}.call_id", "content": f"{where}.output"})
            )
    if gathering is not None:
        gathering.close(messages)


@dataclass
class _Calls:
    """An assistant message being read: its place among the messages, its text, its calls so far."""

    index: int
    content: Any
    where: str  # the input item that opened it
    calls: list[MessageToolCall] = field(default_factory=list)

    def close(self, messages: list[ChatMessage]) -> None:
        """The message made, with its calls: checked once, as a chat body's message is."""
        fields = {"role": "assistant", "content": self.content, "tool_calls": self.calls}
        messages[self.index] = chat_message(fields, self.where, {"tool_calls": self.where})
