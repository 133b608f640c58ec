"""The Responses API's response and stream, rendered from the chat form of the cascade's answer.

A response is `{"id": "resp_…", "object": "response", "status", "output": [...], "usage", …}`,
its `output` a `message` item (one `output_text` part) when the answer has text, and one
`function_call` item per call (`call_id` the call's id, which the client's `function_call_output`
answers). An answer cut by `max_output_tokens` is `status: "incomplete"` with
`incomplete_details.reason`, as OpenAI reports it. The request's settings are echoed as OpenAI
echoes them, and the `tierroute` object rides on the response (in a stream, on the response of
its last event).

A stream is named events, each with a `sequence_number` from 0, in the order the official SDK's
stream helper (`client.responses.stream`) reads them: `response.created`, `response.in_progress`,
then per output item `response.output_item.added`, for a message `response.content_part.added`,
`response.output_text.delta`…, `response.output_text.done`, `response.content_part.done`, for a
call `response.function_call_arguments.delta`…, `response.function_call_arguments.done`, then
`response.output_item.done`; last `response.completed` (or `response.incomplete`) carrying the
whole response, whose output is exactly the items streamed. A failure after output began is a
last `response.failed` whose `error` says why (OpenAI's error code and message) and whose
`output` holds what was sent (a message cut midway as `incomplete`); no `[DONE]`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from router.api.errors import error_response
from router.api.responses import ChatShape
from router.api.sse import StreamWriter, named
from router.api.surfaces.responses_protocol import ResponsesRequest
from router.cascade import CascadeResult
from router.generation import GenerationRequest
from router.structured.tools import ToolAnswer, argument_fragments


def usage_of(usage: dict[str, int]) -> dict[str, Any]:
    """Chat's usage as the Responses API reports it."""
    prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


class ResponsesShape(ChatShape):
    """One Responses request's shapes: the chat form (what the cache keeps) shown as a response."""

    object = "response"

    def __init__(self, body: ResponsesRequest) -> None:
        fmt = body.text.format if body.text is not None else None
        self.echo: dict[str, Any] = {
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "temperature": 0.0 if body.temperature is None else body.temperature,
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "tool_choice": "auto" if body.tool_choice is None else body.tool_choice,
            "tools": list(body.tools or ()),
            "text": {"format": {"type": "text"} if fmt is None else fmt.model_dump(by_alias=True, exclude_none=True)},
            "store": False,
            "background": False,
            "truncation": "disabled",
            "previous_response_id": None,
            "reasoning": None,
            "metadata": None,
            "user": body.user,
        }

    def skeleton(self, rid: str, tier: str, status: str, created: float | None = None) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()) if created is None else created,
            "status": status,
            "model": tier,
            "output": [],
            "error": None,
            "incomplete_details": None,
            "usage": None,
            **self.echo,
        }

    def shown(self, payload: dict[str, Any]) -> dict[str, Any]:
        choice = payload["choices"][0]
        message, cut = choice["message"], choice["finish_reason"] == "length"
        base = payload["id"].removeprefix("resp_")
        calls = message.get("tool_calls") or []
        output = []
        if message.get("content") or not calls:
            output.append(_message(f"msg_{base}", message.get("content") or "", "incomplete" if cut else "completed"))
        for k, c in enumerate(calls):
            f = c["function"]
            output.append(_call(f"fc_{base}_{k}", c["id"], f["name"], f["arguments"], "completed"))
        status = "incomplete" if cut else "completed"
        return {
            **self.skeleton(payload["id"], payload["model"], status, payload.get("created")),
            "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "usage": usage_of(payload["usage"]),
            "tierroute": payload["tierroute"],
        }

    def writer(self, rid: str, tier: str, request: GenerationRequest) -> StreamWriter:
        return ResponsesWriter(self, rid, tier, request)

    def replay_events(self, payload: dict[str, Any], include_usage: bool) -> list[bytes]:
        """A whole response (`shown`'s) as its stream: every item streamed whole."""
        events = _Events()
        out = events.opening({**payload, "status": "in_progress", "output": [], "usage": None})
        for index, item in enumerate(payload["output"]):
            out += events.item(index, item)
        return [*out, events.last(payload)]


