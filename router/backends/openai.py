"""The `openai` backend: a tier served by any OpenAI-compatible server (vLLM, llama.cpp, hosted).

One logical request gives one `Generation` or one exception, never both and never two:

- The SDK's own retries are off. `router.retry.RetryPolicy` (tenacity) retries what is the
  upstream's passing trouble: connection errors, timeouts, HTTP 408/409/429/5xx, and a 200 whose
  body is not a well-formed completion. It backs off with jitter, honours `Retry-After`, and never
  runs past the deadline: `request.deadline` or now + the tier's `timeout_s`, whichever is sooner.
  Each attempt may use only the time that remains.
- `generate` makes one non-streaming call per attempt: cheaper, and retryable as a whole.
- `stream` retries only until the first piece of text has been yielded. After that a failure
  raises, because retrying would repeat text the caller already has, and returning what arrived as
  if it were complete would pass off a truncated answer. A stream counts as complete only when the
  upstream sent a `finish_reason`.
- Each attempt passes through the tier's `CircuitBreaker` (see `router.breaker`): every failed
  attempt counts as a failure; a deliberate answer, including a 4xx rejecting our request, counts
  as the upstream being alive.

Errors raised (all from `router.errors`)::

    400/413/422 from upstream     -> ContextLengthError if it says the context is too long,
                                     else RequestError (not retried: the request is the problem)
    401/403/404/other 4xx         -> UpstreamError at once (not retried: tier misconfigured)
    retryable, attempts spent     -> UpstreamError (retry_after: the upstream's Retry-After if any)
    Retry-After beyond deadline   -> UpstreamError at once, carrying that Retry-After
    deadline passed               -> DeadlineError
    breaker open or probing       -> CircuitOpenError (retry_after: remaining cool-down)
    stream cut after text began   -> UpstreamError (DeadlineError if the deadline cut it)

When the server refuses `logprobs` or `stream_options` with a 400 naming them, the call is
repeated once without that parameter, and the tier stops sending it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import openai
import pydantic

from router.backends.base import Backend
from router.breaker import CircuitBreaker, Permit
from router.errors import (
    ConfigError,
    ContextLengthError,
    DeadlineError,
    RequestError,
    UnavailableError,
    UpstreamError,
)
from router.generation import Delta, FinishReason, Generation, GenerationRequest
from router.retry import RetryPolicy, parse_retry_after

if TYPE_CHECKING:
    from router.config import OpenAIBackendSettings, Settings, TierSettings

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_REQUEST_STATUS = frozenset({400, 413, 422})  # the upstream says our request is the problem
# Optional parameters a server may refuse; each maps to the names a refusal may use for it.
_OPTIONAL_PARAMS = {"logprobs": ("logprobs", "top_logprobs"), "stream_options": ("stream_options",)}
_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
# How vLLM, llama.cpp's server and llama-cpp-python word a prompt that does not fit; used only when
# the error carries none of the codes above.
_CONTEXT_MARKERS = ("context length", "context window", "context size", "maximum context")
_DEADLINE_RETRY_AFTER_S = 1.0

_T = TypeVar("_T")


class _Retryable(Exception):
    """An attempt failed in a way another attempt may not."""

    def __init__(self, reason: str, *, retry_after: float | None = None, timed_out: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.timed_out = timed_out


class _Malformed(Exception):
    """A 2xx answer that is not a well-formed completion."""


@dataclass
class _Call:
    """One logical request: its deadline and what it has cost so far."""

    request: GenerationRequest
    deadline: float
    started: float
    attempts: int = 0

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


class OpenAIBackend(Backend):
    gives_logprobs = True
    local = False

    def __init__(
        self,
        name: str,
        config: OpenAIBackendSettings,
        *,
        timeout_s: float = 120.0,
        max_tokens: int | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        super().__init__(name)
        self.config = config
        self.model = config.model
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self.gives_logprobs = config.logprobs
        self.policy = RetryPolicy(
            max_attempts=config.max_attempts,
            backoff_initial_s=config.backoff_initial_s,
            backoff_max_s=max(config.backoff_max_s, config.backoff_initial_s),
        )
        self.breaker = breaker or CircuitBreaker(
            name, failures=config.breaker_failures, cooldown_s=config.breaker_cooldown_s
        )
        self._client: openai.AsyncOpenAI | None = None
        self._closed = False
        self._refused: set[str] = set() if config.logprobs else {"logprobs"}
        self._attempts_total = 0
        self._retries_total = 0
        self._failed_total = 0

    @classmethod
    def from_settings(cls, tier: TierSettings, settings: Settings) -> OpenAIBackend:
        if tier.openai is None:
            raise ConfigError(f"tier {tier.name}: backend 'openai' needs a [tiers.openai] section")
        return cls(tier.name, tier.openai, timeout_s=tier.timeout_s, max_tokens=tier.max_tokens)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        self._ensure_client()

    async def close(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    @property
    def ready(self) -> bool:
        # An open breaker does not make the tier unready: every replica shares the upstream, so
        # taking this one out of a load balancer would help nobody. The breaker shows in stats().
        return self._client is not None and not self._closed

    def stats(self) -> dict[str, float]:
        return {
            **self.breaker.stats(),
            "upstream_attempts_total": float(self._attempts_total),
            "upstream_retries_total": float(self._retries_total),
            "upstream_failed_requests_total": float(self._failed_total),
        }

    def _ensure_client(self) -> openai.AsyncOpenAI:
        if self._closed:
            raise UnavailableError(f"tier {self.name}: backend is closed")
        if self._client is None:
            self._client = openai.AsyncOpenAI(
                base_url=self.config.base_url,
                api_key=self._api_key(),
                max_retries=0,  # tenacity decides, within the deadline
                timeout=self.timeout_s,
            )
        return self._client

    def _api_key(self) -> str:
        env = self.config.api_key_env
        if env is None:
            return "not-needed"  # the SDK insists on a key; local servers ignore it
        key = os.environ.get(env)
        if not key:
            raise ConfigError(
                f"tier {self.name}: tiers.openai.api_key_env names {env}, which is not set"
            )
        return key

    # -- the two ways to generate ------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> Generation:
        call = self._new_call(request)
        return await self._with_retries(call, self._attempt_generate)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        call = self._new_call(request)
        opened = await self._with_retries(call, self._attempt_open_stream)
        upstream, acc, permit = opened.upstream, opened.acc, opened.permit
        ttft: float | None = None
        try:
            piece = opened.first
            while piece is not None:
                if ttft is None:
                    ttft = time.monotonic() - call.started
                yield Delta(piece, *acc.so_far(call))
                try:
                    piece = await self._next_piece(upstream, acc, call)
                except Exception as exc:
                    mapped = self._stream_cut(permit, exc, call, acc)
                    if mapped is exc:
                        raise
                    raise mapped from exc
            if acc.finish_reason is None:
                permit.failure()
                self._failed_total += 1
                raise UpstreamError(
                    f"tier {self.name}: the upstream stream ended without finishing the answer "
                    f"({len(acc.text)} characters received)",
                    retry_after=self._fallback_retry_after(None),
                )
            permit.success()
        finally:
            permit.release()  # no-op when an outcome was reported; covers an abandoned stream
            await _close_quietly(upstream)
        yield acc.generation(call, self.model, ttft_s=ttft)

    # -- attempts --------------------------------------------------------------------------------

    async def _with_retries(self, call: _Call, attempt_fn: Callable[[_Call], Awaitable[_T]]) -> _T:
        retrying = self.policy.retrying(
            deadline=call.deadline,
            is_retryable=lambda exc: isinstance(exc, _Retryable),
            retry_after=lambda exc: exc.retry_after if isinstance(exc, _Retryable) else None,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await attempt_fn(call)
        except _Retryable as exc:
            self._failed_total += 1
            # Chain to what the upstream did, not to the internal marker that carried it here.
            raise self._give_up(exc, call) from (exc.__cause__ or exc)
        finally:
            self._retries_total += max(0, call.attempts - 1)
        raise AssertionError("tenacity ended without a result")  # pragma: no cover

    def _begin_attempt(self, call: _Call) -> Permit:
        if call.remaining() <= 0:
            # Checked before the breaker: an attempt we never make says nothing about the upstream.
            raise DeadlineError(
                f"tier {self.name}: deadline passed before attempt {call.attempts + 1}",
                retry_after=_DEADLINE_RETRY_AFTER_S,
            )
        permit = self.breaker.acquire()
        call.attempts += 1
        self._attempts_total += 1
        return permit

    async def _attempt_generate(self, call: _Call) -> Generation:
        client = self._ensure_client()
        permit = self._begin_attempt(call)
        try:
            endpoint = client.chat.completions if call.request.is_chat else client.completions
            raw = await self._create(call, endpoint.with_raw_response.create, stream=False)
            try:
                parsed = raw.parse()
            except (ValueError, openai.APIResponseValidationError) as exc:
                raise _Malformed(f"response body is not JSON: {exc}") from exc
            generation = self._read_response(parsed, call)
        except BaseException as exc:
            mapped = self._settle(permit, exc)
            if mapped is exc:
                raise
            raise mapped from exc
        permit.success()
        return generation

    async def _attempt_open_stream(self, call: _Call) -> _OpenStream:
        """Open the stream and read up to the first piece of text: the part that may be retried."""
        client = self._ensure_client()
        permit = self._begin_attempt(call)
        upstream: Any = None
        try:
            endpoint = client.chat.completions if call.request.is_chat else client.completions
            upstream = await self._create(call, endpoint.create, stream=True)
            acc = _Accumulator(chat=call.request.is_chat, logprobs="logprobs" not in self._refused)
            first = await self._next_piece(upstream, acc, call)
            if first is None and acc.finish_reason is None:
                raise _Malformed("the stream ended before any output or finish_reason")
        except BaseException as exc:
            if upstream is not None:
                await _close_quietly(upstream)
            mapped = self._settle(permit, exc)
            if mapped is exc:
                raise
            raise mapped from exc
        return _OpenStream(upstream, acc, permit, first)

    async def _create(self, call: _Call, create: Any, *, stream: bool) -> Any:
        """Send one call, repeating it once per optional parameter the server refuses."""
        while True:
            params = self._params(call.request, stream=stream)
            remaining = call.remaining()
            try:
                async with asyncio.timeout(remaining):
                    return await create(**params, timeout=remaining)
            except openai.APIStatusError as exc:
                refused = _refused_param(exc, params)
                if refused is None:
                    raise
                self._refused.add(refused)
                if refused == "logprobs":
                    self.gives_logprobs = False  # so the cascade knows its verifiers go without

    async def _next_piece(self, upstream: Any, acc: _Accumulator, call: _Call) -> str | None:
        """The next non-empty piece of text, or None when the stream has ended."""
        while True:
            try:
                async with asyncio.timeout(call.remaining()):
                    chunk = await anext(upstream)
            except StopAsyncIteration:
                return None
            piece = acc.add(chunk)
            if piece:
                return piece

    def _params(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        max_tokens = request.max_tokens
        if self.max_tokens is not None:
            max_tokens = min(max_tokens, self.max_tokens)
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
        }
        if request.seed is not None:
            params["seed"] = request.seed
        if request.stop:
            params["stop"] = list(request.stop)
        if request.messages is not None:
            params["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
        else:
            params["prompt"] = request.prompt
        if "logprobs" not in self._refused:
            if request.is_chat:
                # top_logprobs=0 is OpenAI's "none of the alternatives"; llama-cpp-python's server
                # returns no logprobs at all without it.
                params["logprobs"] = True
                params["top_logprobs"] = 0
            else:
                params["logprobs"] = 1
        if stream:
            params["stream"] = True
            if "stream_options" not in self._refused:
                params["stream_options"] = {"include_usage": True}
        return params

    def _read_response(self, parsed: Any, call: _Call) -> Generation:
        try:
            choice = parsed.choices[0]
            if call.request.is_chat:
                text = choice.message.content or ""
            else:
                text = choice.text or ""
            if not isinstance(text, str):
                raise TypeError(f"text is {type(text).__name__}")
            logprobs = None
            if "logprobs" not in self._refused:
                logprobs = _token_logprobs(getattr(choice, "logprobs", None))
            usage = getattr(parsed, "usage", None)
            prompt_tokens, completion_tokens = _usage(usage)
            finish = choice.finish_reason
            model = getattr(parsed, "model", None)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise _Malformed(f"response is not a completion: {type(exc).__name__}: {exc}") from exc
        if prompt_tokens is None:
            prompt_tokens = _estimate_tokens(_prompt_text(call.request))
        if completion_tokens is None:
            completion_tokens = len(logprobs) if logprobs is not None else _estimate_tokens(text)
        return Generation(
            text=text,
            finish_reason=_finish(finish),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            token_logprobs=logprobs,
            latency_s=time.monotonic() - call.started,
            model=model if isinstance(model, str) and model else self.model,
        )

    # -- failures --------------------------------------------------------------------------------

    def _new_call(self, request: GenerationRequest) -> _Call:
        now = time.monotonic()
        deadline = now + self.timeout_s
        if request.deadline is not None:
            deadline = min(deadline, request.deadline)
        return _Call(request=request, deadline=deadline, started=now)

    def _settle(self, permit: Permit, exc: BaseException) -> BaseException:
        """Report an attempt's failure to the breaker; return what the attempt should raise."""
        classified = self._classify(exc)
        if classified is None:  # cancelled, or not the upstream's doing
            permit.release()
            return exc
        error, healthy = classified
        if healthy:
            permit.success()
        else:
            permit.failure()
        return error

    def _classify(self, exc: BaseException) -> tuple[Exception, bool] | None:
        """Map an attempt's exception to (what to raise, whether the upstream looked healthy)."""
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            detail = _error_text(exc)
            retry_after = parse_retry_after(exc.response.headers)
            if status in _RETRYABLE_STATUS or status >= 500:
                return _Retryable(f"HTTP {status}: {detail}", retry_after=retry_after), False
            if status in _REQUEST_STATUS:
                if _is_context_length(exc, detail):
                    return ContextLengthError(f"tier {self.name}: {detail}"), True
                return RequestError(
                    f"tier {self.name}: the upstream rejected the request (HTTP {status}): {detail}",
                    param=exc.param,
                    code=exc.code,
                ), True
            return UpstreamError(
                f"tier {self.name}: the upstream answered HTTP {status}: {detail}",
                retry_after=self._fallback_retry_after(retry_after),
            ), True
        if isinstance(exc, (openai.APITimeoutError, TimeoutError)):
            return _Retryable("timed out", timed_out=True), False
        if isinstance(exc, (openai.APIConnectionError, httpx.TransportError)):
            cause = exc.__cause__ or exc
            return _Retryable(f"connection failed: {type(cause).__name__}: {cause}"), False
        if isinstance(exc, (_Malformed, json.JSONDecodeError, pydantic.ValidationError)):
            return _Retryable(f"malformed response: {exc}"), False
        if isinstance(exc, openai.APIError):  # e.g. an error event inside a stream
            return _Retryable(f"upstream error: {exc.message}"), False
        return None

    def _give_up(self, exc: _Retryable, call: _Call) -> UnavailableError:
        attempts = f"{call.attempts} attempt{'s' if call.attempts != 1 else ''}"
        if exc.timed_out or call.remaining() <= 0:
            return DeadlineError(
                f"tier {self.name}: deadline passed after {attempts}; last: {exc.reason}",
                retry_after=_DEADLINE_RETRY_AFTER_S,
            )
        if exc.retry_after is not None and exc.retry_after >= call.remaining():
            why = f"the upstream asks to wait {exc.retry_after:.1f}s, past the deadline"
        else:
            why = f"gave up after {attempts}"
        return UpstreamError(
            f"tier {self.name}: {why}; last: {exc.reason}",
            retry_after=self._fallback_retry_after(exc.retry_after),
        )

    def _stream_cut(
        self, permit: Permit, exc: Exception, call: _Call, acc: _Accumulator
    ) -> BaseException:
        mapped = self._settle(permit, exc)
        if not isinstance(mapped, _Retryable):
            return mapped
        self._failed_total += 1
        where = f"after {len(acc.text)} characters of output"
        if mapped.timed_out or call.remaining() <= 0:
            return DeadlineError(
                f"tier {self.name}: deadline passed mid-stream {where}",
                retry_after=_DEADLINE_RETRY_AFTER_S,
            )
        return UpstreamError(
            f"tier {self.name}: the upstream stream broke {where}: {mapped.reason}",
            retry_after=self._fallback_retry_after(mapped.retry_after),
        )

    def _fallback_retry_after(self, retry_after: float | None) -> float:
        if retry_after is not None:
            return retry_after
        return max(self.breaker.retry_after(), self.policy.backoff_max_s)


