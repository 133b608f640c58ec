"""Tool calls for the local tiers: the offered tools rendered into the prompt, the calls read back
out of the answer's text, and the same reading for answers that arrive as a stream.

A local model has no `tool_calls` field: it writes its calls as text, in whatever form its chat
template taught it. Both default models (Qwen2.5-Coder) have a template with a tools section that
asks for one JSON object per call inside tags::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A model whose template has no tools section (the test model SmolLM2) is taught the same form by a
system prompt written for this project (`fallback_system_prompt`), its history's calls written in
that form and tool results passed as user turns in `<tool_response>` tags, so one reader serves
every local model. The reader (`parse_tool_calls`) is forgiving of what small models do (a missing
closing tag at the very end, `parameters` for `arguments`, arguments given as a JSON string) and
strict about the rest: a block that is not a JSON object with a string `name`, or that nests more
than `MAX_NESTING` deep, is reported as malformed, never guessed at, so the `tool_call` verifier can
fail the answer and it escalates.

`answer` is the one place that decides what an answer's calls are: a backend that received calls
as data (an upstream's `tool_calls`) sets `Generation.tool_calls` and those are taken as they are;
otherwise the text is read. The HTTP layer and the verifier both call it, so the client is shown
exactly the calls that were verified. With `parallel_tool_calls: false` only the first call is
kept, as OpenAI promises at most one.

Streaming: the cascade holds back the text of a tier that may still be rejected, so the calls a
client receives were verified whole. The text of the answering tier is relayed as content until a
`<tool_call>` tag may begin (`ContentFilter` holds back any tail that could be the start of one);
from the tag on it is held, and once the answer is complete it is read by `answer` and sent as
OpenAI streams calls (`delta.tool_calls` with index, id, name, then argument fragments).

`call_schema` is the JSON Schema of the object inside a valid `<tool_call>` block under the
request's tools and `tool_choice`. A request that forces a call (`tool_choice` `required` or a
named function) leaves the model nothing to write but one, so a local tier decodes it under a
grammar of `forced_call_schema` (router.structured.grammars): the answer is that object, without tags, which
`parse_tool_calls` reads as it reads Qwen's untagged calls. Arguments follow the function's schema,
`strict` or not: every function's schema passed the response_format check with the request (a
non-strict one after what a grammar cannot honour was taken out: `ToolSpec.checked`), so each can
be a grammar, and an open object would let a small model loop inside it until max_tokens. (So a
forced call keeps OpenAI's promise for strict functions, and more.) Under `auto`
the model may answer in words, and a grammar allowing "any text or a call" would block Qwen's
special `<tool_call>` token and slow all free text; so nothing is forced there, and the
`tool_call` verifier checks the calls after the fact (a bad one escalates).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from router.generation import Generation, GenerationRequest, Message, NamedTool, ToolCall, ToolSpec

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
# a block runs to its closing tag, or (a model that stopped without writing it) to the very end
_BLOCK = re.compile(re.escape(OPEN_TAG) + r"(.*?)(?:" + re.escape(CLOSE_TAG) + r"|\Z)", re.S)
# an answer that is one fenced JSON block, as chat models like to wrap JSON
_FENCED = re.compile(r"\s*```(?:json)?[ \t]*\n?(.*?)\n?```\s*\Z", re.S)
# how an answer of untagged calls begins (see _bare_calls); an answer that may still begin so is held
_BARE_STARTS = ("{", "```json", "```\n{", "```{")
MAX_CALLS = 128  # calls read from one answer; more is a model looping, not a plan
# arguments nested deeper than this are refused as malformed: no function's parameters go near it, and
# JSON a thousand deep is past what Python's own decoder (RecursionError) and every later reader can walk
MAX_NESTING = 64
ARGUMENT_FRAGMENT_CHARS = 32  # streamed arguments arrive in pieces about this long, as OpenAI's do


@dataclass(frozen=True)
class ToolAnswer:
    """What an answer says: its text content (None when it is only calls) and its calls."""

    content: str | None
    calls: tuple[ToolCall, ...]
    malformed: tuple[str, ...] = ()  # why some `<tool_call>` blocks could not be read
    dropped: int = 0  # calls past the first, dropped because parallel_tool_calls is false


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# ---- rendering -----------------------------------------------------------------------------------


def template_renders_tools(template: str) -> bool:
    """Whether a chat template has a tools section of its own (it reads a `tools` variable)."""
    return re.search(r"\btools\b", template) is not None


def chat_inputs(
    request: GenerationRequest, *, native: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and tools to render `request` with. `native`: the template renders tools and
    tool turns itself (messages carry `tool_calls` and `tool_call_id` as OpenAI's do, arguments
    as objects, as Hugging Face templates expect); else tools go into a system prompt and tool
    turns are written as text (`fallback_system_prompt`)."""
    assert request.messages is not None
    tools = [t.to_openai() for t in request.tools] if request.offers_tools else None
    # a conversation ending on tool results: the model's turn is to use them (see RESULTS_NUDGE)
    nudge = [{"role": "user", "content": RESULTS_NUDGE}] if request.messages[-1].role == "tool" else []
    if native:
        return [_native_message(m) for m in request.messages] + nudge, tools
    messages = [_fallback_message(m) for m in request.messages] + nudge
    if tools:
        prompt = fallback_system_prompt(request)
        if messages and messages[0]["role"] == "system":
            messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{prompt}"}
        else:
            messages.insert(0, {"role": "system", "content": prompt})
    return messages, None