class _Events:
    """A Responses stream's events, numbered from 0."""

    def __init__(self) -> None:
        self.sequence = 0

    def emit(self, kind: str, **fields: Any) -> bytes:
        event = named(kind, {"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        return event

    def opening(self, snapshot: dict[str, Any]) -> list[bytes]:
        return [self.emit("response.created", response=snapshot), self.emit("response.in_progress", response=snapshot)]

    def open_message(self, index: int, item: dict[str, Any]) -> list[bytes]:
        at = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            self.emit("response.output_item.added", output_index=index, item={**item, "content": []}),
            self.emit("response.content_part.added", **at, part=_text_part("")),
        ]

    def text(self, index: int, item_id: str, delta: str) -> bytes:
        at = {"item_id": item_id, "output_index": index, "content_index": 0}
        return self.emit("response.output_text.delta", **at, delta=delta, logprobs=[])

    def close_message(self, index: int, item: dict[str, Any]) -> list[bytes]:
        at = {"item_id": item["id"], "output_index": index, "content_index": 0}
        part = item["content"][0]
        return [
            self.emit("response.output_text.done", **at, text=part["text"], logprobs=[]),
            self.emit("response.content_part.done", **at, part=part),
            self.emit("response.output_item.done", output_index=index, item=item),
        ]

    def call(self, index: int, item: dict[str, Any]) -> list[bytes]:
        at = {"item_id": item["id"], "output_index": index}
        out = [self.emit("response.output_item.added", output_index=index, item={**item, "arguments": ""})]
        out += [
            self.emit("response.function_call_arguments.delta", **at, delta=fragment)
            for fragment in argument_fragments(item["arguments"])
            if fragment
        ]
        out.append(
            self.emit("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
        )
        out.append(self.emit("response.output_item.done", output_index=index, item=item))
        return out

    def item(self, index: int, item: dict[str, Any]) -> list[bytes]:
        """One whole item (a replayed answer's)."""
        if item["type"] == "function_call":
            return self.call(index, item)
        text = item["content"][0]["text"] if item["content"] else ""
        out = self.open_message(index, {**item, "status": "in_progress"})
        if text:
            out.append(self.text(index, item["id"], text))
        return out + self.close_message(index, item)

    def last(self, response: dict[str, Any]) -> bytes:
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return self.emit(kind, response=response)


class ResponsesWriter(StreamWriter):
    """A live answer as Responses events: the message item opens at the first text, the calls
    follow once the answer is read whole, and the last event's response holds the items sent."""

    def __init__(self, shape: ResponsesShape, rid: str, tier: str, request: GenerationRequest) -> None:
        self.shape, self.rid, self.tier, self.request = shape, rid, tier, request
        self.events = _Events()
        self.base = rid.removeprefix("resp_")
        self.items: list[dict[str, Any]] = []  # the items done so far
        self.text_sent: str | None = None  # the open message's text; None: no message open

    def opening(self) -> list[bytes]:
        return self.events.opening(self.shape.skeleton(self.rid, self.tier, "in_progress"))

    def text(self, text: str, logprobs: dict[str, Any] | None) -> list[bytes]:
        if not text:
            return []
        out = []
        if self.text_sent is None:
            self.text_sent = ""
            out += self.events.open_message(len(self.items), _message(f"msg_{self.base}", None, "in_progress"))
        self.text_sent += text
        out.append(self.events.text(len(self.items), f"msg_{self.base}", text))
        return out

    def _close(self, status: str) -> list[bytes]:
        if self.text_sent is None:
            return []
        item = _message(f"msg_{self.base}", self.text_sent, status)
        out = self.events.close_message(len(self.items), item)
        self.items.append(item)
        self.text_sent = None
        return out

    def held(self, found: ToolAnswer, text: str, sent: int) -> list[bytes]:
        if not found.calls:
            return self.text(text[sent:], None)
        out = self._close("completed")
        for k, c in enumerate(found.calls):
            item = _call(f"fc_{self.base}_{k}", c.id, c.name, c.arguments, "completed")
            out += self.events.call(len(self.items), item)
            self.items.append(item)
        return out

    def final(
        self, result: CascadeResult, found: ToolAnswer | None, *, include_usage: bool, cache: str | None
    ) -> list[bytes]:
        cut = result.generation.finish_reason == "length"
        out = []
        if not self.items and self.text_sent is None:  # an empty answer: an empty message, as OpenAI sends
            out += self.events.open_message(0, _message(f"msg_{self.base}", None, "in_progress"))
            self.text_sent = ""
        out += self._close("incomplete" if cut else "completed")
        stored = self.shape.response(self.rid, self.request, result, None, cache, found=found)
        response = {**self.shape.shown(stored), "output": self.items}
        return [*out, self.events.last(response)]

    def done(self) -> list[bytes]:
        return []

    def failed(self, exc: BaseException) -> list[bytes]:
        """The last event: `response.failed`, its output every item the client was sent, the
        message whose text was streaming among them (`incomplete`, with the text sent)."""
        error = json.loads(bytes(error_response(exc).body))["error"]
        sent = self.items
        if self.text_sent is not None:
            sent = [*sent, _message(f"msg_{self.base}", self.text_sent, "incomplete")]
        response = {
            **self.shape.skeleton(self.rid, self.tier, "failed"),
            "output": sent,
            "error": {"code": error.get("code") or error["type"], "message": error["message"]},
        }
        return [self.events.emit("response.failed", response=response)]
