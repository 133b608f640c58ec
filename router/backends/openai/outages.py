"""Whether an upstream's failure is the deployment's or one request's doing: a probe of the tier's own.

A 5xx says the server failed; it does not say why, and a client can make a server fail. llama-cpp-python's
server answers every request it cannot validate with HTTP 500: a message of role `developer`, a
`response_format` of type `json_schema`, both OpenAI-standard. Counted against the deployment's
breaker, two such requests of one key opened it, and every other tenant got 503 for the cool-down
while the key paid nothing (issue 38, the outside review of its fixes). The same holds for an error
event in a stream: vLLM sends one when a request's own grammar or tool parser fails mid-answer.

The same holds for a 200 that is not an answer: llama-cpp-python's server answers a streamed prompt
longer than its context with an empty event stream, and ends a running stream with a bare
`[DONE]` when another request arrives (`--interrupt_requests`, on by default); a body of the
wrong shape can be a client's tools or schema at work. Counted, two such requests of one key opened
the breaker for everyone at no charge (the review of issue 38's third pass).

So a 5xx, an error event, a malformed answer or a stream cut before its `finish_reason`
(`judged`) is the deployment's failure only when the deployment also fails a request of the
tier's own: a fixed one-token request with nothing a client chose (`probe_params`:
the tier's own additions, logprobs and a stream's usage, as the deployment is sent them now, and
of the same kind, chat or completions, streamed or not). One probe per kind runs at a time per
deployment; failures that arrive meanwhile wait for it, and its verdict is remembered for
`REMEMBERED_FOR_S`, so a client sending such requests makes at most one probe per kind per
deployment in that time (each costs the operator one token of output; counted in
`tierroute_deployment_outage_probes_total`).

- The probe fails too (any status but 2xx, an error event, a body that is not an answer, a
  connection that fails before any answer twice: once may be the connection the failed request
  left, closing under it, `_opened`): an outage. The failure counts against the breaker and the
  request fails over, as it always did; its own later tries at that deployment, failing the same
  way on the same verdict, count no more (`Call.outage_counted`): one request is one failure's
  evidence, not `max_attempts`.
- The probe is answered: the failure was this request's. It is not retried anywhere (another
  deployment would fail it the same way, at the operator's cost), the breaker hears the
  deployment as alive, and the client hears 502 naming the upstream's refusal
  (`UpstreamRefusedError`), charged for what was spent.
- No verdict: the probe waits as long as the request that started it may (its deadline, at
  least `PROBE_TIMEOUT_S`), and a probe that gets no answer in that time is no verdict, never an
  outage, nor remembered. A server that takes one request at a time (llama-cpp-python's) answers a
  request it cannot validate with 500 at once, while the probe queues behind another request's
  long answer: a fixed 5 s bound made that an outage, remembered 10 s, and one key opened the
  breaker in 8 s for $0.00025 (the review). The breaker hears nothing either way; a waiter whose
  own deadline comes first fails as its deadline says.

What is remembered is corrected by what the deployment does next: an answer clears a remembered
failure, and a failure the probe does not judge (a timeout, a reset) clears a remembered success.
The window is short because a real outage that begins just after a probe was answered is taken
for the request's doing until it ends: for at most `REMEMBERED_FOR_S`, its 5xx are not failed over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Set
from typing import Any

import openai

from router.backends.openai.client import close_quietly
from router.backends.openai.upstream_io import ErrorEvent, FewerChoices, Malformed, SSEReader, event_object, json_object

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0  # the least a probe waits for its answer (else as long as its request may)
REMEMBERED_FOR_S = 10.0  # how long a probe's verdict stands for later failures of its kind
PROBE_TEXT = "Reply with the word OK."  # not refusals' text: a test upstream tells the two apart
_PROBE_BYTES = 64 * 1024  # a one-token answer is a few hundred bytes; more is not an answer

Kind = tuple[bool, bool]  # (chat, stream)


def judged(exc: BaseException) -> bool:
    """Whether a failed attempt is one a probe decides: an HTTP 5xx, an error event in a stream, a
    2xx that is not an answer, or a stream cut before its `finish_reason` (`Cut`). Not an answer
    with fewer choices than asked (`FewerChoices`): choice 0 came, the server is alive."""
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500
    return isinstance(exc, (ErrorEvent, Malformed)) and not isinstance(exc, FewerChoices)


class Outages:
    """One deployment's probes of whether a 5xx is its own (see the module docstring)."""

    def __init__(self, tier: str, deployment: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.tier = tier
        self.deployment = deployment  # as the log names it
        self._clock = clock
        self._verdicts: dict[Kind, tuple[bool, float]] = {}  # kind -> (answered, when)
        self._probing: dict[Kind, asyncio.Future[bool | None]] = {}
        self.probes_total = 0

    def answered(self) -> None:
        """The deployment answered a request: a remembered failure no longer stands."""
        if any(not ok for ok, _ in self._verdicts.values()):
            self._verdicts = {kind: v for kind, v in self._verdicts.items() if v[0]}

    def failed(self) -> None:
        """The deployment failed in a way no probe judges (a timeout, a reset): nor does a success."""
        if any(ok for ok, _ in self._verdicts.values()):
            self._verdicts = {kind: v for kind, v in self._verdicts.items() if not v[0]}

    async def answers(
        self, client: openai.AsyncOpenAI, model: str, refused: Set[str], *, chat: bool, stream: bool, seconds: float
    ) -> bool | None:
        """Whether the deployment answers a request of the tier's own now: True (the failure was
        the request's), False (an outage), None (no verdict within `seconds`, or the probe got no
        answer in its time: the module docstring)."""
        kind = (chat, stream)
        seen = self._verdicts.get(kind)
        if seen is not None and self._clock() - seen[1] < REMEMBERED_FOR_S:
            return seen[0]
        probing = self._probing.get(kind)
        if probing is None:
            params = probe_params(model, refused, chat=chat, stream=stream)
            bound = max(PROBE_TIMEOUT_S, seconds)
            probing = asyncio.ensure_future(self._probe(kind, client, params, bound))
            self._probing[kind] = probing
            probing.add_done_callback(lambda _: self._probing.pop(kind, None))
        try:
            # shielded: a request that goes away, or whose deadline comes first, leaves the probe
            # to finish for the others
            async with asyncio.timeout(max(0.0, seconds)):
                return await asyncio.shield(probing)
        except TimeoutError:
            return None

    async def _probe(
        self, kind: Kind, client: openai.AsyncOpenAI, params: dict[str, Any], seconds: float
    ) -> bool | None:
        self.probes_total += 1
        answered = await _answered(client, params, chat=kind[0], stream=kind[1], seconds=seconds)
        if answered is None:  # no answer in its time: busy or hung, no verdict either way
            log.info("tier %s: deployment %s gave its probe no answer in %.1f s", self.tier, self.deployment, seconds)
            return None
        self._verdicts[kind] = (answered, self._clock())
        if answered:
            log.warning(
                "tier %s: deployment %s answers a request of the tier's own: a 5xx it gave was that request's "
                "alone, not counted against its breaker",
                self.tier,
                self.deployment,
            )
        return answered


def probe_params(model: str, refused: Set[str], *, chat: bool, stream: bool) -> dict[str, Any]:
    """A one-token request of the tier's own: nothing a client chose, and the tier's own optional
    parameters as the deployment is sent them (those it refuses, `refused`, left out)."""
    params: dict[str, Any] = {"model": model, "max_tokens": 1, "temperature": 0.0}
    if chat:
        params["messages"] = [{"role": "user", "content": PROBE_TEXT}]
    else:
        params["prompt"] = PROBE_TEXT
    if "logprobs" not in refused:
        params.update({"logprobs": True, "top_logprobs": 0} if chat else {"logprobs": 1})
    if stream:
        params["stream"] = True
        if "stream_options" not in refused:
            params["stream_options"] = {"include_usage": True}
    return params


async def _answered(
    client: openai.AsyncOpenAI, params: dict[str, Any], *, chat: bool, stream: bool, seconds: float
) -> bool | None:
    """True: answered (2xx, a JSON object, or a stream with no error event); False: it failed
    (another status, an error event, a body that is not an answer, its connection failed twice);
    None: no answer in `seconds`."""
    endpoint: Any = client.chat.completions if chat else client.completions
    try:
        async with asyncio.timeout(seconds):
            response = await _opened(endpoint, params, seconds)
            try:
                if stream:
                    events = SSEReader(response.http_response.aiter_raw(), max_events=64)
                    while (data := await events.next()) is not None:
                        event_object(data)  # raises ErrorEvent on an error event
                else:
                    body = await response.http_response.aread()
                    if len(body) > _PROBE_BYTES:
                        return False
                    json_object(body.decode("utf-8", "replace"))
            finally:
                await close_quietly(response)
    except (TimeoutError, openai.APITimeoutError):
        return None
    except Exception:  # noqa: BLE001 - any failure of the tier's own request is the deployment's
        return False
    return True


async def _opened(endpoint: Any, params: dict[str, Any], seconds: float) -> Any:
    """The probe sent, and tried once more on a new connection when its connection fails before
    any answer. It goes out at once, on the pool's idle connection, often the one the failed
    request just left; a server that closes a connection after a failed answer (llama-cpp-python's,
    after a streamed prompt over its context) closes it under the probe, and "Server disconnected
    without sending a response" says nothing of the deployment (the fourth review: taken for an
    outage, five such requests of one key opened the breaker). The pool drops that connection, so
    the second try connects anew; a deployment that is down fails it too."""
    try:
        return await endpoint.with_streaming_response.create(**params, timeout=seconds).__aenter__()
    except openai.APITimeoutError:
        raise
    except openai.APIConnectionError:
        return await endpoint.with_streaming_response.create(**params, timeout=seconds).__aenter__()
