"""A scripted, fault-injecting OpenAI-compatible upstream on loopback, for backend tests.

It speaks just enough HTTP/1.1 (keep-alive, Content-Length, chunked) to be a real server for the
`openai` SDK, and answers each request with the next action of a script, then with `ok()` once the
script is spent. Every request is recorded before it is answered, so a test can assert exactly how
many reached the upstream. It runs its own event loop in a thread, so it works whatever loop a
test runs in, and it binds 127.0.0.1 only.

    with FaultUpstream() as upstream:
        upstream.script(status(500), reset(), ok())
        ...  # point a backend at upstream.base_url
        assert len(upstream.requests) == 3

A scripted fault is the server's, as an outage is: the tier's probe of whether a 5xx is the
deployment's or the request's (`router.backends.openai.outages`, known by its fixed text) is
answered with a 500 (`outage_probe`), takes nothing from the script and is recorded apart
(`outage_probes`), so a script means what it always meant. A test of a failure that is the
request's own sets `outage_probe=None`: the probe is then answered, and recorded, as any request.
"""

from __future__ import annotations

import asyncio
import collections
import json
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from router.backends.openai.outages import PROBE_TEXT

TOKENS = ("Hello", ",", " world", "!")
PROMPT_TOKENS = 7
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    409: "Conflict",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def streaming(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def is_chat(self) -> bool:
        return self.path.endswith("/chat/completions")

    @property
    def outage_probe(self) -> bool:
        """The tier's own one-token request asking whether a 5xx was the deployment's."""
        messages = self.body.get("messages")
        said = messages[0].get("content") if isinstance(messages, list) and messages else self.body.get("prompt")
        return said == PROBE_TEXT and self.body.get("max_tokens") == 1


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def head(self, status: int, headers: dict[str, str]) -> None:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        await self.send(("\r\n".join(lines) + "\r\n\r\n").encode())

    async def reply(
        self, status: int, body: bytes, headers: dict[str, str] | None = None, content_type: str = "application/json"
    ) -> None:
        await self.head(status, {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {})})
        await self.send(body)

    def reset(self) -> None:
        """Abort with a TCP RST, the way a crashed process or a dropping proxy looks."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


# An action answers one request; it returns whether the connection may be reused.
Action = Callable[[_Conn, Received], Awaitable[bool]]


# -- OpenAI-shaped bodies ------------------------------------------------------------------------


def _logprob(i: int) -> float:
    return -0.25 * (i + 1)


def _chat_logprobs(tokens: tuple[str, ...], start: int = 0) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": _logprob(start + i), "bytes": None, "top_logprobs": []}
            for i, t in enumerate(tokens)
        ]
    }


def _completion_logprobs(tokens: tuple[str, ...], start: int = 0) -> dict[str, Any]:
    return {
        "tokens": list(tokens),
        "token_logprobs": [_logprob(start + i) for i in range(len(tokens))],
        "top_logprobs": None,
        "text_offset": None,
    }


def expected_logprobs(tokens: tuple[str, ...] = TOKENS) -> tuple[float, ...]:
    return tuple(_logprob(i) for i in range(len(tokens)))


def _usage(tokens: tuple[str, ...]) -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": len(tokens),
        "total_tokens": PROMPT_TOKENS + len(tokens),
    }


def _full_body(
    req: Received, tokens: tuple[str, ...], *, logprobs: bool, usage: bool, finish: str, model: str
) -> dict[str, Any]:
    text = "".join(tokens)
    want_lp = logprobs and bool(req.body.get("logprobs"))
    if req.is_chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": _chat_logprobs(tokens) if want_lp else None,
        }
        body = {"id": "chatcmpl-fault", "object": "chat.completion", "created": 0, "model": model, "choices": [choice]}
    else:
        choice = {
            "index": 0,
            "text": text,
            "finish_reason": finish,
            "logprobs": _completion_logprobs(tokens) if want_lp else None,
        }
        body = {"id": "cmpl-fault", "object": "text_completion", "created": 0, "model": model, "choices": [choice]}
    if usage:
        body["usage"] = _usage(tokens)
    return body


def _chunks(
    req: Received,
    tokens: tuple[str, ...],
    *,
    logprobs: bool,
    usage: bool,
    finish: str,
    model: str,
    upto: int | None = None,
) -> list[dict[str, Any]]:
    """The SSE events of a streamed answer; with `upto`, only the role chunk and that many tokens."""
    want_lp = logprobs and bool(req.body.get("logprobs"))
    base: dict[str, Any] = {"id": "fault", "created": 0, "model": model}
    out: list[dict[str, Any]] = []
    if req.is_chat:
        base["object"] = "chat.completion.chunk"
        out.append(
            {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        )
        for i, t in enumerate(tokens):
            out.append(
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": t},
                            "logprobs": _chat_logprobs((t,), i) if want_lp else None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
        final = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
    else:
        base["object"] = "text_completion"
        for i, t in enumerate(tokens):
            lps = _completion_logprobs((t,), i) if want_lp else None
            out.append({**base, "choices": [{"index": 0, "text": t, "finish_reason": None, "logprobs": lps}]})
        final = {**base, "choices": [{"index": 0, "text": "", "finish_reason": finish}]}
    if upto is not None:
        return out[: upto + (1 if req.is_chat else 0)]
    out.append(final)
    if usage and (req.body.get("stream_options") or {}).get("include_usage"):
        out.append({**base, "choices": [], "usage": _usage(tokens)})
    return out


def _event(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    return f"data: {payload}\n\n".encode()


async def _send_chunked(conn: _Conn, piece: bytes) -> None:
    await conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")


_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


# -- actions -------------------------------------------------------------------------------------


def ok(
    tokens: tuple[str, ...] = TOKENS,
    *,
    logprobs: bool = True,
    usage: bool = True,
    finish: str = "stop",
    model: str = "fake-large",
) -> Action:
    """A correct answer, shaped after the request (chat or completions, streamed or not).

    Logprobs are sent only when the request asked for them and `logprobs` is true.
    """

    async def act(conn: _Conn, req: Received) -> bool:
        if not req.streaming:
            body = _full_body(req, tokens, logprobs=logprobs, usage=usage, finish=finish, model=model)
            await conn.reply(200, json.dumps(body).encode())
            return True
        await conn.head(200, {**_SSE_HEADERS, "Transfer-Encoding": "chunked"})
        for chunk in _chunks(req, tokens, logprobs=logprobs, usage=usage, finish=finish, model=model):
            await _send_chunked(conn, _event(chunk))
        await _send_chunked(conn, _event("[DONE]"))
        await conn.send(b"0\r\n\r\n")
        return True

    return act


# vLLM's words for a top_logprobs over its `--max-logprobs`: they name logprobs, and a client chose them
VLLM_MAX_LOGPROBS = "Requested sample logprobs of {asked}, which is greater than max allowed: {most}"


def honest(
    token: str | Callable[[Received], str] = " la",
    *,
    max_logprobs: int | None = None,
    usage: dict[str, int] | None = None,
    logprob: float = -0.05,
) -> Action:
    """An honest server's answer, shaped by the request as a real one is: `n` choices of
    `max_tokens` tokens each (every one `token`, or `token(request)`: a prompt that makes the
    model repeat), each with its logprob entry and `top_logprobs` alternatives when asked, their
    `bytes` lists as OpenAI writes them, and true usage (or `usage`, a hostile server's report).
    `max_logprobs`: a top_logprobs above it is refused in vLLM's words (`--max-logprobs`). Plain
    answers only (chat and completions); a stream is answered by `ok()`."""

    async def act(conn: _Conn, req: Received) -> bool:
        if req.streaming:
            return await ok()(conn, req)
        asked = int(req.body.get("top_logprobs") or 0) if req.is_chat else int(req.body.get("logprobs") or 0)
        if max_logprobs is not None and asked > max_logprobs:
            return await status(400, VLLM_MAX_LOGPROBS.format(asked=asked, most=max_logprobs))(conn, req)
        piece = token(req) if callable(token) else token
        n, length = int(req.body.get("n") or 1), int(req.body.get("max_tokens") or 16)
        want = bool(req.body.get("logprobs"))
        raw = list(piece.encode())

        def entry() -> dict[str, Any]:
            alternatives = [
                {"token": f"{piece}{i}", "logprob": logprob - 1 - i, "bytes": [*raw, 48 + i % 10]} for i in range(asked)
            ]
            return {"token": piece, "logprob": logprob, "bytes": raw, "top_logprobs": alternatives}

        choices = []
        for i in range(n):
            logprobs = {"content": [entry() for _ in range(length)]} if want else None
            if req.is_chat:
                message = {"role": "assistant", "content": piece * length}
                choices.append({"index": i, "message": message, "finish_reason": "length", "logprobs": logprobs})
            else:
                legacy = None
                if want:
                    legacy = {
                        "tokens": [piece] * length,
                        "token_logprobs": [logprob] * length,
                        "top_logprobs": [{f"{piece}{j}": logprob - 1 - j for j in range(asked)}] * length,
                    }
                choices.append({"index": i, "text": piece * length, "finish_reason": "length", "logprobs": legacy})
        told = usage or {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n * length}
        body = {"id": "honest", "object": "chat.completion", "created": 0, "model": "fake-large", "choices": choices}
        await conn.reply(200, json.dumps({**body, "usage": told}).encode())
        return True

    return act


def status(
    code: int,
    message: str = "scripted failure",
    *,
    headers: dict[str, str] | None = None,
    code_name: str | None = None,
    param: str | None = None,
) -> Action:
    """An OpenAI-shaped error response."""

    async def act(conn: _Conn, req: Received) -> bool:
        error = {
            "message": message,
            "type": "invalid_request_error" if code < 500 else "server_error",
            "param": param,
            "code": code_name,
        }
        await conn.reply(code, json.dumps({"error": error}).encode(), headers)
        return True

    return act


def raw(
    code: int, body: bytes, *, content_type: str = "application/json", headers: dict[str, str] | None = None
) -> Action:
    """Any bytes with any status and headers: malformed JSON, HTML from a proxy, a wrong shape."""

    async def act(conn: _Conn, req: Received) -> bool:
        await conn.reply(code, body, headers, content_type=content_type)
        return True

    return act


def chat_chunk(
    content: str | None = None, *, finish: str | None = None, index: int = 0, **extra: Any
) -> dict[str, Any]:
    """One chat stream chunk, for `sse` scripts."""
    delta = {} if content is None else {"content": content}
    choice = {"index": index, "delta": delta, "finish_reason": finish, **extra}
    return {"id": "fault", "object": "chat.completion.chunk", "created": 0, "model": "fake-large", "choices": [choice]}


def sse(*events: dict[str, Any] | str | bytes, done: bool = True, newline: bytes = b"\n") -> Action:
    """A 200 stream of exactly these events: a dict is sent as JSON, a str as the data field as it
    is, bytes as raw bytes with no framing added. `done` ends it with `data: [DONE]`."""

    async def act(conn: _Conn, req: Received) -> bool:
        await conn.head(200, {**_SSE_HEADERS, "Transfer-Encoding": "chunked"})
        for event in (*events, *(("[DONE]",) if done else ())):
            if isinstance(event, bytes):
                piece = event
            else:
                data = event if isinstance(event, str) else json.dumps(event)
                piece = b"data: " + data.encode("utf-8", "surrogatepass") + newline + newline
            await _send_chunked(conn, piece)
        await conn.send(b"0\r\n\r\n")
        return True

    return act


def oversized(n_bytes: int, *, declare: bool, code: int = 200) -> Action:
    """A JSON-looking body of `n_bytes`: with `declare`, a Content-Length saying so; else chunked,
    with no length known until it ends."""

    async def act(conn: _Conn, req: Received) -> bool:
        block = b" " * 65536
        if declare:
            await conn.head(code, {"Content-Type": "application/json", "Content-Length": str(n_bytes)})
        else:
            await conn.head(code, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        sent = 0
        while sent < n_bytes:
            piece = block[: n_bytes - sent]
            await (conn.send(piece) if declare else _send_chunked(conn, piece))
            sent += len(piece)
        if not declare:
            await conn.send(b"0\r\n\r\n")
        return True

    return act


def dribble(*events: dict[str, Any], piece: int = 1) -> Action:
    """A correct stream of these events (then [DONE]), sent `piece` bytes per HTTP chunk."""

    async def act(conn: _Conn, req: Received) -> bool:
        await conn.head(200, {**_SSE_HEADERS, "Transfer-Encoding": "chunked"})
        body = b"".join(_event(e) for e in events) + _event("[DONE]")
        for i in range(0, len(body), piece):
            await _send_chunked(conn, body[i : i + piece])
        await conn.send(b"0\r\n\r\n")
        return True

    return act


def stalled_body(seconds: float = 60.0) -> Action:
    """Headers promising a body, a few bytes of it, then silence."""

    async def act(conn: _Conn, req: Received) -> bool:
        await conn.head(200, {"Content-Type": "application/json", "Content-Length": "1000"})
        await conn.send(b'{"id": "x", ')
        await asyncio.sleep(seconds)
        return False

    return act


class Endless:
    """A stream of tokens that never ends: it sends until the client hangs up, and counts the
    bytes it managed to send (what the client had to take before it stopped)."""

    def __init__(self, token: str = "la ") -> None:
        self.token = token
        self.sent = 0

    async def __call__(self, conn: _Conn, req: Received) -> bool:
        await conn.head(200, {**_SSE_HEADERS, "Transfer-Encoding": "chunked"})
        event = _event(
            chat_chunk(self.token)
            if req.is_chat
            else {
                "id": "fault",
                "object": "text_completion",
                "created": 0,
                "model": "fake-large",
                "choices": [{"index": 0, "text": self.token, "finish_reason": None}],
            }
        )
        piece = (f"{len(event * 64):x}\r\n").encode() + event * 64 + b"\r\n"
        while True:
            await conn.send(piece)
            self.sent += len(event) * 64


def malformed() -> Action:
    return raw(200, b'{"id": "chatcmpl-x", "choices": [{"index": 0, "mess')


def hang(seconds: float = 60.0) -> Action:
    """Accept the request and say nothing (until the client gives up or the server stops)."""

    async def act(conn: _Conn, req: Received) -> bool:
        await asyncio.sleep(seconds)
        return False

    return act


def reset() -> Action:
    """Read the request, then reset the connection without answering."""

    async def act(conn: _Conn, req: Received) -> bool:
        conn.reset()
        return False

    return act


def delayed(seconds: float, action: Action) -> Action:
    async def act(conn: _Conn, req: Received) -> bool:
        await asyncio.sleep(seconds)
        return await action(conn, req)

    return act


def broken_stream(
    after: int, end: Literal["cut", "reset", "eof", "hang", "error"], *, tokens: tuple[str, ...] = TOKENS
) -> Action:
    """Start a stream, send `after` tokens, then break it.

    cut:   close the connection (FIN) in the middle of the chunked body: the HTTP client sees an
           incomplete body after it has read everything sent;
    reset: a TCP RST mid-body, a moment after the last token (an RST may discard data the client
           has not read yet, so what arrives before it is not exact);
    eof:   a clean close, on a response that is delimited by the close (so nothing is malformed at
           the HTTP level: only the missing finish_reason tells it is cut);
    hang:  stop sending and keep the connection open;
    error: an OpenAI-style error event in the stream, then a properly ended body.
    """

    async def act(conn: _Conn, req: Received) -> bool:
        chunked = end != "eof"
        head = {**_SSE_HEADERS, **({"Transfer-Encoding": "chunked"} if chunked else {"Connection": "close"})}
        await conn.head(200, head)
        for chunk in _chunks(req, tokens, logprobs=True, usage=True, finish="stop", model="fake-large", upto=after):
            if chunked:
                await _send_chunked(conn, _event(chunk))
            else:
                await conn.send(_event(chunk))
        if end == "reset":
            await asyncio.sleep(0.1)  # let the client read what was sent before the RST
            conn.reset()
        elif end in ("cut", "eof"):
            conn.writer.close()
        elif end == "error":
            error = {"error": {"message": "model overloaded", "type": "server_error"}}
            await _send_chunked(conn, _event(error))
            await conn.send(b"0\r\n\r\n")
            return True
        else:
            await asyncio.sleep(60)
        return False

    return act


def paused_stream(after: int, seconds: float, *, tokens: tuple[str, ...] = TOKENS) -> Action:
    """A correct stream that stops for `seconds` after `after` tokens, then goes on to its end: a
    slow decode, or a reasoning model thinking, between two pieces of one answer."""

    async def act(conn: _Conn, req: Received) -> bool:
        await conn.head(200, {**_SSE_HEADERS, "Transfer-Encoding": "chunked"})
        chunks = _chunks(req, tokens, logprobs=True, usage=True, finish="stop", model="fake-large")
        for i, chunk in enumerate(chunks):
            if i == after:
                await asyncio.sleep(seconds)
            await _send_chunked(conn, _event(chunk))
        await _send_chunked(conn, _event("[DONE]"))
        await conn.send(b"0\r\n\r\n")
        return True

    return act


# -- the server ----------------------------------------------------------------------------------


@dataclass
class FaultUpstream:
    default: Action = field(default_factory=ok)
    requests: list[Received] = field(default_factory=list)
    # how the tier's outage probe is answered (module docstring); None: as any other request
    outage_probe: Action | None = field(default_factory=lambda: status(500, "scripted outage"))
    outage_probes: list[Received] = field(default_factory=list)
    bind_port: int = 0  # 0: any free port (a child process given its port binds that one)

    def __post_init__(self) -> None:
        self._script: collections.deque[Action] = collections.deque()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *actions: Action) -> None:
        with self._lock:
            self._script.extend(actions)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._script)

    def __enter__(self) -> FaultUpstream:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-upstream", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._thread is not None
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._handle, host="127.0.0.1", port=self.bind_port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _next_action(self) -> Action:
        with self._lock:
            return self._script.popleft() if self._script else self.default

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                req = await _read_request(reader)
                if req is None:
                    break
                if req.outage_probe and self.outage_probe is not None:
                    self.outage_probes.append(req)
                    if not await self.outage_probe(_Conn(reader, writer), req):
                        break
                    continue
                self.requests.append(req)
                if not await self._next_action()(_Conn(reader, writer), req):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            if not writer.transport.is_closing():
                writer.close()


async def _read_request(reader: asyncio.StreamReader) -> Received | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0"))
    raw_body = await reader.readexactly(length) if length else b""
    body = json.loads(raw_body) if raw_body else {}
    return Received(method=method, path=path, headers=headers, body=body)