@dataclass
class _OpenStream:
    upstream: Any
    acc: _Accumulator
    permit: Permit
    first: str | None


@dataclass
class _Accumulator:
    """Folds stream chunks into the final answer."""

    chat: bool
    logprobs: bool
    parts: list[str] = field(default_factory=list)
    token_logprobs: list[float] | None = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model: str | None = None
    prompt_estimate: int | None = None  # when the server reports no usage

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, chunk: Any) -> str:
        try:
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                self.prompt_tokens, self.completion_tokens = _usage(usage)
            model = getattr(chunk, "model", None)
            if isinstance(model, str) and model:
                self.model = model
            choices = chunk.choices or []
            if not choices:
                return ""
            choice = choices[0]
            if self.chat:
                delta = getattr(choice, "delta", None)
                piece = getattr(delta, "content", None) or ""
            else:
                piece = choice.text or ""
            if not isinstance(piece, str):
                raise TypeError(f"text is {type(piece).__name__}")
            if piece and self.token_logprobs is not None:
                lps = _token_logprobs(getattr(choice, "logprobs", None)) if self.logprobs else None
                if lps is None:
                    self.token_logprobs = None  # one piece without them makes the set unusable
                else:
                    self.token_logprobs.extend(lps)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise _Malformed(f"stream chunk is not a completion chunk: {exc}") from exc
        if piece:
            self.parts.append(piece)
        return piece

    def prompt_count(self, call: _Call) -> int:
        """The prompt tokens the server reported, else an estimate (made once per call)."""
        if self.prompt_tokens is not None:
            return self.prompt_tokens
        if self.prompt_estimate is None:
            self.prompt_estimate = _estimate_tokens(_prompt_text(call.request))
        return self.prompt_estimate

    def so_far(self, call: _Call) -> tuple[int, int]:
        """(prompt, completion) tokens spent so far, counted as `generation` counts them (a
        stream cut short is priced from these)."""
        return self.prompt_count(call), len(self.token_logprobs) if self.token_logprobs else len(self.parts)

    def generation(self, call: _Call, default_model: str, *, ttft_s: float | None) -> Generation:
        text = self.text
        logprobs = tuple(self.token_logprobs) if self.token_logprobs is not None and text else None
        prompt_tokens = self.prompt_count(call)
        completion_tokens = self.completion_tokens
        if completion_tokens is None:
            # Servers send about one token per chunk; logprobs, when present, count exactly.
            completion_tokens = len(logprobs) if logprobs is not None else len(self.parts)
        return Generation(
            text=text,
            finish_reason=_finish(self.finish_reason),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            token_logprobs=logprobs,
            latency_s=time.monotonic() - call.started,
            ttft_s=ttft_s,
            model=self.model or default_model,
        )


