"""OpenAI's response shapes, built whole from what the cascade found, so a route only sends them.

A response, a stream's chunk or a stream's last chunk is made by one call here from the request,
the cascade's result, the tool answers and the logprobs the client asked to see; nothing edits it
afterwards. The chat and legacy completions endpoints differ only in these shapes, so each is a
`Shape` (CHAT, COMPLETION) that the route is given and serves with one body of code. A live stream
is rendered through the shape's `writer` (router.api.sse.StreamWriter): here OpenAI's data-only
chunks and `[DONE]`; the Responses and Messages surfaces (router.api.surfaces) name their events.

A shape's `response` and `cached` make the form the response cache stores (OpenAI's chat or
completions body); `shown` turns it into what the client receives, the same object for the two
OpenAI endpoints, and the surface's own response for the Responses and Messages APIs, which are
rendered from the chat form.

Tool calls reach the client as OpenAI gives them: a message's `tool_calls` with content null when
the answer is only calls, finish_reason `tool_calls` when it ended on its own, and in a stream one
chunk per call's head followed by its arguments in fragments. The calls are the ones
router.structured.tools read from the answer, the same ones the verifiers checked.

Logprobs are served in OpenAI's two shapes: chat's `logprobs.content[]` (token, logprob, bytes,
top_logprobs[]) and the legacy completions object (tokens, token_logprobs, top_logprobs as one
dict per token, text_offset). The backend is always asked for at least one alternative, since
that is how it returns each token's piece, and a client sees only the k it asked for (the
cascade may have asked for more for its verifiers). Tokens past a stop sequence, whose text the
client never gets, are left out. Where the answering tier gives no logprobs (an upstream that
refuses them) the field is null.
"""

from __future__ import annotations

import json
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from router.api.errors import error_response
from router.api.extension import cached_extension, extension
from router.api.sse import StreamWriter, sse
from router.cache.answer import CachedAnswer
from router.cascade import CascadeResult
from router.generation import Generation, GenerationRequest, TokenLogprob, ToolCall
from router.structured import tools
from router.structured.tools import ToolAnswer, argument_fragments


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(result: CascadeResult) -> dict[str, int]:
    g = result.generation
    return {
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.completion_tokens,
        "total_tokens": g.prompt_tokens + g.completion_tokens,
    }


def tool_calls_json(calls: Sequence[ToolCall], *, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"index": start + i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for i, c in enumerate(calls)
    ]


def finish_reason(found: ToolAnswer | None, reason: str) -> str:
    """`tool_calls` for an answer that made calls and ended on its own, as OpenAI reports it."""
    return "tool_calls" if found is not None and found.calls and reason == "stop" else reason


def shown_tokens(
    tokens: Sequence[TokenLogprob], text_start: int, text_end: int
) -> tuple[list[tuple[int, TokenLogprob]], list[TokenLogprob]]:
    """Split `tokens`, the first beginning at character `text_start`, into those that begin
    before `text_end` (the text the client has), each with its offset, and the rest: tokens past a
    stop sequence, or whose text a stream still holds back."""
    shown: list[tuple[int, TokenLogprob]] = []
    at = text_start
    for i, token in enumerate(tokens):
        if at >= text_end and token.token:
            return shown, list(tokens[i:])
        shown.append((at, token))
        at += len(token.token)
    return shown, []


def chat_logprobs(tokens: Sequence[tuple[int, TokenLogprob]], k: int) -> dict[str, Any]:
    def entry(piece: str, logprob: float) -> dict[str, Any]:
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8"))}

    return {
        "content": [
            {**entry(t.token, t.logprob), "top_logprobs": [entry(p, lp) for p, lp in t.top[:k]]} for _, t in tokens
        ],
        "refusal": None,
    }


