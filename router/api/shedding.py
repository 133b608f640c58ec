"""Load shedding: past `server.max_in_flight` requests at once, or while the event loop runs late, 503 at once.

Without a bound, a service offered more requests a second than it can serve takes them all in:
each waits longer for the event loop than the last, and at twice its capacity it answered 503
only after tens of seconds, and some requests not at all, the client timing out first (issue 45).
This gate is the outermost check on the request surfaces (every POST under /v1/): it counts the
requests in the app and the admitted ones not yet settled (a stream's body outlives the app's
call: the accounting's count, `tierroute_requests_in_flight`, holds it until it ends, however it
ends), the larger of the two, and one more than the bound is answered
`503 Service Unavailable` with `Retry-After`, in the surface's error shape, before its key is
checked or its body parsed, so shedding costs a fraction of what serving does and an overloaded
service still answers every request, most of them 200, the rest at once.

A count alone does not keep the answers prompt: a request the loop has not reached yet is in no
count, and offered twice what it can serve the loop falls seconds behind with few requests in the
app (measured: 1,000 req/s against a bound of 128 in flight, 503s after 7.8 s). So the gate also
watches the loop itself: a timer due every 5 ms says how late it ran, and while that lateness is
over `server.shed_lag_ms` (off by default: on a machine shared with other work the loop runs late
often enough to shed at low load), a new request is shed unless none is in flight. The lateness is the
wait every new request would have, so the service sheds just enough to stay that close to the
present. It recovers as soon as the load falls: both the count and the lateness are of now,
nothing is remembered. A shed request was never admitted, so it leaves no ledger row; every
admitted one is written as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from router.api import errors
from router.errors import OverloadedError

# how long a shed request's body may take to arrive before its connection is closed instead of
# kept (a body is read out, so the connection stays usable; nothing waits on a slow sender long)
_DRAIN_S = 1.0
_TICK_S = 0.005  # how often the loop's lateness is measured


class InFlightLimit:
    """At most `limit` requests to the /v1/ surfaces at once; the next is refused at once (503)."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        *,
        max_body_bytes: int,
        lag_s: float | None,
        admitted: Callable[[], int] = lambda: 0,
        retry_after_s: float = 1.0,
    ) -> None:
        self.app = app
        self.admitted = admitted  # admitted requests not yet settled (streams being sent included)
        self.limit = limit
        self.max_body_bytes = max_body_bytes
        self.lag_s = lag_s  # None: the count alone
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self.shed_total = 0
        self.lag = 0.0  # how late the loop last ran its timer, in seconds
        self._watch: asyncio.Task[None] | None = None

    def _watching(self) -> None:
        """The timer that measures the loop's lateness, on the loop that serves (tests run several)."""
        task = self._watch
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            self._watch = asyncio.get_running_loop().create_task(self._measure(), name="tierroute-loop-lag")

    async def _measure(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + _TICK_S
            await asyncio.sleep(_TICK_S)
            self.lag = max(0.0, loop.time() - due)

    def load(self) -> int:
        return max(self.in_flight, self.admitted())

    def _over(self) -> bool:
        load = self.load()
        if load >= self.limit:
            return True
        return self.lag_s is not None and load > 0 and self.lag > self.lag_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        if self.lag_s is not None:
            self._watching()
        if self._over():
            self.shed_total += 1
            await self._shed(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _shed(self, scope: Scope, receive: Receive, send: Send) -> None:
        why = (
            f"its limit of {self.limit} requests at once (server.max_in_flight)"
            if self.load() >= self.limit
            else f"the most it can serve promptly (server.shed_lag_ms: {1000 * (self.lag_s or 0):g} ms)"
        )
        exc = OverloadedError(f"The service is at {why}; retry shortly.", retry_after=self.retry_after_s)
        response = errors.error_response(exc, errors.dialect(scope.get("path")))
        if not await self._drained(receive):
            response.headers["connection"] = "close"
        await response(scope, receive, send)

    async def _drained(self, receive: Receive) -> bool:
        """Read the unread body, so the connection can carry the client's next request; False when
        it is too large or too slow (the connection is then closed after the 503)."""
        seen = 0
        try:
            async with asyncio.timeout(_DRAIN_S):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return False
                    seen += len(message.get("body", b""))
                    if seen > self.max_body_bytes:
                        return False
                    if not message.get("more_body", False):
                        return True
        except TimeoutError:
            return False