# -- response reading ----------------------------------------------------------------------------


def _token_logprobs(logprobs: Any) -> tuple[float, ...] | None:
    """The sampled tokens' logprobs from a chat (`content`) or completions (`token_logprobs`) shape."""
    if logprobs is None:
        return None
    content = getattr(logprobs, "content", None)
    if content is not None:
        values = [getattr(item, "logprob", None) for item in content]
    else:
        raw = getattr(logprobs, "token_logprobs", None)
        if raw is None:
            return None
        values = list(raw)
    floats = tuple(float(v) for v in values if isinstance(v, (int, float)))
    return floats if all(not math.isnan(v) for v in floats) else None


def _usage(usage: Any) -> tuple[int | None, int | None]:
    if usage is None:
        return None, None
    prompt = getattr(usage, "prompt_tokens", None)
    completion = getattr(usage, "completion_tokens", None)
    return (
        int(prompt) if isinstance(prompt, int) else None,
        int(completion) if isinstance(completion, int) else None,
    )


def _finish(reason: str | None) -> FinishReason:
    return "length" if reason == "length" else "stop"


def _prompt_text(request: GenerationRequest) -> str:
    if request.prompt is not None:
        return request.prompt
    return "\n".join(m.content for m in request.messages or ())


def _estimate_tokens(text: str) -> int:
    # Only when the server reports no usage: about four characters a token in English.
    return max(1, round(len(text) / 4)) if text else 0


