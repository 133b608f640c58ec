"""An OpenAI-compatible upstream that answers at once: what `bench gateway` puts behind every gateway.

It reads a request's head and body with no framework under it and answers every POST with one
fixed chat completion (`usage` included) in a single write on a TCP_NODELAY socket, keeping the
connection alive; `GET /v1/models` lists its one model. So what a gateway in front of it adds is
measured against an upstream that costs a few microseconds a request, not against another
framework's own overhead. Run it as `python -m router.bench.instant_upstream PORT`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys

MODEL = "instant"
_ANSWER = json.dumps(
    {
        "id": "chatcmpl-instant",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "OK."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
    },
    separators=(",", ":"),
).encode()
_MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]}).encode()


def _reply(body: bytes, status: bytes = b"200 OK") -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


ANSWER = _reply(_ANSWER)
MODELS = _reply(_MODELS)
NOT_FOUND = _reply(b'{"error":{"message":"not found"}}', b"404 Not Found")


class Upstream(asyncio.Protocol):
    """One connection: HTTP/1.1 requests read in order (pipelined ones too), each answered at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        out = []
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = self.buffer[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                break
            self.buffer = self.buffer[end + 4 + length :]
            method, _, rest = head.partition(b" ")
            path = rest.partition(b" ")[0]
            if method == b"POST":
                out.append(ANSWER)
            elif path.rstrip(b"/").endswith(b"/models"):
                out.append(MODELS)
            else:
                out.append(NOT_FOUND)
        if out:
            self.transport.write(b"".join(out))


async def serve(port: int, host: str = "127.0.0.1") -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Upstream, host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    try:
        import uvloop
    except ImportError:  # the plain loop is slower, not wrong
        asyncio.run(serve(int(argv[0])))
    else:
        uvloop.run(serve(int(argv[0])))


if __name__ == "__main__":
    main(sys.argv[1:])