# Both default models render tool results as Qwen2.5 was trained to (`<tool_response>` in a user
# turn; their own templates do it), and both still answer a result by calling the function again
# (the 0.5B echoing the call and the result, the 1.5B the call). Measured on the raw models
# (README, Tool calls): with this user turn after the results, the 1.5B answers in words from them.
RESULTS_NUDGE = "Answer using the function results above, or call another function if one is still needed."


def fallback_system_prompt(request: GenerationRequest) -> str:
    """The tools section for a model whose template has none: the same protocol Qwen2.5's
    template teaches, so one reader parses both."""
    lines = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in request.tools)
    rules = ""
    choice = request.tool_choice
    if isinstance(choice, NamedTool):
        rules += f"\nYou must call the function {choice.name}."
    elif choice == "required":
        rules += "\nYou must call at least one function."
    if not request.parallel_tool_calls:
        rules += "\nCall at most one function."
    return (
        "# Tools\n\nYou may call functions to answer the user. The functions, one JSON object each, "
        f"within <tools></tools> tags:\n<tools>\n{lines}\n</tools>\n\n"
        "To call a function, write its name and arguments as a JSON object within "
        "<tool_call></tool_call> tags:\n"
        '<tool_call>\n{"name": "<function-name>", "arguments": {<arguments as JSON>}}\n</tool_call>\n'
        f"A function's result comes back within <tool_response></tool_response> tags.{rules}"
    )


def format_call(call: ToolCall) -> str:
    """A call written as a local model writes it (the history of a fallback rendering)."""
    body = {"name": call.name, "arguments": _arguments_value(call.arguments)}
    return f"{OPEN_TAG}\n{json.dumps(body, ensure_ascii=False)}\n{CLOSE_TAG}"


def decode_arguments(arguments: str) -> tuple[Any, str | None]:
    """A call's arguments decoded, or None and why they cannot be: not JSON, or nested past
    `MAX_NESTING`. Every reader of a call's arguments goes through here, whoever wrote them: a
    local model's text, or an upstream's `tool_calls`, which arrive as text the router did not
    check (an upstream sending arguments a few thousand brackets deep made the `tool_call`
    verifier and the Messages renderer raise RecursionError out of `json.loads`: a 500)."""
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        return None, f"not JSON ({exc})"
    except RecursionError:
        return None, f"nested more than {MAX_NESTING} deep"
    if _nesting(value) > MAX_NESTING:
        return None, f"nested more than {MAX_NESTING} deep"
    return value, None


def _arguments_value(arguments: str) -> Any:
    # templates write arguments with `tojson`: an object, not the JSON text of one
    value, _ = decode_arguments(arguments)
    return value if isinstance(value, dict) else arguments


def _native_message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments_value(c.arguments)}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _fallback_message(m: Message) -> dict[str, Any]:
    if m.role == "tool":
        # templates that know no `tool` role may refuse it; a result is something the user side says
        return {"role": "user", "content": f"<tool_response>\n{m.content}\n</tool_response>"}
    if m.tool_calls:
        calls = "\n".join(format_call(c) for c in m.tool_calls)
        return {"role": m.role, "content": f"{m.content}\n{calls}" if m.content else calls}
    return {"role": m.role, "content": m.content}


