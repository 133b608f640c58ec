"""Reading an upstream's stream: its chunks folded into one answer, within the stream's bounds.

Each chunk is read as a plain answer is (`router.backends.openai.reading`: types checked, text made
valid Unicode, logprobs and top-k clamped, usage held to what the request could cost), and the
stream as a whole is bounded: `router.backends.openai.upstream_io.SSEReader` caps its events at
`max_stream_events`, and pieces of text and tool-call fragments are capped at `Call.piece_limit`
(twice `max_tokens`, plus a slack), so an upstream that ignores `max_tokens` is stopped there. Too
much is `Unacceptable`: an upstream failure, tried again only at another deployment.

A stream is complete when the upstream sent a `finish_reason`. One that ends without (the
connection closed, or `data: [DONE]` alone) is cut, and the backend raises (`Cut`): a `[DONE]`
without a `finish_reason` is not a server saying the answer is whole. llama-cpp-python's server,
with its default `--interrupt_requests true`, ends a running stream that way when another request
arrives: taken as complete, one tenant's request cut another's answer short and it was passed
off as finished (`stop`, 44 characters of 201; issue 38's review).

One piece without logprobs makes the whole answer's logprobs unusable, and one without well-formed
top-k its top-k: a gap would misplace every later token. Counts the server does not report are
estimated (about one token per chunk, exactly one per logprob), never above `max_tokens`; counts it
reports, and those estimated, are held to the floors a plain answer's are (`reading`), by one rule
(`Accumulator.so_far`) for every piece, for a stream cut short (priced from its last piece) and for
the final answer: a usage chunk of 0/0 early in a stream that is then cut costs what was delivered.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from router.backends.openai.call import Call, estimate_prompt_tokens
from router.backends.openai.reading import (
    arguments_text,
    chars_tokens,
    checked_usage,
    finish_reason,
    prompt_floor,
    raised,
    tool_call,
    top_logprobs,
)
from router.backends.openai.upstream_io import (
    Malformed,
    SSEReader,
    Unacceptable,
    clean_text,
    event_object,
    first_choice,
    model_name,
    token_logprobs,
    typed_field,
)
from router.generation import Generation, TokenLogprob, ToolCall
from router.structured.tools import MAX_CALLS


async def next_piece(events: SSEReader, acc: Accumulator, call: Call) -> str | None:
    """The next non-empty piece of text, or None when the stream has ended."""
    while True:
        async with asyncio.timeout(call.remaining()):
            data = await events.next()
        if data is None:
            return None
        piece = acc.add(event_object(data), call)
        if piece:
            return piece


@dataclass
class _StreamedCall:
    id: str | None = None
    name: str = ""
    arguments: str = ""


@dataclass
class Accumulator:
    """Folds stream chunks into the final answer."""

    chat: bool
    logprobs: bool
    tier: str
    top_k: int = 0  # top-k alternatives asked for; 0: none read
    parts: list[str] = field(default_factory=list)
    token_logprobs: list[float] | None = field(default_factory=list)
    tops: list[TokenLogprob] | None = field(default_factory=list)
    unsent_tops: int = 0  # index of the first token not yet handed out with a piece
    finish_reason: str | None = None
    chunks: int = 0  # completion chunks seen, with or without text
    usage: tuple[int | None, int | None] = (None, None)
    model: str | None = None
    prompt_estimate: int | None = None  # when the server reports no usage
    calls: dict[int, _StreamedCall] | None = None  # streamed tool calls by index; None: not read
    call_fragments: int = 0
    delivered_chars: int = 0  # of text and tool calls: what the completion floor counts
    prompt_min: int | None = None  # the prompt's floor (made once per call)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, chunk: dict[str, Any], call: Call) -> str:
        if "usage" in chunk and chunk["usage"] is not None:
            self.usage = checked_usage(chunk["usage"], call, self.tier)
        model = model_name(chunk.get("model"))
        if model:
            self.model = model
        choice = first_choice(chunk.get("choices"), required=False)
        if choice is None:
            return ""
        self.chunks += 1
        if self.chat:
            delta = typed_field(choice, "delta", dict) or {}
            piece = typed_field(delta, "content", str) or ""
            if self.calls is not None:
                self._add_calls(delta, call)
        else:
            piece = typed_field(choice, "text", str) or ""
        finish = typed_field(choice, "finish_reason", str)
        if piece and self.token_logprobs is not None:
            lps = token_logprobs(choice.get("logprobs")) if self.logprobs else None
            if lps is None:
                self.token_logprobs = None  # one piece without them makes the set unusable
            else:
                self.token_logprobs.extend(lps)
        if piece and self.top_k and self.tops is not None:
            tops = top_logprobs(choice.get("logprobs"), self.top_k, call.completion_limit - len(self.tops))
            if tops is None:
                self.tops = None  # as for the logprobs: a gap would misplace every later token
            else:
                self.tops.extend(tops)
        if finish:
            self.finish_reason = finish
        piece = clean_text(piece)
        if piece:
            self.parts.append(piece)
            self.delivered_chars += len(piece)
            if len(self.parts) > call.piece_limit:
                raise Unacceptable(
                    f"a stream of more than {call.piece_limit} pieces of text for max_tokens={call.max_tokens}"
                )
        return piece

    def _add_calls(self, delta: dict[str, Any], call: Call) -> None:
        """Fragments of tool calls, as OpenAI streams them: by index, the id and name first, the
        arguments in pieces. Each fragment counts as a piece against the stream's bound."""
        assert self.calls is not None
        for raw in typed_field(delta, "tool_calls", list) or ():
            if not isinstance(raw, dict):
                raise Malformed(f"a streamed tool call is {type(raw).__name__}, not an object")
            index = raw.get("index", 0)
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_CALLS:
                raise Malformed(f"a streamed tool call's index is {str(index)[:32]!r}")
            function = typed_field(raw, "function", dict) or {}
            entry = self.calls.setdefault(index, _StreamedCall())
            entry.id = entry.id or typed_field(raw, "id", str)
            # OpenAI sends the name once; llama-cpp-python's server repeats it in every fragment
            named = bool(entry.name)
            entry.name = entry.name or typed_field(function, "name", str) or ""
            arguments = function.get("arguments")
            fragment = arguments if isinstance(arguments, str) else arguments_text(arguments)
            entry.arguments += fragment
            self.delivered_chars += len(fragment) + (0 if named else len(entry.name))
            self.call_fragments += 1
            if self.call_fragments > call.piece_limit:
                raise Unacceptable(
                    f"a stream of more than {call.piece_limit} tool-call fragments for max_tokens={call.max_tokens}"
                )

    def tool_calls(self) -> tuple[ToolCall, ...] | None:
        if self.calls is None:
            return None
        ordered = [self.calls[i] for i in sorted(self.calls)]
        return tuple(tool_call(c.id, c.name, c.arguments) for c in ordered)

    def take_tops(self) -> tuple[TokenLogprob, ...] | None:
        """The tokens that arrived since the last piece handed out (None when none are kept)."""
        if not self.top_k or self.tops is None:
            return None
        taken = tuple(self.tops[self.unsent_tops :])
        self.unsent_tops = len(self.tops)
        return taken

    def complete(self) -> bool:
        """Whether the upstream said the answer is whole: a finish_reason (module docstring)."""
        return self.finish_reason is not None

    def prompt_count(self, call: Call) -> int:
        """The prompt tokens the server reported, else an estimate (made once per call)."""
        if self.usage[0] is not None:
            return self.usage[0]
        if self.prompt_estimate is None:
            self.prompt_estimate = estimate_prompt_tokens(call.request)
        return self.prompt_estimate

    def completion_count(self, call: Call) -> int:
        """Servers send about one token per chunk; logprobs, when present, count exactly. Never
        more than was asked for."""
        if self.usage[1] is not None:
            return self.usage[1]
        counted = len(self.token_logprobs) if self.token_logprobs else len(self.parts)
        return min(counted, call.max_tokens)

    def floors(self, call: Call) -> tuple[int, int]:
        """The fewest (prompt, completion) tokens what was sent and delivered so far can be
        (`reading`, usage floors)."""
        if self.prompt_min is None:
            self.prompt_min = prompt_floor(call)
        delivered = max(chars_tokens(self.delivered_chars), len(self.token_logprobs or ()))
        return self.prompt_min, min(delivered, call.completion_limit)

    def so_far(self, call: Call) -> tuple[int, int]:
        """(prompt, completion) tokens spent so far: as reported, else estimated, and never below
        their floors. The one rule for every piece, a stream cut short (priced from these) and the
        final answer (`generation`)."""
        prompt_min, completion_min = self.floors(call)
        completion = max(self.completion_count(call), completion_min)
        if self.usage[1] is None:  # an estimate: never more than was asked for
            completion = min(completion, call.max_tokens)
        return max(self.prompt_count(call), prompt_min), completion

    def generation(self, call: Call, default_model: str, *, ttft_s: float | None) -> Generation:
        text = self.text
        logprobs = tuple(self.token_logprobs) if self.token_logprobs is not None and text else None
        tops = tuple(self.tops) if self.top_k and self.tops is not None and text else None
        prompt_tokens, completion_tokens = self.so_far(call)
        reason = self.finish_reason or "stop"  # a cut stream is priced here too (`Cut`)
        # a reported count below its floor is said in the log and counted (`reading`: usage floors)
        names = ("prompt_tokens", "completion_tokens")
        for reported, floor, name in zip(self.usage, self.floors(call), names, strict=True):
            if reported is not None:
                raised(reported, floor, name, call, self.tier)
        return Generation(
            text=text,
            finish_reason=finish_reason(reason),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            token_logprobs=logprobs,
            latency_s=time.monotonic() - call.started,
            ttft_s=ttft_s,
            model=self.model or default_model,
            top_logprobs=tops,
            tool_calls=self.tool_calls(),
            constrained=None if call.request.response_format is not None else False,
        )
