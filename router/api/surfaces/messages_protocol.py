"""Anthropic's Messages API request (`POST /v1/messages`, `POST /v1/messages/count_tokens`), read
into its chat twin.

Served: `model`, `max_tokens` (required, as Anthropic requires it), `messages` (user and
assistant turns; content a string or blocks: `text`, an assistant's `tool_use`, a user's
`tool_result`), `system` (a string or text blocks), `stop_sequences` (up to 4, as chat's `stop`),
`temperature` (0 to 1) and `top_p`, `tools` (custom tools: `name`, `description`, `input_schema`;
`strict` as chat's) with `tool_choice` (`auto`, `any`, `tool` with its `name`, `none`;
`disable_parallel_tool_use`), `output_config.format` (a `json_schema`: the answer is JSON valid
for it), `metadata.user_id` (the ledger's `user`), `stream`, and our `tierroute` extension.
`cache_control` marks and `service_tier` are ignored (they say how Anthropic bills, not what
the answer is).

Refused with a 400 naming the field: images and documents (in messages and in tool results),
`thinking` turned on and thinking blocks, server tools (web search, code execution, bash, text
editor, computer use: any tool with a `type` but `custom`), `top_k`, `mcp_servers`, `container`,
`output_config.effort`, and every block type but the three above. A `tool_result` must answer a
`tool_use` of an earlier assistant turn, as a chat tool message must answer a call.

A user turn's `tool_result` blocks become chat `tool` messages (each answering its call), in
order, and its text blocks one user message after them; an assistant turn's `tool_use` blocks
become its tool calls (`input` as the call's JSON arguments).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator

from router.api.request_parts import (
    FUNCTION_NAME,
    MAX_ARGUMENTS_CHARS,
    MAX_CALL_ID_CHARS,
    MAX_DESCRIPTION_CHARS,
    MAX_TOOLS,
    ChatMessage,
    FunctionDefinition,
    Lenient,
    MessageToolCall,
    ModelName,
    ResponseFormat,
    TierrouteOptions,
    Tool,
    compact_json,
    shallow_schema,
)
from router.api.requests import MAX_STOP_CHARS, MAX_STOPS, MAX_TOKENS_BOUND, ChatCompletionRequest, Number
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

USER_BLOCKS = ("text", "tool_result")
ASSISTANT_BLOCKS = ("text", "tool_use")
_REFUSED_BLOCKS = {
    "image": "images are not supported by tierroute (its tiers read text)",
    "document": "documents are not supported by tierroute (send their text)",
    "thinking": "thinking blocks are not supported (tierroute's tiers do not think aloud)",
    "redacted_thinking": "thinking blocks are not supported (tierroute's tiers do not think aloud)",
}


class TextBlock(Lenient):
    type: StrictStr
    text: StrictStr


class ToolUseBlock(Lenient):
    type: StrictStr
    id: StrictStr = Field(min_length=1, max_length=MAX_CALL_ID_CHARS)
    name: StrictStr = Field(pattern=FUNCTION_NAME)
    input: dict[str, Any]


class ToolResultBlock(Lenient):
    type: StrictStr
    tool_use_id: StrictStr = Field(min_length=1, max_length=MAX_CALL_ID_CHARS)
    content: StrictStr | Annotated[list[dict[str, Any]], Field(max_length=MAX_BLOCKS)] | None = None
    is_error: StrictBool | None = None

    _count_blocks = field_validator("content", mode="before")(count_first(MAX_BLOCKS, "content blocks"))


class Turn(Lenient):
    role: StrictStr
    content: StrictStr | Annotated[list[Any], Field(max_length=MAX_BLOCKS)]

    _count_blocks = field_validator("content", mode="before")(count_first(MAX_BLOCKS, "content blocks"))

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        if v not in ("user", "assistant"):
            raise ValueError("role must be 'user' or 'assistant' (a system prompt goes in `system`)")
        return v


class CustomTool(Lenient):
    type: StrictStr | None = None
    name: StrictStr = Field(pattern=FUNCTION_NAME)
    description: StrictStr | None = Field(None, max_length=MAX_DESCRIPTION_CHARS)
    input_schema: dict[str, Any]
    strict: StrictBool | None = None


class ToolChoice(Lenient):
    type: StrictStr
    name: StrictStr | None = Field(None, pattern=FUNCTION_NAME)
    disable_parallel_tool_use: StrictBool | None = None


class OutputFormat(Lenient):
    type: StrictStr
    schema_: dict[str, Any] = Field(alias="schema")

    _shallow = field_validator("schema_")(shallow_schema)


class OutputConfig(Lenient):
    format: OutputFormat | None = None
    effort: Any = None

    @field_validator("effort")
    @classmethod
    def _no_effort(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError("effort is not supported by tierroute")
        return v


class Metadata(Lenient):
    user_id: StrictStr | None = Field(None, max_length=512)


class MessagesBody(Lenient):
    """What `/v1/messages` and its count_tokens read alike: the conversation, system and tools."""

    surface: ClassVar[str] = "messages"

    model: ModelName
    messages: list[Any] = Field(min_length=1)
    system: StrictStr | Annotated[list[Any], Field(max_length=MAX_BLOCKS)] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    output_config: OutputConfig | None = None
    tierroute: TierrouteOptions | None = None
    thinking: Any = None
    mcp_servers: Any = None
    container: Any = None

    _count_messages = field_validator("messages", mode="before")(count_first(MAX_ITEMS, "messages"))
    _count_system = field_validator("system", mode="before")(count_first(MAX_BLOCKS, "system blocks"))
    _count_tools = field_validator("tools", mode="before")(count_first(MAX_TOOLS, "tools"))

    @field_validator("thinking")
    @classmethod
    def _no_thinking(cls, v: Any) -> Any:
        if v is not None and not (isinstance(v, dict) and v.get("type") == "disabled"):
            raise ValueError("extended thinking is not supported by tierroute (omit it, or send type 'disabled')")
        return v

    @field_validator("mcp_servers", "container")
    @classmethod
    def _no_server_side(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError("not supported by tierroute (it runs no server-side tools)")
        return v

    def chat_fields(self, renames: Renames) -> dict[str, Any]:
        """The twin's fields that this part of the body decides."""
        renames.add("response_format", "output_config.format")
        messages: list[ChatMessage] = []
        if self.system is not None:
            renames.add("messages.0", "system")
            system = _text(self.system, "system")
            messages.append(chat_message({"role": "system", "content": system}, "system", {"content": "system"}))
        for i, turn in enumerate(self.messages):
            _turn(i, turn, messages, renames)
        renames.add("messages", "messages")
        tools = [_tool(i, t, renames) for i, t in enumerate(self.tools or ())]
        choice, parallel = self._tool_choice()
        return {
            "model": self.model,
            "messages": messages,
            "tools": tools or None,
            "tool_choice": choice,
            "parallel_tool_calls": parallel,
            "response_format": self._format(),
            "tierroute": self.tierroute,
        }

    def _tool_choice(self) -> tuple[Any, bool | None]:
        if self.tool_choice is None:
            return None, None
        choice = checked(ToolChoice, self.tool_choice, "tool_choice")
        parallel = None if choice.disable_parallel_tool_use is None else not choice.disable_parallel_tool_use
        if choice.type in ("auto", "none"):
            return choice.type, parallel
        if choice.type == "any":
            return "required", parallel
        if choice.type == "tool":
            if choice.name is None:
                raise RequestError("a tool_choice of type 'tool' needs the tool's name", param="tool_choice.name")
            return {"type": "function", "function": {"name": choice.name}}, parallel
        raise RequestError("tool_choice.type must be 'auto', 'any', 'tool' or 'none'", param="tool_choice.type")

    def _format(self) -> ResponseFormat | None:
        fmt = self.output_config.format if self.output_config is not None else None
        if fmt is None:
            return None
        if fmt.type != "json_schema":
            raise RequestError("output_config.format.type must be 'json_schema'", param="output_config.format.type")
        spec = {"name": "output", "schema": fmt.schema_, "strict": True}
        try:
            return checked(ResponseFormat, {"type": "json_schema", "json_schema": spec}, "response_format")
        except RequestError as exc:
            renames = Renames({"response_format.json_schema": "output_config.format"})
            raise renames.rename(exc) from None