# ---- reading -------------------------------------------------------------------------------------


def parse_tool_calls(text: str) -> ToolAnswer:
    """The calls written in `text` as `<tool_call>` blocks, and the text around them. Without a
    readable call the whole text is the content."""
    calls: list[ToolCall] = []
    malformed: list[str] = []
    outside: list[str] = []
    at = 0
    for i, match in enumerate(_BLOCK.finditer(text)):
        if i >= MAX_CALLS:
            malformed.append(f"more than {MAX_CALLS} tool calls")
            break
        outside.append(text[at : match.start()])
        at = match.end()
        call, why = _read_block(match.group(1))
        if call is None:
            malformed.append(f"tool call {i + 1}: {why}")
        else:
            calls.append(call)
    if not calls and not malformed:
        fenced = _FENCED.match(text)
        bare, rest = _bare_calls(_undoubled(fenced.group(1) if fenced else text))
        if bare:
            return ToolAnswer(rest or None, bare)
    if not calls:
        return ToolAnswer(text, (), tuple(malformed))
    outside.append(text[at:])
    content = "".join(outside).strip()
    return ToolAnswer(content or None, tuple(calls), tuple(malformed))


def _bare_calls(text: str) -> tuple[tuple[ToolCall, ...], str]:
    """Calls written without their tags, and the text after them: an answer that opens with JSON
    objects each of the form {"name": ..., "arguments": ...} (possibly in one ```json fence).
    Qwen2.5's tags are special tokens, which the engine does not spell out in the text, so its
    calls arrive this way. Other JSON after the calls is kept as content: Qwen2.5-Coder-0.5B,
    handed a result, writes the call again and then a made-up result, which is a call (the
    `tool_call` verifier fails it as a repeat) and not an answer."""
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    at = 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text) or len(calls) >= MAX_CALLS:
            return tuple(calls), ""
        try:
            value, end = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            return ((), "") if not calls or text[at] != "{" else (tuple(calls), text[at:].strip())
        if not (isinstance(value, dict) and "name" in value and set(value) <= {"name", "arguments", "parameters"}):
            return ((), "") if not calls or not isinstance(value, dict) else (tuple(calls), text[at:].strip())
        call, _ = _read_block(json.dumps(value))
        if call is None:
            return (), ""
        calls.append(call)
        at = end


def _undoubled(text: str) -> str:
    """`{{...}}` read as `{...}`: Qwen2.5-Coder-1.5B's template shows the call form with doubled
    braces (a templating slip in the model's own file), and the model copies them."""
    text = text.strip()
    return text[1:-1] if text.startswith("{{") and text.endswith("}}") else text


def _read_block(body: str) -> tuple[ToolCall | None, str]:
    try:
        value = json.loads(_undoubled(body))
    except ValueError as exc:
        return None, f"not JSON ({exc})"
    except RecursionError:
        return None, f"nested more than {MAX_NESTING} deep"
    if _nesting(value) > MAX_NESTING:
        return None, f"nested more than {MAX_NESTING} deep"
    if not isinstance(value, dict):
        return None, f"a JSON {type(value).__name__}, not an object"
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None, "no function name"
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        text = arguments  # already JSON text, as OpenAI's own field is (the verifier checks it parses)
    else:
        text = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(new_call_id(), name, text), ""


def _nesting(value: Any) -> int:
    """How deep a decoded JSON value nests (a scalar is 0), walked without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth + 1)
            if depth < MAX_NESTING:  # deep enough to refuse: no need to walk further
                stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def answer(request: GenerationRequest, generation: Generation) -> ToolAnswer:
    """The content and calls of `generation` as the client receives them (see the module
    docstring). A request that offers no tools has no calls, whatever the text says."""
    if not request.offers_tools:
        return ToolAnswer(generation.text, ())
    if generation.tool_calls is not None:
        calls = generation.tool_calls[:MAX_CALLS]
        found = ToolAnswer((generation.text or None) if calls else generation.text, calls)
    else:
        found = parse_tool_calls(generation.text)
    if not request.parallel_tool_calls and len(found.calls) > 1:
        return ToolAnswer(found.content, found.calls[:1], found.malformed, len(found.calls) - 1)
    return found


def argument_fragments(arguments: str) -> list[str]:
    """A call's arguments cut as a stream sends them (the first fragment may be empty)."""
    step = ARGUMENT_FRAGMENT_CHARS
    return [arguments[i : i + step] for i in range(0, len(arguments), step)] or [""]


