"""What crosses the wire from an OpenAI-compatible upstream, bounded and checked before the
`openai` backend (`router.backends.openai`) reads it.

- `CappedTransport` is the httpx transport under the SDK's client: the one place every byte of a
  body, a stream and an error body passes. It asks for uncompressed answers and refuses compressed
  ones, refuses a declared size over the limit and stops reading at it, and follows no redirect.
- `SSEReader` splits a capped stream into server-sent events, with a bound on their number.
- The JSON helpers read answers from raw JSON rather than through the SDK's models, which let any
  type through: a wrong type is `Malformed` (retried like a 5xx), text is made valid Unicode, only
  choice 0 is read, logprobs must be finite and at most 0.

Refusals are typed: `Unacceptable` (over a limit, or compressed: not retried at that server; an upstream
failure unless the request asked for an answer that large, `router.backends.openai.answer_size`), `Malformed`
(not a well-formed answer), `ErrorEvent` (the stream carried an error object).
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import httpx2

_MODEL_NAME = re.compile(r"^[\x21-\x7e][\x20-\x7e]{0,199}$")
_SURROGATE = re.compile("[\ud800-\udfff]")
LOG_TEXT_CHARS = 4000  # of an upstream's own words in a log line: a log line is not a body

_T = TypeVar("_T")


class Malformed(Exception):
    """A 2xx answer that is not a well-formed completion."""


class Cut(Malformed):
    """A stream that ended (closed, or `[DONE]`) before a `finish_reason`: not a whole answer."""


class FewerChoices(Malformed):
    """An answer with fewer choices than the n asked for (llama-cpp-python's server ignores `n`):
    `answer`, the choices it did send, read and counted as any answer is."""

    def __init__(self, message: str, answer: Any) -> None:
        super().__init__(message)
        self.answer = answer


class ErrorEvent(Exception):
    """An error event inside a stream."""


class Unacceptable(Exception):
    """An answer refused whole: larger than the limits, or compressed. Raised inside the SDK's read,
    so it may reach us wrapped in the SDK's connection error. Its message may reach a client, so it
    holds only our words and numbers; `said`, what the upstream sent that was refused, is for the
    log alone. `size`: an answer (a 2xx body) refused for its bytes alone, which an honest answer
    to a request asking for much can reach (`router.backends.openai.answer_size` says whose fault).
    The counts of reads and events are not: an honest server sends about one event a token, and
    they allow 65,536 by default."""

    def __init__(self, message: str, *, said: str = "", size: bool = False) -> None:
        super().__init__(message)
        self.said = said
        self.size = size


class CappedTransport(httpx2.AsyncBaseTransport):
    """Every upstream response body, read through a byte limit (see the module docstring)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, *, max_bytes: int, max_reads: int) -> None:
        self._inner = inner
        self._max_bytes = max_bytes
        self._max_reads = max_reads

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        declared = response.headers.get("content-length", "").strip()
        answer = 200 <= response.status_code < 300  # an error body's size says nothing of the request
        refusal = None
        said = ""
        if encoding not in ("", "identity"):
            # the header's value is the upstream's words: the log's, never a client's
            refusal, said = "a compressed body though identity was asked for", f"Content-Encoding {encoding[:32]!r}"
        elif declared.isdigit() and (len(declared) > 18 or int(declared) > self._max_bytes):
            refusal = f"a declared body of {declared[:24]} bytes, over the limit of {self._max_bytes}"
        if refusal is not None:
            await response.aclose()
            raise Unacceptable(refusal, said=said, size=not said and answer)  # `said`: a compressed one
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=CappedStream(response.stream, self._max_bytes, self._max_reads, answer=answer),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def environment_proxy(url: str) -> str | None:
    """The proxy HTTP_PROXY/HTTPS_PROXY/ALL_PROXY name for `url`, unless NO_PROXY exempts its host.
    A backend talks to one base URL, so the choice is made once."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or urllib.request.proxy_bypass(parts.hostname):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")


class CappedStream(httpx2.AsyncByteStream):
    """A body read through two limits: its bytes, and the number of pieces it comes in (a body
    dribbled a byte per chunk would cost a trip through the event loop per byte)."""

    def __init__(self, inner: httpx2.AsyncByteStream, max_bytes: int, max_reads: int, *, answer: bool = True) -> None:
        self._inner = inner
        self._max_bytes = max_bytes
        self._max_reads = max_reads
        self._answer = answer  # a 2xx body: an answer, whose size the request may have asked for

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = reads = 0
        async for chunk in self._inner:
            read += len(chunk)
            reads += 1
            if read > self._max_bytes:
                raise Unacceptable(f"a body over the limit of {self._max_bytes} bytes", size=self._answer)
            if reads > self._max_reads:
                raise Unacceptable(f"a body in more than {self._max_reads} pieces")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class SSEReader:
    """The `data` of each server-sent event, and whether the server said `[DONE]`.

    Lines end with LF or CRLF (every OpenAI-compatible server's framing; a lone CR is not split on).
    An event is UTF-8 by the SSE spec, so bytes that are not become U+FFFD. An event left without
    its closing blank line when the body ends is incomplete and, as the spec says, dropped.
    """

    def __init__(self, chunks: AsyncIterator[bytes], *, max_events: int) -> None:
        self._chunks = chunks
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer already searched for a line end
        self._eof = False
        self._max_events = max_events
        self.events = 0
        self.done = False

    async def next(self) -> str | None:
        """The next event's data, or None at the end ([DONE] or the end of the body)."""
        if self.done:
            return None
        data: list[bytes] = []
        while True:
            line = await self._line()
            if line is None:
                return None
            if not line:
                if not data:
                    continue
                self.events += 1
                if self.events > self._max_events:
                    raise Unacceptable(f"a stream of more than {self._max_events} events")
                text = b"\n".join(data).decode("utf-8", "replace")
                if text.strip() == "[DONE]":
                    self.done = True
                    return None
                return text
            name, _, value = line.partition(b":")
            if name == b"data":
                data.append(value[1:] if value.startswith(b" ") else value)
            # other fields (event, id, retry) and comments carry nothing an OpenAI stream needs

    async def _line(self) -> bytes | None:
        while True:
            # searched from where the last search stopped: a long line arriving in small pieces
            # must not be rescanned from its start for each one
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                self._scanned = 0
                return line[:-1] if line.endswith(b"\r") else line
            self._scanned = len(self._buffer)
            if self._eof:
                return None
            try:
                self._buffer += await anext(self._chunks)
            except StopAsyncIteration:
                self._eof = True


def json_object(body: str) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: a body nested thousands deep
        raise Malformed(f"response body is not JSON: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise Malformed(f"response body is a JSON {type(value).__name__}, not an object")
    return value


def event_object(data: str) -> dict[str, Any]:
    value = json_object(data)
    error = value.get("error")
    if error is not None:
        message = error.get("message") if isinstance(error, dict) else error
        raise ErrorEvent(str(message)[:LOG_TEXT_CHARS])
    return value


def first_choice(choices: Any, *, required: bool, index: int = 0) -> dict[str, Any] | None:
    """Choice `index` (0 unless n > 1 was asked): a server sending more (or interleaving them in a
    stream) must not mix another's text into it."""
    if choices is None and not required:
        return None
    if not isinstance(choices, list):
        raise Malformed(f"choices is {type(choices).__name__}, not a list")
    for choice in choices:
        if not isinstance(choice, dict):
            raise Malformed(f"a choice is {type(choice).__name__}, not an object")
        found = choice.get("index", 0)
        if found == index and not isinstance(found, bool):
            return choice
    if required:
        raise Malformed(f"the response has no choice {index}")
    return None


def typed_field(obj: dict[str, Any], name: str, kind: type[_T]) -> _T | None:
    """`obj[name]` when it is a `kind` or null/absent; any other type makes the answer malformed."""
    value = obj.get(name)
    if value is None or isinstance(value, kind):
        return value
    raise Malformed(f"{name} is {type(value).__name__}, not {kind.__name__}")


def token_logprobs(logprobs: Any) -> tuple[float, ...] | None:
    """The sampled tokens' logprobs from a chat (`content`) or completions (`token_logprobs`)
    shape; None unless every one is a finite number at most 0."""
    if not isinstance(logprobs, dict):
        return None
    content = logprobs.get("content")
    if isinstance(content, list):
        values = [item.get("logprob") if isinstance(item, dict) else None for item in content]
    elif isinstance(logprobs.get("token_logprobs"), list):
        values = logprobs["token_logprobs"]
    else:
        return None
    out: list[float] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        number = float(value)
        if not math.isfinite(number) or number > 1e-6:  # a probability above 1 is not one
            return None
        out.append(min(number, 0.0))
    return tuple(out)


def token_count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value >= 0:
        return value
    return None


def model_name(value: Any) -> str | None:
    """The model the server says answered, if it is a sane name (it reaches logs and the ledger)."""
    if isinstance(value, str) and _MODEL_NAME.match(value):
        return value
    return None


def clean_text(text: str) -> str:
    # JSON can carry lone surrogates ("\ud800"): no encoder downstream would take them.
    return _SURROGATE.sub("\ufffd", text)