# -- upstream error reading ----------------------------------------------------------------------


def _error_text(exc: openai.APIStatusError) -> str:
    """The upstream's own words: OpenAI's error.message, or FastAPI's detail (without inputs)."""
    body = exc.body
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
        detail = body.get("detail")
        if isinstance(detail, str) and detail:
            return detail
        if isinstance(detail, list):
            parts = []
            for item in detail:
                if isinstance(item, dict):
                    loc = ".".join(str(p) for p in item.get("loc", ()))
                    parts.append(f"{loc}: {item.get('msg', '')}".strip(": "))
            if parts:
                return "; ".join(parts)
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return exc.message


def _is_context_length(exc: openai.APIStatusError, detail: str) -> bool:
    if exc.code in _CONTEXT_CODES or getattr(exc, "type", None) in _CONTEXT_CODES:
        return True
    lowered = detail.lower()
    return any(marker in lowered for marker in _CONTEXT_MARKERS)


def _refused_param(exc: openai.APIStatusError, params: dict[str, Any]) -> str | None:
    """The optional parameter a 400/422 says the server does not support, if we sent it."""
    if exc.status_code not in _REQUEST_STATUS:
        return None
    detail = _error_text(exc).lower()
    for name, spellings in _OPTIONAL_PARAMS.items():
        if name not in params:
            continue
        if exc.param in spellings or any(s in detail for s in spellings):
            return name
    return None


async def _close_quietly(upstream: Any) -> None:
    # Closing a broken stream may fail again; the first error is the one to keep.
    with contextlib.suppress(Exception):
        await upstream.close()

