"""What one deployment refuses to be sent, learned only from requests of the tier's own.

A server may not support an optional parameter the tier adds itself: `logprobs` (for the confidence
verifier) or `stream_options` (for a stream's usage). It says so with a 400, 413 or 422 whose words
name the parameter (`router.backends.openai.failures.refused_param`), and the request is repeated
without it. Those words were once enough to stop sending the parameter to that deployment for good,
and a client can make a server say them: a `top_logprobs` over vLLM's `--max-logprobs` is refused in
words that name logprobs, and so is a strict schema the client named `logprobs`. One request then
switched logprobs off for every tenant until a restart, and every `auto` request escalated (issue 38).

So the words decide nothing beyond the request that drew them. The deployment-wide memory (`refused`)
is learned from a probe that carries nothing a client chose: a fixed one-token request of the tier's
own, sent with the parameter in the tier's own form (`logprobs: true, top_logprobs: 0` on chat,
`logprobs: 1` on completions, `stream_options: {include_usage: true}` on a stream) and, if that is
refused, without it. Refused with it and answered without it: the deployment refuses the parameter,
and it is no longer sent. Answered with it: the refusal was that request's alone (the request goes
on without the parameter, see `OpenAIBackend._open`), and the answer is remembered for
`ACCEPTED_FOR_S`, so a client sending such requests makes at most one probe per parameter per
deployment in that time. Anything else (a timeout, a 5xx) teaches nothing. One probe per parameter
runs at a time; concurrent refusals wait for it. A probe costs the operator one token of output.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import openai

from router.backends.openai.client import close_quietly

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0  # each of a probe's two calls, at most (and never past the request's deadline)
ACCEPTED_FOR_S = 300.0  # how long a parameter a probe saw answered is taken as accepted
_PROBE_TEXT = "Say OK."
_REFUSING = frozenset({400, 413, 422})


class Refusals:
    """The optional parameters one deployment refuses (`refused`), and the probes that learn them."""

    def __init__(
        self, tier: str, deployment: str, refused: set[str], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.tier = tier
        self.deployment = deployment  # as the log names it
        self.refused = refused
        self._clock = clock
        self._accepted_at: dict[str, float] = {}
        self._probing: dict[str, asyncio.Future[bool]] = {}
        self.probes_total = 0

    async def refuses(self, name: str, client: openai.AsyncOpenAI, model: str, *, chat: bool, seconds: float) -> bool:
        """Whether this deployment refuses `name` for everyone (learned into `refused`), after a
        request was refused in words naming it."""
        if name in self.refused:
            return True
        seen = self._accepted_at.get(name)
        if seen is not None and self._clock() - seen < ACCEPTED_FOR_S:
            return False
        probing = self._probing.get(name)
        if probing is None:
            probing = asyncio.ensure_future(self._probe(name, client, model, chat=chat, seconds=seconds))
            self._probing[name] = probing
            probing.add_done_callback(lambda _: self._probing.pop(name, None))
        # shielded: a request that goes away does not cancel the probe others wait for
        return await asyncio.shield(probing)

    async def _probe(self, name: str, client: openai.AsyncOpenAI, model: str, *, chat: bool, seconds: float) -> bool:
        self.probes_total += 1
        with_it = await _answered(client, probe_params(name, model, chat=chat, send=True), chat=chat, seconds=seconds)
        if with_it:
            self._accepted_at[name] = self._clock()
            log.info(
                "tier %s: deployment %s answers a request of the tier's own with %s: a refusal naming it was "
                "that request's alone; still sent",
                self.tier,
                self.deployment,
                name,
            )
            return False
        if with_it is None:
            return False  # no answer either way: nothing learned
        without = await _answered(client, probe_params(name, model, chat=chat, send=False), chat=chat, seconds=seconds)
        if not without:
            return False  # refused without it too: the refusal was of something else
        self.refused.add(name)
        log.info(
            "tier %s: deployment %s refuses %s (a request of the tier's own was refused with it and answered "
            "without it); no longer sent",
            self.tier,
            self.deployment,
            name,
        )
        return True


def probe_params(name: str, model: str, *, chat: bool, send: bool) -> dict[str, Any]:
    """A one-token request of the tier's own, with `name` in the tier's own form (`send`) or without."""
    params: dict[str, Any] = {"model": model, "max_tokens": 1, "temperature": 0.0}
    if chat:
        params["messages"] = [{"role": "user", "content": _PROBE_TEXT}]
    else:
        params["prompt"] = _PROBE_TEXT
    if name == "stream_options":
        params["stream"] = True
        if send:
            params["stream_options"] = {"include_usage": True}
    elif send and chat:
        params.update(logprobs=True, top_logprobs=0)
    elif send:
        params["logprobs"] = 1
    return params


async def _answered(client: openai.AsyncOpenAI, params: dict[str, Any], *, chat: bool, seconds: float) -> bool | None:
    """True: answered 2xx; False: refused (400, 413, 422); None: anything else."""
    endpoint: Any = client.chat.completions if chat else client.completions
    try:
        async with asyncio.timeout(max(0.0, seconds)):
            response = await endpoint.with_streaming_response.create(**params, timeout=max(0.01, seconds)).__aenter__()
    except openai.APIStatusError as exc:
        return False if exc.status_code in _REFUSING else None
    except Exception:  # noqa: BLE001 - a probe that gets no answer teaches nothing
        return None
    await close_quietly(response)
    return True
