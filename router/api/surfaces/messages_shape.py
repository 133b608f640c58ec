"""Anthropic's Messages response and stream, rendered from the chat form of the cascade's answer.

A message is `{"id": "msg_…", "type": "message", "role": "assistant", "content": [...],
"stop_reason", "stop_sequence", "usage": {"input_tokens", "output_tokens"}, "model"}`, its content
a `text` block when the answer has text and a `tool_use` block per call (`id` the call's id, which
the client's `tool_result` answers; `input` its arguments as an object). `stop_reason` is
`tool_use` for an answer that made calls, `max_tokens` for one cut by `max_tokens`, else
`end_turn` (also when a stop sequence ended it: tierroute's tiers do not say which ended an
answer, so `stop_sequence` is null). The `tierroute` object rides on the message (in a stream, on
its `message_delta` event).

A stream is Anthropic's named events: `message_start` (the message, empty), per block
`content_block_start`, `content_block_delta` (`text_delta`, or `input_json_delta` fragments of a
call's input), `content_block_stop`; then `message_delta` (`stop_reason`, usage) and
`message_stop`. A failure after output began is an `error` event in Anthropic's error shape.
"""

from __future__ import annotations

import json
from typing import Any

from router.api.errors import error_response
from router.api.responses import ChatShape
from router.api.sse import StreamWriter, named
from router.cascade import CascadeResult
from router.generation import GenerationRequest
from router.structured.tools import ToolAnswer, argument_fragments, decode_arguments

_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as a tool_use block's `input`, which Anthropic makes an object: JSON
    that is not an object (the tool check scored such a call 0) is kept whole under `_arguments`."""
    value, _ = decode_arguments(arguments)
    return value if isinstance(value, dict) else {"_arguments": arguments}


def _usage(usage: dict[str, int]) -> dict[str, int]:
    return {
        "input_tokens": usage["prompt_tokens"],
        "output_tokens": usage["completion_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


class MessagesShape(ChatShape):
    """The chat form (what the cache keeps) shown as an Anthropic message."""

    object = "message"

    def shown(self, payload: dict[str, Any]) -> dict[str, Any]:
        choice = payload["choices"][0]
        message = choice["message"]
        content: list[dict[str, Any]] = []
        if message.get("content") or not message.get("tool_calls"):
            content.append({"type": "text", "text": message.get("content") or ""})
        for c in message.get("tool_calls") or ():
            f = c["function"]
            content.append({"type": "tool_use", "id": c["id"], "name": f["name"], "input": tool_input(f["arguments"])})
        return {
            "id": payload["id"],
            "type": "message",
            "role": "assistant",
            "model": payload["model"],
            "content": content,
            "stop_reason": _STOP_REASONS.get(choice["finish_reason"], "end_turn"),
            "stop_sequence": None,
            "usage": _usage(payload["usage"]),
            "tierroute": payload["tierroute"],
        }

    def writer(self, rid: str, tier: str, request: GenerationRequest) -> StreamWriter:
        return MessagesWriter(self, rid, tier, request)

    def replay_events(self, payload: dict[str, Any], include_usage: bool) -> list[bytes]:
        """A whole message (`shown`'s) as its stream: every block sent whole."""
        out = [_start(payload["id"], payload["model"])]
        for index, block in enumerate(payload["content"]):
            out += _block(index, block)
        return [*out, *_end(payload)]


def _start(rid: str, tier: str) -> bytes:
    message: dict[str, Any] = {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": tier,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
    return named("message_start", {"type": "message_start", "message": message})


def _block_start(index: int, block: dict[str, Any]) -> bytes:
    return named("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def _delta(index: int, delta: dict[str, Any]) -> bytes:
    return named("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _block_stop(index: int) -> bytes:
    return named("content_block_stop", {"type": "content_block_stop", "index": index})


def _tool_use(index: int, block: dict[str, Any]) -> list[bytes]:
    out = [_block_start(index, {**block, "input": {}})]
    text = json.dumps(block["input"], separators=(",", ":"), ensure_ascii=False)
    out += [_delta(index, {"type": "input_json_delta", "partial_json": f}) for f in argument_fragments(text) if f]
    return [*out, _block_stop(index)]


def _block(index: int, block: dict[str, Any]) -> list[bytes]:
    if block["type"] == "tool_use":
        return _tool_use(index, block)
    out = [_block_start(index, {"type": "text", "text": ""})]
    if block["text"]:
        out.append(_delta(index, {"type": "text_delta", "text": block["text"]}))
    return [*out, _block_stop(index)]


def _end(message: dict[str, Any]) -> list[bytes]:
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    usage = message["usage"]
    last = {"type": "message_delta", "delta": delta, "usage": usage, "tierroute": message["tierroute"]}
    return [named("message_delta", last), named("message_stop", {"type": "message_stop"})]


class MessagesWriter(StreamWriter):
    """A live answer as Messages events: a text block opens at the first text, tool_use blocks
    follow once the answer is read whole."""

    def __init__(self, shape: MessagesShape, rid: str, tier: str, request: GenerationRequest) -> None:
        self.shape, self.rid, self.tier, self.request = shape, rid, tier, request
        self.blocks = 0  # blocks begun so far
        self.open = False  # a text block is open

    def opening(self) -> list[bytes]:
        return [_start(self.rid, self.tier)]

    def text(self, text: str, logprobs: dict[str, Any] | None) -> list[bytes]:
        if not text:
            return []
        out = []
        if not self.open:
            out.append(_block_start(self.blocks, {"type": "text", "text": ""}))
            self.open, self.blocks = True, self.blocks + 1
        out.append(_delta(self.blocks - 1, {"type": "text_delta", "text": text}))
        return out

    def _close(self) -> list[bytes]:
        if not self.open:
            return []
        self.open = False
        return [_block_stop(self.blocks - 1)]

    def held(self, found: ToolAnswer, text: str, sent: int) -> list[bytes]:
        if not found.calls:
            return self.text(text[sent:], None)
        out = self._close()
        for c in found.calls:
            block = {"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(c.arguments)}
            out += _tool_use(self.blocks, block)
            self.blocks += 1
        return out

    def final(
        self, result: CascadeResult, found: ToolAnswer | None, *, include_usage: bool, cache: str | None
    ) -> list[bytes]:
        out = []
        if self.blocks == 0:  # an empty answer: one empty text block, as the whole message has
            out.append(_block_start(0, {"type": "text", "text": ""}))
            self.open, self.blocks = True, 1
        out += self._close()
        stored = self.shape.response(self.rid, self.request, result, None, cache, found=found)
        return [*out, *_end(self.shape.shown(stored))]

    def done(self) -> list[bytes]:
        return []

    def failed(self, exc: BaseException) -> list[bytes]:
        return [named("error", json.loads(bytes(error_response(exc, "anthropic").body)))]


def count_response(tokens: int) -> dict[str, int]:
    """count_tokens' answer."""
    return {"input_tokens": tokens}
