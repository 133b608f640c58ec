"""Server-Sent Events as the surfaces send them, and the writer a live stream is rendered through.

OpenAI's chat and completions streams are data-only events ending in `data: [DONE]`; the
Responses and Messages APIs name each event (`event: response.output_text.delta`) and end on a
named last event. A `StreamWriter` is one stream's renderer: the pipeline's SSE body
(`router.pipeline.streaming.live_events`) hands it the answer's pieces in order, and it returns
the bytes to send. It may keep state (a Responses stream numbers its events; a Messages stream
counts its content blocks), so a shape makes a new one per stream (`Shape.writer`).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router.cascade import CascadeResult
    from router.structured.tools import ToolAnswer


def sse(payload: dict[str, Any] | str) -> bytes:
    """A data-only event (OpenAI's chat and completions chunks, and their `[DONE]`)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def named(name: str, payload: dict[str, Any]) -> bytes:
    """A named event, as the Responses and Messages APIs send every one."""
    return f"event: {name}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class StreamWriter(ABC):
    """One live stream's renderer: what to send at each step of the answer."""

    @abstractmethod
    def opening(self) -> list[bytes]:
        """Before any text."""

    @abstractmethod
    def text(self, text: str, logprobs: dict[str, Any] | None) -> list[bytes]:
        """A piece of the answer's text (may be empty: an engine's empty delta), with the
        logprobs of the tokens it completes in the shape's form."""

    @abstractmethod
    def held(self, found: ToolAnswer, text: str, sent: int) -> list[bytes]:
        """At the end of an answer to a request with tools: its calls, or, when it made none, the
        text held back in case it began one (`sent`: characters of `text` already streamed)."""

    @abstractmethod
    def final(
        self, result: CascadeResult, found: ToolAnswer | None, *, include_usage: bool, cache: str | None
    ) -> list[bytes]:
        """The answer's end: finish reason, usage, the `tierroute` object (after its ledger row)."""

    @abstractmethod
    def done(self) -> list[bytes]:
        """After the last event (OpenAI's `[DONE]`; nothing where the last event is named)."""

    @abstractmethod
    def failed(self, exc: BaseException) -> list[bytes]:
        """The stream's end when it fails after output began: the error in-band."""