class MessagesRequest(MessagesBody):
    """The body of `POST /v1/messages` (the module docstring says what is served)."""

    max_tokens: StrictInt = Field(ge=1, le=MAX_TOKENS_BOUND)
    stop_sequences: (
        Annotated[list[Annotated[StrictStr, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=MAX_STOPS)] | None
    ) = None
    temperature: Number | None = Field(None, ge=0.0, le=1.0)
    top_p: Number | None = Field(None, ge=0.0, le=1.0)
    top_k: Any = None
    metadata: Metadata | None = None
    stream: StrictBool | None = False

    @field_validator("top_k")
    @classmethod
    def _no_top_k(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError("top_k is not supported by tierroute (use top_p or temperature)")
        return v

    def to_chat(self) -> tuple[ChatCompletionRequest, Renames]:
        """The chat twin, and where each of its parts came from (400 naming this body's field)."""
        renames = Renames({"max_tokens": "max_tokens", "stop": "stop_sequences"})
        fields = {
            **self.chat_fields(renames),
            "max_tokens": self.max_tokens,
            "stop": self.stop_sequences,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": self.stream,
            "user": self.metadata.user_id if self.metadata is not None else None,
        }
        renames.add("user", "metadata.user_id")
        return twin(fields, renames), renames


class CountTokensRequest(MessagesBody):
    """The body of `POST /v1/messages/count_tokens`: a Messages request without `max_tokens`."""

    def to_chat(self) -> tuple[ChatCompletionRequest, Renames]:
        renames = Renames()
        return twin({**self.chat_fields(renames), "max_tokens": 1}, renames), renames


def _text(blocks: str | list[Any], where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    pieces = []
    for j, block in enumerate(blocks):
        at = f"{where}.{j}"
        _refused(block, at)
        one_of(block, at, ("text",), "blocks")
        pieces.append(checked(TextBlock, block, at).text)
    return "".join(pieces)


def _refused(block: Any, where: str) -> None:
    kind = block.get("type") if isinstance(block, dict) else None
    if isinstance(kind, str) and kind in _REFUSED_BLOCKS:
        raise RequestError(_REFUSED_BLOCKS[kind], param=f"{where}.type")


def _turn(i: int, value: Any, messages: list[ChatMessage], renames: Renames) -> None:
    where = f"messages.{i}"
    turn = checked(Turn, value, where)
    if isinstance(turn.content, str):
        renames.add(f"messages.{len(messages)}", where)
        messages.append(chat_message({"role": turn.role, "content": turn.content}, where))
        return
    allowed = USER_BLOCKS if turn.role == "user" else ASSISTANT_BLOCKS
    texts: list[str] = []
    calls: list[MessageToolCall] = []
    first_text: str | None = None
    for j, block in enumerate(turn.content):
        at = f"{where}.content.{j}"
        _refused(block, at)
        kind = one_of(block, at, allowed, f"{turn.role} content blocks")
        if kind == "text":
            texts.append(checked(TextBlock, block, at).text)
            first_text = first_text or at
        elif kind == "tool_use":
            use = checked(ToolUseBlock, block, at)
            if len(calls) == MAX_TOOLS:  # chat's bound on an assistant message's tool calls
                raise RequestError(
                    f"at most {MAX_TOOLS} tool_use blocks in one assistant turn", param=f"{where}.content"
                )
            arguments = compact_json(use.input)
            if len(arguments) > MAX_ARGUMENTS_CHARS:
                raise RequestError(f"at most {MAX_ARGUMENTS_CHARS} characters of input", param=f"{at}.input")
            at_call = f"messages.{len(messages)}.tool_calls.{len(calls)}"
            renames.add(at_call, at)
            renames.add(f"{at_call}.id", f"{at}.id")
            renames.add(f"{at_call}.function.arguments", f"{at}.input")
            renames.add(f"{at_call}.function", at)
            function = {"name": use.name, "arguments": arguments}
            calls.append(checked(MessageToolCall, {"id": use.id, "type": "function", "function": function}, at))
        else:
            result = checked(ToolResultBlock, block, at)
            content = "" if result.content is None else _result_text(result.content, f"{at}.content")
            if result.is_error:
                content = f"Error: {content}"
            m = len(messages)
            renames.add(f"messages.{m}", at)
            renames.add(f"messages.{m}.tool_call_id", f"{at}.tool_use_id")
            answer = {"role": "tool", "content": content, "tool_call_id": result.tool_use_id}
            messages.append(chat_message(answer, at, {"tool_call_id": f"{at}.tool_use_id"}))
    if texts or calls or not turn.content:
        renames.add(f"messages.{len(messages)}", first_text or where)
        said = "".join(texts) if texts or not calls else None
        fields: dict[str, Any] = {"role": turn.role, "content": said, "tool_calls": calls or None}
        messages.append(chat_message(fields, where, {"content": f"{where}.content", "tool_calls": f"{where}.content"}))


def _result_text(content: str | list[dict[str, Any]], where: str) -> str:
    if isinstance(content, str):
        return content
    return _text(content, where)


def _tool(i: int, value: Any, renames: Renames) -> Tool:
    where = f"tools.{i}"
    kind = value.get("type") if isinstance(value, dict) else None
    if kind is not None and kind != "custom":
        shown = kind[:64] if isinstance(kind, str) else type(kind).__name__
        raise RequestError(
            f"tools of type {shown!r} (server tools) are not supported; only custom tools", param=f"{where}.type"
        )
    tool = checked(CustomTool, value, where)
    renames.add(f"tools.{i}.function.parameters", f"{where}.input_schema")
    renames.add(f"tools.{i}.function", where)
    # the schema checks of a chat function (depth, size) under this tool's names
    try:
        spec = {"name": tool.name, "description": tool.description, "parameters": tool.input_schema}
        function = checked(FunctionDefinition, {**spec, "strict": tool.strict}, where)
    except RequestError as exc:
        raise Renames({f"{where}.parameters": f"{where}.input_schema"}).rename(exc) from None
    return Tool.model_construct(type="function", function=function)
