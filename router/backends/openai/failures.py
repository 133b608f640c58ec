"""What a failed attempt at an `openai` tier means: whether to retry, and the typed error a client hears.

An attempt's exception is classified once (`Failures.classify`) into a `Verdict`: what to raise,
whether the upstream looked healthy (the breaker hears it: a deliberate answer, a 4xx rejecting our
request included, counts as the upstream being alive), and the whole story for the log. What
another attempt may cure is a `Retryable`, which the backend's retry loop catches; when the
attempts are spent, or a stream breaks after text reached the client, it becomes a typed error
from `router.errors`::

    400/413/422 from upstream     -> ContextLengthError if it says the context is too long,
                                     else RequestError (not retried: the request is the problem)
    3xx/401/403/404/other 4xx     -> UpstreamError at once (not retried: tier misconfigured)
    retryable, attempts spent     -> UpstreamError (retry_after as below)
    Retry-After beyond deadline   -> UpstreamError at once, carrying that Retry-After
    answer over the size limits   -> retryable at another deployment only; none left: UpstreamError;
                                     but AnswerTooLargeError (400, healthy, not retried) when the
                                     request asks for an answer that large (`answer_size`)
    5xx, an error event, a malformed answer or a stream cut before its finish_reason, while the
    deployment answers a request of the tier's own
                                  -> UpstreamRefusedError (502, healthy, not retried): the
                                     request's doing (`router.backends.openai.outages`)
    fewer choices than n asked    -> ChoicesUnsupportedError (400, healthy, not retried): the
                                     server does not honour n (`FewerChoices`)
    deadline passed               -> DeadlineError (the backend charges what it may have cost,
                                     and a probe decides later whether the breaker hears of it)
    breaker open or probing       -> CircuitOpenError (retry_after: remaining cool-down)
    stream cut after text began   -> UpstreamError (DeadlineError if the deadline cut it)

Retryable: connection errors, timeouts, HTTP 408/409/429/5xx, a 200 whose body is not a
well-formed completion, a stream cut before its finish_reason, and an error event in a stream
(each of these but a timeout only when a probe of the tier's own fails too: else they are the
request's, above); and an answer over the size limits, but
only at another deployment of the tier (`Retryable.repeat`): the same server would send as much
again, another one may answer.

- `Retry-After` is clamped by `router.backends.openai.retry.parse_retry_after` to [0, the tier's timeout],
  and retries never sleep past the deadline whatever it says. A client whose request failed at
  this tier gets one rule, for plain and streamed requests alike (`Failures.client_retry_after`):
  the upstream's value or the breaker's remaining cool-down, whichever is longer; when neither
  says anything, `cascade.retry_after_s`. A passed deadline gets 1 s: the next request has a
  deadline of its own.
- Error text. An upstream's message may carry keys, internal hostnames or a stack trace. Clients
  get a fixed message naming the tier and the upstream's status (and OpenAI's `param`/`code` only
  when they have OpenAI's form: a request field's path, a snake_case name; an address or a
  dotted hostname has neither, though a hostile upstream can still spell words of its choosing
  in that form, e.g. `db7_corp`); the upstream's own words go to the server log, each failed attempt at
  WARNING (the first 4000 characters: a log line is not a body).
- A 400, 413 or 422 whose words name an optional parameter we sent (`logprobs`, `stream_options`)
  may be a refusal of that parameter (`refused_param`): the backend repeats that request once
  without it. Those words are no proof: a client steers them (a `top_logprobs` over a server's
  `--max-logprobs`, a schema it named `logprobs`), so the deployment stops sending the parameter
  only when a request of the tier's own, with nothing a client chose, is refused with it and
  answered without it (`router.backends.openai.refusals`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx2
import openai

from router.backends.openai.breaker import CircuitBreaker
from router.backends.openai.call import Call
from router.backends.openai.retry import parse_retry_after
from router.backends.openai.upstream_io import LOG_TEXT_CHARS, ErrorEvent, Malformed, Unacceptable
from router.errors import (
    AnswerTooLargeError,
    ChoicesUnsupportedError,
    ContextLengthError,
    DeadlineError,
    RequestError,
    UnavailableError,
    UpstreamError,
    UpstreamRefusedError,
)

if TYPE_CHECKING:
    from router.generation import Generation

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_REQUEST_STATUS = frozenset({400, 413, 422})  # the upstream says our request is the problem
# Optional parameters a server may refuse; each maps to the names a refusal may use for it.
_OPTIONAL_PARAMS = {"logprobs": ("logprobs", "top_logprobs"), "stream_options": ("stream_options",)}
_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
# How vLLM, llama.cpp's server and llama-cpp-python word a prompt that does not fit; used only when
# the error carries none of the codes above.
_CONTEXT_MARKERS = ("context length", "context window", "context size", "maximum context")
DEADLINE_RETRY_AFTER_S = 1.0
# OpenAI's `param` names a field of the request (`messages[0].content`) and its `code` is
# lower-case snake_case (`invalid_value`); anything else (prose, an address, a hostname) stays in
# the log
_PARAM = re.compile(r"^([a-z_]+)(?:\.?\[\d{1,6}\]|\.[a-z_][a-z0-9_]*){0,8}$")
_CODE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_REQUEST_FIELDS = frozenset(
    {
        "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_completion_tokens", "max_tokens",
        "messages", "model", "n", "parallel_tool_calls", "presence_penalty", "prompt", "response_format", "seed",
        "stop", "stream", "stream_options", "suffix", "temperature", "tool_choice", "tools", "top_logprobs",
        "top_p", "user",
    }
)  # fmt: skip


class Retryable(Exception):
    """An attempt failed in a way another attempt may not. `summary` may reach a client; `detail`
    (the upstream's own words) goes only to the log."""

    def __init__(
        self,
        summary: str,
        detail: str = "",
        *,
        retry_after: float | None = None,
        timed_out: bool = False,
        repeat: bool = True,
    ) -> None:
        super().__init__(summary)
        self.summary = summary
        self.detail = detail or summary
        self.retry_after = retry_after
        self.timed_out = timed_out
        self.repeat = repeat  # False: try another deployment, never this one again for this request
        self.spent: Generation | None = None  # what it cost, when the client is to be charged (a deadline cut)


@dataclass
class Verdict:
    """What an attempt's failure means. `error` is built only once the breaker has heard of the
    failure, so a Retry-After it carries reads the breaker's current cool-down."""

    error: Callable[[], BaseException]
    healthy: bool
    detail: str

    def __post_init__(self) -> None:
        # the upstream's words go to the log as one line: a line break or a terminal escape in
        # them (a hostile upstream's, or the prompt echoed back) is written escaped, forging none
        self.detail = loggable(self.detail)


def loggable(text: str) -> str:
    """`text` with each character a terminal or a line reader acts on (line breaks, escapes, the
    other controls, U+2028) written as its Python escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@dataclass(frozen=True)
class Failures:
    """One tier's reading of its failed attempts (see the module docstring)."""

    tier: str
    timeout_s: float  # the tier's; bounds an upstream's Retry-After
    breaker: CircuitBreaker
    retry_after_s: float  # cascade.retry_after_s: what a client hears when nothing says better

    def classify(
        self,
        exc: BaseException,
        *,
        too_large: Callable[[], AnswerTooLargeError] | None = None,
        refused: Callable[[], UpstreamRefusedError] | None = None,
        fewer: Callable[[], ChoicesUnsupportedError] | None = None,
    ) -> Verdict | None:
        """What an attempt's exception means: what to raise, whether the upstream looked healthy,
        and the full story for the log. None: cancelled, or not the upstream's doing.
        `too_large`: given when an honest answer to the request could be over the size limit
        (`router.backends.openai.answer_size`); an answer refused for its size is then the
        request's, and this is what the client hears. `refused`: given when the failure is a 5xx or
        an error event and the deployment answers a request of the tier's own
        (`router.backends.openai.outages`): the failure is then the request's, and this is what
        the client hears. `fewer`: given for an answer with fewer choices than asked (`FewerChoices`):
        the server answered, and does not honour n; this is what the client hears."""
        if fewer is not None:
            return Verdict(fewer, healthy=True, detail=f"{exc}: the upstream does not honour n")
        if refused is not None and _cause(exc, Unacceptable) is None:
            told = f"{_told(exc)}; the deployment answers a request of the tier's own: this request's doing"
            return Verdict(refused, healthy=True, detail=told)
        unacceptable = _cause(exc, Unacceptable)
        if unacceptable is not None:
            told = f"{unacceptable} ({unacceptable.said})" if unacceptable.said else str(unacceptable)
            if unacceptable.size and too_large is not None:
                # the request asked for an answer this large: the upstream did its job, and
                # another deployment would only generate it again (at the operator's cost)
                return Verdict(too_large, healthy=True, detail=f"{told}; the request asks for an answer that large")
            # Not retried at this deployment (it would send as much again), but another one of
            # the tier may answer: a hostile or broken deployment must not fail the request.
            summary = f"the upstream's answer was refused: {unacceptable}"
            return Verdict(
                lambda: Retryable(summary, told, repeat=False),
                healthy=False,
                detail=told,
            )
        if isinstance(exc, openai.APIStatusError):
            return self._classify_status(exc)
        if isinstance(exc, (openai.APITimeoutError, TimeoutError, httpx2.TimeoutException)):
            return Verdict(lambda: Retryable("timed out", timed_out=True), healthy=False, detail="timed out")
        if isinstance(exc, (openai.APIConnectionError, httpx2.TransportError)):
            cause = exc.__cause__ or exc
            detail = f"connection failed: {type(cause).__name__}: {cause}"
            summary = f"connection failed ({type(cause).__name__})"
            return Verdict(lambda: Retryable(summary, detail), healthy=False, detail=detail)
        if isinstance(exc, Malformed):
            detail = f"malformed response: {exc}"
            return Verdict(lambda: Retryable("malformed response", detail), healthy=False, detail=detail)
        if isinstance(exc, ErrorEvent):
            detail = f"error event in the stream: {exc}"
            return Verdict(lambda: Retryable("an error event in the stream", detail), healthy=False, detail=detail)
        return None

    def _classify_status(self, exc: openai.APIStatusError) -> Verdict:
        status = exc.status_code
        text = _error_text(exc)
        detail = f"HTTP {status}: {text}"
        hint = parse_retry_after(exc.response.headers, limit=self.timeout_s)
        if status in _RETRYABLE_STATUS or status >= 500:
            return Verdict(lambda: Retryable(f"HTTP {status}", detail, retry_after=hint), healthy=False, detail=detail)
        if status in _REQUEST_STATUS:
            if _is_context_length(exc, text):
                return Verdict(
                    lambda: ContextLengthError(
                        f"tier {self.tier}: the prompt and max_tokens do not fit the upstream model's "
                        f"context (HTTP {status})"
                    ),
                    healthy=True,
                    detail=detail,
                )
            return Verdict(
                lambda: RequestError(
                    f"tier {self.tier}: the upstream rejected the request (HTTP {status})",
                    param=_param(exc.param),
                    code=_code(exc.code),
                ),
                healthy=True,
                detail=detail,
            )
        return Verdict(
            lambda: UpstreamError(
                f"tier {self.tier}: the upstream answered HTTP {status}",
                retry_after=self.client_retry_after(hint),
            ),
            healthy=True,
            detail=detail,
        )

    def give_up(self, exc: Retryable, call: Call) -> UnavailableError:
        """What the client hears when the retries end on a retryable failure."""
        attempts = f"{call.attempts} attempt{'s' if call.attempts != 1 else ''}"
        if not exc.repeat:  # an answer over the limits, and no other deployment left to ask
            return UpstreamError(f"tier {self.tier}: {exc.summary}", retry_after=self.client_retry_after(None))
        if exc.timed_out or call.remaining() <= 0:
            return DeadlineError(
                f"tier {self.tier}: deadline passed after {attempts}; last: {exc.summary}",
                retry_after=DEADLINE_RETRY_AFTER_S,
                spent=exc.spent,
            )
        if exc.retry_after is not None and exc.retry_after >= call.remaining():
            why = "the upstream asks to wait past the deadline"
        else:
            why = f"gave up after {attempts}"
        return UpstreamError(
            f"tier {self.tier}: {why}; last: {exc.summary}",
            retry_after=self.client_retry_after(exc.retry_after),
        )

    def mid_stream(self, mapped: BaseException, call: Call, chars: int) -> BaseException:
        """What a stream that broke after `chars` characters reached the client raises, given what
        the failed read would have raised: a retryable failure can no longer be retried."""
        if not isinstance(mapped, Retryable):
            return mapped
        where = f"after {chars} characters of output"
        if mapped.timed_out or call.remaining() <= 0:
            return DeadlineError(
                f"tier {self.tier}: deadline passed mid-stream {where}",
                retry_after=DEADLINE_RETRY_AFTER_S,
            )
        return UpstreamError(
            f"tier {self.tier}: the upstream stream broke {where}: {mapped.summary}",
            retry_after=self.client_retry_after(mapped.retry_after),
        )

    def client_retry_after(self, upstream: float | None) -> float:
        """The one Retry-After rule for a client whose request this tier failed (module docstring)."""
        breaker = self.breaker.retry_after()
        if upstream is None and breaker <= 0:
            return float(self.retry_after_s)
        return max(1.0, upstream or 0.0, breaker)


# -- reading an upstream's error -----------------------------------------------------------------


def _error_text(exc: openai.APIStatusError) -> str:
    """The upstream's own words, for the log and for recognising refusals: OpenAI's error.message,
    or FastAPI's detail (without inputs)."""
    body = exc.body
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message[:LOG_TEXT_CHARS]
        detail = body.get("detail")
        if isinstance(detail, str) and detail:
            return detail[:LOG_TEXT_CHARS]
        if isinstance(detail, list):
            parts = []
            for item in detail:
                if isinstance(item, dict):
                    loc = item.get("loc", ())
                    where = ".".join(str(p) for p in loc) if isinstance(loc, list) else str(loc)
                    parts.append(f"{where}: {item.get('msg', '')}".strip(": "))
            if parts:
                return "; ".join(parts)[:LOG_TEXT_CHARS]
    if isinstance(body, str) and body.strip():
        return body.strip()[:LOG_TEXT_CHARS]
    return str(exc.message)[:LOG_TEXT_CHARS]


def _told(exc: BaseException) -> str:
    """What a 5xx or an error event said, for the log."""
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {_error_text(exc)}"
    return f"error event in the stream: {exc}"


def _param(value: Any) -> str | None:
    found = _PARAM.match(value) if isinstance(value, str) and len(value) <= 64 else None
    return value if found is not None and found.group(1) in _REQUEST_FIELDS else None


def _code(value: Any) -> str | None:
    return value if isinstance(value, str) and _CODE.match(value) else None


def _is_context_length(exc: openai.APIStatusError, detail: str) -> bool:
    if exc.code in _CONTEXT_CODES or getattr(exc, "type", None) in _CONTEXT_CODES:
        return True
    lowered = detail.lower()
    return any(marker in lowered for marker in _CONTEXT_MARKERS)


def refused_param(exc: openai.APIStatusError, params: dict[str, Any]) -> str | None:
    """The optional parameter a 400/413/422 seems to refuse, if we sent it: read from words a client
    can steer, so good for that request alone (module docstring)."""
    if exc.status_code not in _REQUEST_STATUS:
        return None
    detail = _error_text(exc).lower()
    for name, spellings in _OPTIONAL_PARAMS.items():
        if name not in params:
            continue
        if exc.param in spellings or any(s in detail for s in spellings):
            return name
    return None


def _cause(exc: BaseException, kind: type[BaseException]) -> Any:
    """`exc` or the first exception of `kind` it was raised from (the SDK wraps what httpx raises)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__
    return None