def completion_logprobs(tokens: Sequence[tuple[int, TokenLogprob]], k: int) -> dict[str, Any]:
    tops: list[dict[str, float]] = []
    for _, t in tokens:
        top = dict(t.top[:k])
        top.setdefault(t.token, t.logprob)  # as OpenAI: the sampled token's is always there (k+1 at most)
        tops.append(top)
    return {
        "tokens": [t.token for _, t in tokens],
        "token_logprobs": [t.logprob for _, t in tokens],
        "top_logprobs": tops,
        "text_offset": [at for at, _ in tokens],
    }


def chat_chunk(
    rid: str,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    *,
    choice: int = 0,
    logprobs: dict[str, Any] | None = None,
    tail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One chunk of a chat stream; `tail` holds the fields only a stream's last chunk carries."""
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": choice, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}],
        **(tail or {}),
    }


def completion_chunk(
    rid: str,
    model: str,
    text: str,
    finish_reason: str | None = None,
    *,
    choice: int = 0,
    logprobs: dict[str, Any] | None = None,
    tail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": choice, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}],
        **(tail or {}),
    }


def tool_call_chunks(rid: str, model: str, calls: Sequence[ToolCall], *, choice: int = 0) -> list[dict[str, Any]]:
    """Calls as OpenAI streams them: per call a chunk with its index, id, type and name (and empty
    arguments), then its arguments in fragments under the same index."""
    chunks = []
    for i, c in enumerate(calls):
        head = {"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
        chunks.append(chat_chunk(rid, model, {"tool_calls": [head]}, choice=choice))
        for fragment in argument_fragments(c.arguments):
            if fragment:
                piece = {"index": i, "function": {"arguments": fragment}}
                chunks.append(chat_chunk(rid, model, {"tool_calls": [piece]}, choice=choice))
    return chunks


def tool_answer_chunks(rid: str, tier: str, found: ToolAnswer, text: str, sent: int) -> list[dict[str, Any]]:
    """The end of a streamed answer to a request with tools: its calls, or, when it made none, the
    text held back in case it began one (`sent`: the characters of `text` already streamed)."""
    if found.calls:
        return tool_call_chunks(rid, tier, found.calls)
    rest = text[sent:]
    return [chat_chunk(rid, tier, {"content": rest})] if rest else []


def _tail(tierroute: dict[str, Any], usage: dict[str, int] | None) -> dict[str, Any]:
    """What a stream's last chunk carries: the `tierroute` object, then usage when it was asked for."""
    return {"tierroute": tierroute} if usage is None else {"tierroute": tierroute, "usage": usage}


class Shape(ABC):
    """One endpoint's shapes: a whole response, and a stream's opening, pieces and last chunk."""

    object: str  # the response's `object`

    @abstractmethod
    def logprobs(self, shown: Sequence[tuple[int, TokenLogprob]], k: int) -> dict[str, Any]:
        """The tokens a client has, with up to k alternatives each, in this endpoint's shape."""

    @abstractmethod
    def _choice(
        self, i: int, g: Generation, found: ToolAnswer | None, logprobs: dict[str, Any] | None
    ) -> dict[str, Any]: ...

    def response(
        self,
        rid: str,
        request: GenerationRequest,
        result: CascadeResult,
        wanted: int | None,
        cache: str | None = None,
        *,
        found: ToolAnswer | None = None,
    ) -> dict[str, Any]:
        """The answer whole: per choice its text or tool calls, and its logprobs (`wanted`: how many
        alternatives the client asked to see; None: no logprobs). `found`: the first choice's tool
        answer when a stream has read it already (its calls' ids are the ones the client was sent)."""
        choices = []
        given = found
        for i, g in enumerate(result.generation.choices):
            if i == 0 and given is not None:
                found = given
            else:
                found = tools.answer(request, g) if request.offers_tools else None
            logprobs = None
            if wanted is not None and g.top_logprobs is not None:
                shown, _ = shown_tokens(g.top_logprobs, 0, len(g.text))
                logprobs = self.logprobs(shown, wanted)
            choices.append(self._choice(i, g, found, logprobs))
        return {
            "id": rid,
            "object": self.object,
            "created": int(time.time()),
            "model": result.final.tier,
            "choices": choices,
            "usage": usage(result),
            "tierroute": extension(rid, result, cache),
        }

    def cached(self, rid: str, hit: CachedAnswer, stages: dict[str, Any] | None = None) -> dict[str, Any]:
        """A cache hit whole: the stored answer's choices and usage as first served, under this
        request's id and time (`replay` streams it like any whole answer)."""
        return {
            "id": rid,
            "object": self.object,
            "created": int(time.time()),
            "model": hit.model,
            "choices": hit.choices,
            "usage": dict(hit.usage),
            "tierroute": cached_extension(rid, hit, stages),
        }

    def shown(self, payload: dict[str, Any]) -> dict[str, Any]:
        """What the client receives of a `response` or `cached` body: the body itself here."""
        return payload

    def writer(self, rid: str, tier: str, request: GenerationRequest) -> StreamWriter:
        """The renderer of one live stream: OpenAI's chunks, then [DONE]."""
        return ChunkWriter(self, rid, tier)

    def replay_events(self, payload: dict[str, Any], include_usage: bool) -> list[bytes]:
        """A whole answer (`response`'s or `cached`'s) as the stream of it a client receives."""
        return [*(sse(chunk) for chunk in self.replay(payload, include_usage)), sse("[DONE]")]

    def opening(self, rid: str, tier: str) -> dict[str, Any] | None:
        """The chunk a stream begins with, before any text; None: it begins with its text."""
        return None

    @abstractmethod
    def delta(self, rid: str, tier: str, text: str, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """A streamed piece of text, with the logprobs of the tokens it completes."""

    @abstractmethod
    def _finish(self, rid: str, tier: str, reason: str, tail: dict[str, Any], *, choice: int = 0) -> dict[str, Any]: ...

    def final(
        self,
        rid: str,
        tier: str,
        result: CascadeResult,
        found: ToolAnswer | None,
        *,
        include_usage: bool,
        cache: str | None = None,
    ) -> dict[str, Any]:
        """A stream's last chunk: its finish_reason (`tool_calls` when `found`, the streamed
        answer's tool answer, made calls), the `tierroute` object, and usage when it was asked for."""
        reason = finish_reason(found, result.generation.finish_reason)
        tail = _tail(extension(rid, result, cache), usage(result) if include_usage else None)
        return self._finish(rid, tier, reason, tail)

    @abstractmethod
    def replay(self, payload: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
        """A finished answer (`response`'s) as OpenAI streams one: per choice its opening, its text
        (or calls) and its finish; the `tierroute` object (and usage, when asked) on the last chunk."""


class ChatShape(Shape):
    object = "chat.completion"

    def logprobs(self, shown: Sequence[tuple[int, TokenLogprob]], k: int) -> dict[str, Any]:
        return chat_logprobs(shown, k)

    def _choice(
        self, i: int, g: Generation, found: ToolAnswer | None, logprobs: dict[str, Any] | None
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": g.text}
        if found is not None and found.calls:
            calls = tool_calls_json(found.calls)
            for call in calls:
                del call["index"]  # a stream's field, not a message's
            message = {"role": "assistant", "content": found.content, "tool_calls": calls}
        return {
            "index": i,
            "message": message,
            "finish_reason": finish_reason(found, g.finish_reason),
            "logprobs": logprobs,
        }

    def opening(self, rid: str, tier: str) -> dict[str, Any]:
        return chat_chunk(rid, tier, {"role": "assistant", "content": ""})  # OpenAI's first chunk carries the role

    def delta(self, rid: str, tier: str, text: str, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        return chat_chunk(rid, tier, {"content": text}, logprobs=logprobs)

    def _finish(self, rid: str, tier: str, reason: str, tail: dict[str, Any], *, choice: int = 0) -> dict[str, Any]:
        return chat_chunk(rid, tier, {}, reason, choice=choice, tail=tail)

    def replay(self, payload: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
        rid, tier, choices = payload["id"], payload["model"], payload["choices"]
        chunks: list[dict[str, Any]] = []
        for choice in choices:
            i, message = choice["index"], choice["message"]
            chunks.append(chat_chunk(rid, tier, {"role": "assistant", "content": ""}, choice=i))
            if message["content"]:
                delta = {"content": message["content"]}
                chunks.append(chat_chunk(rid, tier, delta, choice=i, logprobs=choice["logprobs"]))
            for j, call in enumerate(message.get("tool_calls") or ()):
                chunks.append(chat_chunk(rid, tier, {"tool_calls": [{"index": j, **call}]}, choice=i))
            tail = _replay_tail(payload, include_usage) if choice is choices[-1] else None
            chunks.append(chat_chunk(rid, tier, {}, choice["finish_reason"], choice=i, tail=tail))
        return chunks


class CompletionShape(Shape):
    object = "text_completion"

    def logprobs(self, shown: Sequence[tuple[int, TokenLogprob]], k: int) -> dict[str, Any]:
        return completion_logprobs(shown, k)

    def _choice(
        self, i: int, g: Generation, found: ToolAnswer | None, logprobs: dict[str, Any] | None
    ) -> dict[str, Any]:
        # the legacy endpoint refuses tools (router.api.requests): `found` is always None here
        return {"index": i, "text": g.text, "finish_reason": g.finish_reason, "logprobs": logprobs}

    def delta(self, rid: str, tier: str, text: str, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        return completion_chunk(rid, tier, text, logprobs=logprobs)

    def _finish(self, rid: str, tier: str, reason: str, tail: dict[str, Any], *, choice: int = 0) -> dict[str, Any]:
        return completion_chunk(rid, tier, "", reason, choice=choice, tail=tail)

    def replay(self, payload: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
        rid, tier, choices = payload["id"], payload["model"], payload["choices"]
        chunks: list[dict[str, Any]] = []
        for choice in choices:
            i = choice["index"]
            tail = _replay_tail(payload, include_usage) if choice is choices[-1] else None
            chunks += [
                completion_chunk(rid, tier, choice["text"], choice=i, logprobs=choice["logprobs"]),
                completion_chunk(rid, tier, "", choice["finish_reason"], choice=i, tail=tail),
            ]
        return chunks


class ChunkWriter(StreamWriter):
    """A live stream in OpenAI's chunks (`Shape.opening`, `delta`, `final`), then [DONE]; an
    error after output began is a last `data: {"error": ...}` event."""

    def __init__(self, shape: Shape, rid: str, tier: str) -> None:
        self.shape, self.rid, self.tier = shape, rid, tier

    def opening(self) -> list[bytes]:
        opening = self.shape.opening(self.rid, self.tier)
        return [] if opening is None else [sse(opening)]

    def text(self, text: str, logprobs: dict[str, Any] | None) -> list[bytes]:
        return [sse(self.shape.delta(self.rid, self.tier, text, logprobs))]

    def held(self, found: ToolAnswer, text: str, sent: int) -> list[bytes]:
        return [sse(chunk) for chunk in tool_answer_chunks(self.rid, self.tier, found, text, sent)]

    def final(
        self, result: CascadeResult, found: ToolAnswer | None, *, include_usage: bool, cache: str | None
    ) -> list[bytes]:
        return [sse(self.shape.final(self.rid, self.tier, result, found, include_usage=include_usage, cache=cache))]

    def done(self) -> list[bytes]:
        return [sse("[DONE]")]

    def failed(self, exc: BaseException) -> list[bytes]:
        return [sse(json.loads(bytes(error_response(exc).body)))]


def _replay_tail(payload: dict[str, Any], include_usage: bool) -> dict[str, Any]:
    return _tail(payload["tierroute"], payload["usage"] if include_usage else None)


CHAT = ChatShape()
COMPLETION = CompletionShape()