class ContentFilter:
    """Streamed text passed on as content up to where a `<tool_call>` tag may begin; the rest is
    held for `answer` to read once the answer is complete. An answer that opens with `{` or a
    ```json fence may be calls without tags (see `_bare_calls`) and is held whole."""

    def __init__(self) -> None:
        self._held = ""
        self._in_call = False
        self._sent = False  # some content went out: the answer is not one of bare-JSON calls

    def feed(self, text: str) -> str:
        """What of `text` (with what was held before) is safe to send as content now."""
        if self._in_call:
            return ""
        buf = self._held + text
        if not self._sent:
            head = buf.lstrip()
            if not head:
                self._held = buf  # nothing but space yet: what follows may be a call without tags
                return ""
            if head.startswith(_BARE_STARTS):
                self._in_call = True
                return ""
            if any(start.startswith(head) for start in _BARE_STARTS):
                self._held = buf  # too short to tell yet
                return ""
            self._sent = True
        found = buf.find(OPEN_TAG)
        if found >= 0:
            self._in_call = True
            self._held = ""
            return buf[:found]
        keep = next((k for k in range(min(len(OPEN_TAG) - 1, len(buf)), 0, -1) if buf.endswith(OPEN_TAG[:k])), 0)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]


# ---- the grammar hook ----------------------------------------------------------------------------


def call_schema(request: GenerationRequest) -> dict[str, Any] | None:
    """The JSON Schema of the object inside one valid `<tool_call>` block: `name` one of the
    functions `tool_choice` allows, `arguments` that function's parameters (an open object when it
    gives none). None when the request offers no tools."""
    if not request.offers_tools:
        return None
    return _one_of([(t.name, t.checked or {"type": "object"}) for t in allowed_tools(request)])


def forced_call_schema(request: GenerationRequest) -> dict[str, Any] | None:
    """The schema a local tier decodes a forced call under (module docstring): each function's
    arguments by its schema, moved into one document (its `$defs` hoisted beside the others', its
    references rewritten to match); `{}` for a function without parameters. None when the
    request does not force a call."""
    if not request.offers_tools or request.tool_choice == "auto":
        return None
    defs: dict[str, Any] = {}
    options: list[tuple[str, dict[str, Any]]] = []
    for t in allowed_tools(request):
        if t.checked:
            params = dict(t.checked)
            for key in ("$defs", "definitions"):
                for name, sub in (params.pop(key, None) or {}).items():
                    defs[f"{t.name}--{name}"] = _rebased(sub, t.name)
            defs[t.name] = _rebased(params, t.name)
            options.append((t.name, {"$ref": f"#/$defs/{t.name}"}))
        else:
            options.append((t.name, {"type": "object", "properties": {}, "additionalProperties": False}))
    schema = _one_of(options)
    return {**schema, "$defs": defs} if defs else schema


def allowed_tools(request: GenerationRequest) -> list[ToolSpec]:
    """The functions a call may name: the one a named tool_choice names, else every one offered."""
    choice = request.tool_choice
    return [t for t in request.tools if not isinstance(choice, NamedTool) or t.name == choice.name]


def _one_of(options: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    schemas = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": arguments},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, arguments in options
    ]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _rebased(node: Any, name: str) -> Any:
    """A function's schema with its local references pointing where `forced_call_schema` moves
    their targets: the function's root to `#/$defs/<name>`, its definitions to `<name>--<key>`."""
    if isinstance(node, list):
        return [_rebased(v, name) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rebased(v, name) for k, v in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        path = ref[2:]
        for key in ("$defs/", "definitions/"):
            if path.startswith(key):
                out["$ref"] = f"#/$defs/{name}--{path[len(key) :]}"
                break
        else:
            out["$ref"] = f"#/$defs/{name}" + (f"/{path}" if path else "")
    return out
