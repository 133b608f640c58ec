"""What a request that an `openai` tier ends without an answer hears, and what it is charged.

Two failures are the request's own rather than the upstream's, and each still cost the operator
something the key must pay for (a hosted upstream bills for what it generated):

- an answer too large for the tier that the request asked for (`router.backends.openai.answer_size`):
  `AnswerTooLargeError` (400), charged every token it asked for, since its usage, at the end of
  what was not read, never arrived;
- a 5xx or an error event while the deployment answers a request of the tier's own
  (`router.backends.openai.outages`): `UpstreamRefusedError` (502), charged its prompt before any
  text (the server may have read it) and, after text, what was streamed (the cascade prices that
  from the stream's pieces).

A prompt whose usage never arrived is counted as an upstream without usage is (`reading`): the
estimate, never below its floor.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import openai

from router.backends.openai.call import Call, estimate_tokens, prompt_text
from router.backends.openai.reading import prompt_floor
from router.errors import AnswerTooLargeError, UpstreamRefusedError
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
    """The 502 for a request whose 5xx (or error event, after `chars` characters of a stream) was its
    own: what the upstream said, and that it was not retried and why."""
    said = f"HTTP {exc.status_code}" if isinstance(exc, openai.APIStatusError) else "an error event"
    when = f" after {chars} characters of output" if chars is not None else ""
    error = UpstreamRefusedError(
        f"tier {tier}: the upstream refused this request ({said}{when}) while it answers a request of "
        "the tier's own: not retried, another attempt would fail it the same way; a parameter of the "
        "request (a message role, response_format, tools) may be one this upstream cannot take"
    )
    if chars is None:
        error.spent = _spent(call, where, completion_tokens=0, finish="stop")
    return error


def _spent(call: Call, where: Deployment, *, completion_tokens: int, finish: str) -> Generation:
    return Generation(
        text="",
        finish_reason="length" if finish == "length" else "stop",
        prompt_tokens=max(estimate_tokens(prompt_text(call.request)), prompt_floor(call)),
        completion_tokens=completion_tokens,
        token_logprobs=None,
        latency_s=time.monotonic() - call.started,
        model=where.model,
        deployment=where.name,
        deployment_shown=where.shown,
    )
