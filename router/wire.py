"""What a tier is sent, as the JSON an OpenAI-compatible server receives, and the most tokens a
generation can be counted for, read from exactly that.

One serialiser of messages (`message_json`) serves both the openai backend, which sends it, and
admission, which prices it: what is reserved is measured on the very text that is sent (a test
holds them to each other on every message shape: tool calls, tool results, names, empty content).

A key's budget holds only if what admission reserves is at least what the request can then be
charged (`router.admission.accounting.worst_case_usd` prices these bounds; the shadow budget uses the same
function). So the prompt bound counts every byte a tier is given, not only the messages' text:
each message's role, content, tool calls (id, name, arguments) and tool-call id, the tools' JSON
definitions and `tool_choice`, the `response_format` schema, stop strings and logit biases. They are
serialised once, as the JSON an OpenAI-compatible server receives (with spaces after separators,
as a chat template's `tojson` writes them), and measured in UTF-8 bytes: under any byte-level
tokenizer (BPE, or SentencePiece with byte fallback) a token covers at least one byte, so a
prompt has no more tokens than bytes. A chat template adds a few tokens per message and a few to
open the reply; a backend that may count more than that (a hosted API's own system prompt, a
local model whose template rewrites tools) says so with its own allowance, or its own limit
(`Backend.prompt_token_limit`).

The completion bound is `n` choices of `max_tokens` each; the prompt is counted once for all n,
as every backend here counts it (`router.generation.merge_choices`, OpenAI's `usage`).

This module imports only the request types, so backends (which send with it and state their
limits with it) and admission (which prices them) both build on it, beside `router.generation`.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from router.generation import GenerationRequest, Message, NamedTool, ResponseFormat, ToolChoice, ToolSpec

# what a chat template adds: a few special tokens per message and to open the reply
TEMPLATE_TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS = 16


def sent_json(request: GenerationRequest) -> str:
    """Everything in `request` that shapes what a model reads, as one JSON text."""
    value: dict[str, Any] = {}
    if request.messages is not None:
        value["messages"] = [message_json(m) for m in request.messages]
    else:
        value["prompt"] = request.prompt
    if request.tools:
        value["tools"] = [t.to_openai() for t in request.tools]
        choice = request.tool_choice
        value["tool_choice"] = {"function": {"name": choice.name}} if isinstance(choice, NamedTool) else choice
    if request.response_format is not None:
        value["response_format"] = request.response_format.to_openai()
    if request.stop:
        value["stop"] = list(request.stop)
    if request.logit_bias:
        value["logit_bias"] = {str(token): bias for token, bias in request.logit_bias}
    return json.dumps(value, ensure_ascii=False)


def message_json(m: Message) -> dict[str, Any]:
    """One message as OpenAI's API carries it: an answer of calls alone has no content (null), as
    OpenAI's own; calls and the id of the call a tool result answers, as given."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["content"] = m.content or None
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def sent_bytes(request: GenerationRequest) -> int:
    # admission asks this of one request several times (each planned tier, each verifier that
    # samples it, its shadow), as copies that share their parts: measured once (a megabyte of
    # tools takes ~10 ms to serialise, on the event loop)
    return _measured(
        request.messages,
        request.prompt,
        request.tools,
        request.tool_choice,
        request.response_format,
        request.stop,
        request.logit_bias,
    )


@functools.lru_cache(maxsize=16)
def _measured(
    messages: tuple[Message, ...] | None,
    prompt: str | None,
    tools: tuple[ToolSpec, ...],
    tool_choice: ToolChoice,
    response_format: ResponseFormat | None,
    stop: tuple[str, ...],
    logit_bias: tuple[tuple[int, float], ...],
) -> int:
    shape = GenerationRequest(
        messages=messages,
        prompt=prompt,
        tools=tools,
        tool_choice=tool_choice,
        response_format=response_format,
        stop=stop,
        logit_bias=logit_bias,
    )
    return len(sent_json(shape).encode("utf-8", "surrogatepass"))


def prompt_token_bound(
    request: GenerationRequest,
    *,
    per_message: int = TEMPLATE_TOKENS_PER_MESSAGE,
    fixed: int = TEMPLATE_TOKENS,
) -> int:
    """The most prompt tokens `request` can be: a token per byte of what is sent, plus the chat
    template's `per_message` tokens for each message (a plain prompt counts as one) and `fixed`."""
    messages = len(request.messages) if request.messages is not None else 1
    return sent_bytes(request) + per_message * messages + fixed


def completion_token_bound(request: GenerationRequest, max_tokens: int | None = None) -> int:
    """The most completion tokens: `n` choices of `max_tokens` (the request's, or a backend's
    lower cap)."""
    cap = request.max_tokens if max_tokens is None else min(request.max_tokens, max_tokens)
    return request.n * max(0, cap)
