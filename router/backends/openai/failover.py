"""One logical request's attempts across a tier's deployments: failover first, then backed-off retries.

A failed attempt (`Retryable`: 429, 5xx, a timeout, a reset, a malformed answer) moves the request
at once, without a pause, to another deployment of the tier that may take it and that it has not
failed on. Only when there is none does it pause as `RetryPolicy` says (an exponential backoff
with jitter, at least the failed attempt's `Retry-After`) and try again where it may, which with one
deployment is the same server: exactly the retries a tier with one `base_url` always made.

- Budget. Each deployment may be tried `max_attempts` times per request; when every deployment's
  tries are spent, or the next pause would reach the deadline, the last failure is what the client
  hears (`Failures.give_up`).
- Time. Every attempt ends by the request's deadline. While other deployments are still untried,
  an attempt may use only its share of the time left (`attempt_timeout_s`, or the time left split
  evenly among the untried), so a deployment that hangs leaves the others time to answer.
- Streams are retried this way only until their first piece of text (`OpenAIBackend.stream`).

An answer over the size limits is tried again only at another deployment (`Retryable.repeat`):
the same server would send as much again. Errors that another attempt cannot cure (a 4xx
rejecting the request, the deadline, every breaker open) are raised at once, as they always were. The loop is
written here rather than in tenacity, which retries one callable at one place: here the place
changes with each attempt, and a move to another deployment must not wait.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from router.backends.openai.call import Call
from router.backends.openai.deployments import Deployment, Pool
from router.backends.openai.failures import Retryable
from router.backends.openai.retry import RetryPolicy

_T = TypeVar("_T")


class GaveUp(Exception):
    """Every try was spent on retryable failures: `last` is the last one, at `deployment`."""

    def __init__(self, last: Retryable, deployment: Deployment) -> None:
        super().__init__(last.summary)
        self.last = last
        self.deployment = deployment


async def attempts(
    call: Call,
    pool: Pool,
    policy: RetryPolicy,
    attempt: Callable[[Call, Deployment], Awaitable[_T]],
    *,
    attempt_timeout_s: float | None = None,
) -> _T:
    """The first answer of `attempt` at one deployment after another (module docstring); raises
    `GaveUp` when the tries are spent on retryable failures, and anything else as it comes."""
    tries = {d.name: policy.max_attempts for d in pool.deployments}
    failed: set[str] = set()
    last: tuple[Retryable, Deployment] | None = None
    pauses = 0
    while True:
        call.attempt_until = None
        left = [d for d in pool.deployments if tries[d.name] > 0]
        if not left:
            assert last is not None  # every deployment has at least one try
            raise GaveUp(*last)
        chosen = pool.fresh(left, failed)
        if chosen is None:
            if last is not None:
                pauses += 1
                pause = policy.backoff(pauses)
                asked = last[0].retry_after
                if asked is not None and math.isfinite(asked):
                    pause = max(pause, asked)
                if pause >= call.remaining():
                    raise GaveUp(*last)
                await asyncio.sleep(pause)
            chosen = pool.after_pause(left)
        tries[chosen.name] -= 1
        untried = [d for d in left if d.name not in failed and d is not chosen and d.admits]
        if untried:
            share = call.remaining() / (1 + len(untried))
            if attempt_timeout_s is not None:
                share = attempt_timeout_s
            call.attempt_until = time.monotonic() + share
        try:
            return await attempt(call, chosen)
        except Retryable as exc:
            last = (exc, chosen)
            failed.add(chosen.name)
            if not exc.repeat:  # an answer over the limits: that deployment would send it again
                tries[chosen.name] = 0
        finally:
            call.attempt_until = None
