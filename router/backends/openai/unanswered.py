"""What a request that an `openai` tier ends without an answer hears, and what it is charged.

Some failures are the request's own rather than the upstream's, and each still cost the operator
something the key must pay for (a hosted upstream bills for what it generated); each such request
has its ledger row:

- an answer too large for the tier that the request asked for (`router.backends.openai.answer_size`):
  `AnswerTooLargeError` (400), charged every token it asked for, since its usage, at the end of
  what was not read, never arrived;
- a 5xx, an error event, a malformed answer or a stream cut before its `finish_reason` while the
  deployment answers a request of the tier's own (`router.backends.openai.outages`):
  `UpstreamRefusedError` (502), charged its prompt before any text (the server may have read it),
  and the completion tokens a malformed body's usage reports, if sane; after text, what was
  streamed (the cascade prices that from the stream's pieces);
- an answer with fewer choices than the n asked for (`FewerChoices`): `ChoicesUnsupportedError`
  (400, `param` n), charged the choices that came;
- a request its deadline cut (`timed_out`): `DeadlineError` as before, charged its prompt and,
  when it was not streamed, every token it asked for (`n * max_tokens`, as an answer too large:
  the server goes on generating an answer whose reader left, and a hosted one bills it); a stream
  cut after text is charged what it streamed.

A prompt whose usage never arrived is counted as an upstream without usage is (`reading`): the
estimate, never below its floor.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

import openai

from router.backends.openai.call import Call, estimate_prompt_tokens
from router.backends.openai.reading import prompt_floor
from router.backends.openai.upstream_io import Cut, FewerChoices, Malformed
from router.errors import AnswerTooLargeError, ChoicesUnsupportedError, UpstreamRefusedError
from router.generation import Generation

if TYPE_CHECKING:
    from router.backends.openai.deployments import Deployment


def too_large(tier: str, limit: int, call: Call, where: Deployment) -> AnswerTooLargeError:
    """The 400 for a request whose answer, honestly that large, was cut at `limit`
    (max_response_bytes), charged `n * max_tokens` (an answer that large has used most of them)."""
    request = call.request
    param = ("top_logprobs" if request.is_chat else "logprobs") if request.top_logprobs else None
    param = param or ("n" if request.n > 1 else "max_tokens")
    error = AnswerTooLargeError(
        f"tier {tier}: the upstream's answer was larger than this tier takes "
        f"(max_response_bytes = {limit}), as an answer to n={request.n}, "
        f"max_tokens={call.max_tokens}, top_logprobs={request.top_logprobs} can be; lower {param}",
        param=param,
    )
    error.spent = _spent(call, where, completion_tokens=request.n * call.max_tokens, finish="length")
    return error


def refused(tier: str, call: Call, where: Deployment, exc: BaseException, chars: int | None) -> UpstreamRefusedError:
    """The 502 for a request whose 5xx, error event, malformed answer or cut stream (after `chars`
    characters of a stream) was its own: what the upstream did, and that it was not retried and why."""
    when = f" after {chars} characters of output" if chars is not None else ""
    if isinstance(exc, Cut):
        said = (
            f"the upstream ended this request's stream{when} without a finish_reason while it answers a "
            "request of the tier's own: not retried; an upstream that ends a stream when another request "
            "arrives (llama-cpp-python's --interrupt_requests), or a prompt longer than its context, does this"
        )
    elif isinstance(exc, Malformed):
        said = (
            f"the upstream's answer to this request was not a well-formed completion{when} while it answers "
            "a request of the tier's own: not retried, another attempt would fail it the same way"
        )
    else:
        status = f"HTTP {exc.status_code}" if isinstance(exc, openai.APIStatusError) else "an error event"
        said = (
            f"the upstream refused this request ({status}{when}) while it answers a request of the tier's "
            "own: not retried, another attempt would fail it the same way"
        )
    error = UpstreamRefusedError(
        f"tier {tier}: {said}; a parameter of the request (a message role, response_format, tools) "
        "may be one this upstream cannot take"
    )
    if chars is None:
        completion = getattr(exc, "completion_tokens", None) or 0  # a malformed body's usage, if sane
        error.spent = _spent(call, where, completion_tokens=min(completion, call.completion_limit), finish="stop")
    return error


def fewer_choices(tier: str, call: Call, where: Deployment, exc: FewerChoices) -> ChoicesUnsupportedError:
    """The 400 for a request for n > 1 choices that the upstream answered with fewer: it does not
    honour n; charged what it sent."""
    got = 1 + len(exc.answer.others)
    error = ChoicesUnsupportedError(
        f"tier {tier}: the upstream answered n={call.request.n} with {got} choice{'s' if got != 1 else ''}: "
        "it does not honour n; ask for one choice a request (n=1)"
    )
    error.spent = replace(exc.answer, deployment=where.name, deployment_shown=where.shown)
    return error


def timed_out(call: Call, where: Deployment, *, streamed: bool) -> Generation:
    """What a request its deadline cut before any text cost: its prompt and, unless streamed (a
    streaming server stops when its reader leaves), every token it asked for."""
    completion = 0 if streamed else call.request.n * call.max_tokens
    return _spent(call, where, completion_tokens=completion, finish="length")


def _spent(call: Call, where: Deployment, *, completion_tokens: int, finish: str) -> Generation:
    return Generation(
        text="",
        finish_reason="length" if finish == "length" else "stop",
        prompt_tokens=max(estimate_prompt_tokens(call.request), prompt_floor(call)),
        completion_tokens=completion_tokens,
        token_logprobs=None,
        latency_s=time.monotonic() - call.started,
        model=where.model,
        deployment=where.name,
        deployment_shown=where.shown,
    )
