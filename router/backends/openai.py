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
  if it were complete would pass off a truncated answer.
- Each attempt passes through the tier's `CircuitBreaker` (see `router.breaker`): every failed
  attempt counts as a failure; a deliberate answer, including a 4xx rejecting our request, counts
  as the upstream being alive.

An upstream is not trusted any more than a client is (DESIGN.md, security boundary):

- Size. Every response passes through `upstream_io.CappedTransport`, the httpx transport under the SDK's
  client. It asks for `Accept-Encoding: identity` and refuses a compressed body (its size on the
  wire says nothing of its size in memory), refuses a `Content-Length` over `max_response_bytes`,
  and stops reading at that many bytes. The transport is the one place every byte passes: a
  body, a stream, and the error bodies the SDK reads on its own before we see them. An httpx event
  hook sees a response before its body is read and cannot bound the read; reading the raw
  response at our call sites would leave the SDK's own reads of error bodies unbounded. A stream
  is also capped at `max_stream_events` events, and at twice `max_tokens` (plus a slack) pieces
  of text: an upstream that ignores `max_tokens` is stopped there. Too much is an upstream
  failure, not retried.
- Shape. The SDK builds the request and maps error statuses; answers are parsed here from the raw
  JSON, not through the SDK's models, which it builds without validation and which let any type
  through. A field of the wrong type makes the answer malformed (retried like a 5xx); bytes that
  are not UTF-8 and lone surrogates become U+FFFD; only choice 0 is read, however many are sent.
  Logprobs must be finite and at most 0, or the tier's logprobs for that answer are dropped.
  Top-k alternatives (asked for only when the request wants them) are clamped: at most the k
  asked for, the likeliest kept; an alternative whose logprob is not a finite number at most 0 is
  dropped; a piece is cut to `MAX_PIECE_CHARS`; more tokens than the answer could have, or a
  malformed shape, drops the answer's top-k (its text stands).
- Usage. Token counts must be whole numbers, at least 0; the prompt's at most the UTF-8 bytes of
  everything it was sent (`router.reservation`: messages, calls, tools, schema) plus an allowance
  per message for the chat template and one for a hosted API's own system prompt; the
  completion's at most the `max_tokens` we sent (times `n`) plus a small slack. Admission reserves
  exactly these limits (`prompt_token_limit`, `completion_token_limit`). Anything else and the
  whole usage is refused with a warning in the log,
  and the counts are estimated as for a server that reports none (never above `max_tokens`).
- `Retry-After` is clamped by `router.retry.parse_retry_after` to [0, the tier's timeout], and
  retries never sleep past the deadline whatever it says. A client whose request failed at this
  tier gets one rule, for plain and streamed requests alike: the upstream's value or the
  breaker's remaining cool-down, whichever is longer; when neither says anything,
  `cascade.retry_after_s`. A passed deadline gets 1 s: the next request has a deadline of its own.
- Error text. An upstream's message may carry keys, internal hostnames or a stack trace. Clients
  get a fixed message naming the tier and the upstream's status (and OpenAI's `param`/`code` only
  when they are plain identifiers); the upstream's own words go to the server log, each failed
  attempt at WARNING (the first 4000 characters: a log line is not a body).
- Redirects are not followed: an API that redirects a POST is misconfigured, and following it
  would send the request where the operator did not point the tier.
- Streams. A stream is complete when the upstream sent a `finish_reason` or `data: [DONE]`. A
  `[DONE]` without a `finish_reason` is the server saying the answer is whole without saying why
  it stopped: it is taken as complete, with `length` when the answer used all of `max_tokens`
  (the one reason a server stops untold) and `stop` otherwise. A stream that ends with neither
  (the connection closed) is cut, and raises.

Errors raised (all from `router.errors`)::

    400/413/422 from upstream     -> ContextLengthError if it says the context is too long,
                                     else RequestError (not retried: the request is the problem)
    3xx/401/403/404/other 4xx     -> UpstreamError at once (not retried: tier misconfigured)
    retryable, attempts spent     -> UpstreamError (retry_after as above)
    Retry-After beyond deadline   -> UpstreamError at once, carrying that Retry-After
    answer over the size limits   -> UpstreamError at once (not retried)
    deadline passed               -> DeadlineError
    breaker open or probing       -> CircuitOpenError (retry_after: remaining cool-down)
    stream cut after text began   -> UpstreamError (DeadlineError if the deadline cut it)

When the server refuses `logprobs` or `stream_options` with a 400 naming them, the call is
repeated once without that parameter, and the tier stops sending it.

`score_continuation` (for the `cross_tier` verifier) makes one non-streaming call per attempt
under the same retries, breaker, deadline and size caps, in the way `tiers[].openai.prompt_logprobs`
names; the answer is read, and clamped, by `router.backends.prompt_scoring`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2
import openai

from router.backends.base import Backend, ContinuationScore, ScoringUnsupportedError
from router.backends.prompt_scoring import ScoredTokens, read_echo, read_vllm, render_chat
from router.backends.upstream_io import (
    LOG_TEXT_CHARS,
    CappedTransport,
    ErrorEvent,
    Malformed,
    SSEReader,
    Unacceptable,
    clean_text,
    environment_proxy,
    event_object,
    first_choice,
    json_object,
    model_name,
    token_count,
    token_logprobs,
    typed_field,
)
from router.breaker import CircuitBreaker, Permit
from router.errors import (
    ConfigError,
    ContextLengthError,
    DeadlineError,
    RequestError,
    UnavailableError,
    UpstreamError,
)
from router.generation import (
    Delta,
    FinishReason,
    Generation,
    GenerationRequest,
    Message,
    NamedTool,
    TokenLogprob,
    ToolCall,
)
from router.reservation import completion_token_bound, prompt_token_bound
from router.retry import RetryPolicy, parse_retry_after
from router.tools import MAX_CALLS, new_call_id

if TYPE_CHECKING:
    from router.config import OpenAIBackendSettings, Settings, TierSettings

log = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_REQUEST_STATUS = frozenset({400, 413, 422})  # the upstream says our request is the problem
# Optional parameters a server may refuse; each maps to the names a refusal may use for it.
_OPTIONAL_PARAMS = {"logprobs": ("logprobs", "top_logprobs"), "stream_options": ("stream_options",)}
_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
# How vLLM, llama.cpp's server and llama-cpp-python word a prompt that does not fit; used only when
# the error carries none of the codes above.
_CONTEXT_MARKERS = ("context length", "context window", "context size", "maximum context")
_DEADLINE_RETRY_AFTER_S = 1.0
# Tokens a server may count past max_tokens: a stop sequence or end-of-text token it includes.
_COMPLETION_SLACK = 8
# A tokenizer gives at most one token per byte of text; a chat template adds a few per message, and
# a hosted API may add a system prompt of its own.
_TEMPLATE_TOKENS_PER_MESSAGE = 64
_TEMPLATE_TOKENS = 4096
# OpenAI's `param` and `code` are identifiers; anything else is prose and stays in the log.
_IDENTIFIER = re.compile(r"^[A-Za-z0-9_.\[\]-]{1,64}$")

# A token's text is a few characters; a longer "piece" is an upstream filling memory, cut here.
MAX_PIECE_CHARS = 64

_T = TypeVar("_T")


class _Retryable(Exception):
    """An attempt failed in a way another attempt may not. `summary` may reach a client; `detail`
    (the upstream's own words) goes only to the log."""

    def __init__(
        self, summary: str, detail: str = "", *, retry_after: float | None = None, timed_out: bool = False
    ) -> None:
        super().__init__(summary)
        self.summary = summary
        self.detail = detail or summary
        self.retry_after = retry_after
        self.timed_out = timed_out


@dataclass
class _Call:
    """One logical request: its deadline, its bounds, and what it has cost so far."""

    request: GenerationRequest
    deadline: float
    started: float
    max_tokens: int  # what the upstream is asked for
    attempts: int = 0

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    @functools.cached_property
    def prompt_limit(self) -> int:
        """The most prompt tokens a server could truthfully report for this request."""
        return _prompt_limit(self.request)

    @property
    def completion_limit(self) -> int:
        return self.request.n * self.max_tokens + _COMPLETION_SLACK  # usage counts all n choices

    @property
    def piece_limit(self) -> int:
        """The most pieces of text a stream may bring: a server sends a token or more per piece;
        twice that leaves room for one that splits tokens, and still stops one that ignores
        max_tokens long before the byte limit."""
        return 2 * self.completion_limit


class OpenAIBackend(Backend):
    def __init__(
        self,
        name: str,
        config: OpenAIBackendSettings,
        *,
        timeout_s: float = 120.0,
        max_tokens: int | None = None,
        retry_after_s: float = 30.0,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        super().__init__(name)
        self.config = config
        self.model = config.model
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self.retry_after_s = retry_after_s
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
        return cls(
            tier.name,
            tier.openai,
            timeout_s=tier.timeout_s,
            max_tokens=tier.max_tokens,
            retry_after_s=settings.cascade.retry_after_s,
        )

    def prompt_token_limit(self, request: GenerationRequest) -> int:
        """The usage this backend accepts from its server (module docstring, Usage)."""
        return _prompt_limit(request)

    def completion_token_limit(self, request: GenerationRequest) -> int:
        return completion_token_bound(request, self.max_tokens) + _COMPLETION_SLACK

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        self._ensure_client()

    async def close(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    @property
    def gives_logprobs(self) -> bool:
        """Whether answers carry the sampled tokens' logprobs (off by config, or refused upstream)."""
        return "logprobs" not in self._refused

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
            # A client given a transport neither sizes its pool nor reads proxy settings from the
            # environment: both are said here, as the SDK's own client would have them.
            inner = httpx2.AsyncHTTPTransport(
                limits=httpx2.Limits(max_connections=1000, max_keepalive_connections=100),
                proxy=environment_proxy(self.config.base_url),
            )
            transport = CappedTransport(
                inner,
                max_bytes=self.config.max_response_bytes,
                # a stream's events each arrive in a piece or two; a plain body in a few
                max_reads=2 * self.config.max_stream_events + 64,
            )
            self._client = openai.AsyncOpenAI(
                base_url=self.config.base_url,
                api_key=self._api_key(),
                max_retries=0,  # tenacity decides, within the deadline
                timeout=self.timeout_s,
                http_client=openai.DefaultAsyncHttpxClient(transport=transport, follow_redirects=False),
            )
        return self._client

    def _api_key(self) -> str:
        env = self.config.api_key_env
        if env is None:
            return "not-needed"  # the SDK insists on a key; local servers ignore it
        key = os.environ.get(env)
        if not key:
            raise ConfigError(f"tier {self.name}: tiers.openai.api_key_env names {env}, which is not set")
        return key

    # -- the two ways to generate ------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> Generation:
        call = self._new_call(request)
        return await self._with_retries(call, self._attempt_generate)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        call = self._new_call(request)
        opened = await self._with_retries(call, self._attempt_open_stream)
        events, acc, permit = opened.events, opened.acc, opened.permit
        ttft: float | None = None
        try:
            piece = opened.first
            while piece is not None:
                if ttft is None:
                    ttft = time.monotonic() - call.started
                yield Delta(piece, *acc.so_far(call), top_logprobs=acc.take_tops())
                try:
                    piece = await self._next_piece(events, acc, call)
                except Exception as exc:
                    mapped = self._stream_cut(permit, exc, call, acc)
                    if mapped is exc:
                        raise
                    raise mapped from exc
            if not acc.complete(events.done):
                permit.failure()
                self._failed_total += 1
                log.warning(
                    "tier %s: the upstream stream ended without finish_reason or [DONE] after %d characters",
                    self.name,
                    len(acc.text),
                )
                raise UpstreamError(
                    f"tier {self.name}: the upstream stream ended without finishing the answer "
                    f"({len(acc.text)} characters received)",
                    retry_after=self._client_retry_after(None),
                )
            permit.success()
        finally:
            permit.release()  # no-op when an outcome was reported; covers an abandoned stream
            await _close_quietly(opened.response)
        yield acc.generation(call, self.model, ttft_s=ttft)

    # -- scoring a given answer (cross_tier) --------------------------------------------------------

    @classmethod
    def scoring_support(cls, tier: TierSettings) -> str | None:
        config = tier.openai
        if config is None or config.prompt_logprobs == "none":
            return "its openai.prompt_logprobs is 'none' (set 'echo' or 'vllm' where the server supports it)"
        if config.prompt_logprobs == "echo" and config.chat_template is None:
            return "openai.prompt_logprobs 'echo' needs openai.chat_template to render chat requests"
        return None

    async def score_continuation(self, request: GenerationRequest, continuation: str) -> ContinuationScore:
        mode = self.config.prompt_logprobs
        if mode == "none":
            raise ScoringUnsupportedError(f"tier '{self.name}' cannot score a given answer (prompt_logprobs = 'none')")
        if not continuation:
            raise RequestError("nothing to score: the answer is empty")
        prompt: str | None = request.prompt
        if mode == "echo" and request.messages is not None:
            if self.config.chat_template is None:
                raise ScoringUnsupportedError(f"tier '{self.name}' has no chat_template to render a chat request with")
            prompt = render_chat(self.config.chat_template, request.messages)
        call = self._new_call(request.with_(max_tokens=1, temperature=0.0, top_p=1.0, stop=()))
        attempt = functools.partial(self._attempt_score, continuation=continuation, prompt=prompt)
        scored, prompt_tokens = await self._with_retries(call, attempt)
        return ContinuationScore(
            token_logprobs=scored.logprobs,
            top1=scored.top1,
            prompt_tokens=max(prompt_tokens, len(scored.logprobs)),
            continuation_tokens=len(scored.logprobs),
            seconds=time.monotonic() - call.started,
        )

    async def _attempt_score(self, call: _Call, *, continuation: str, prompt: str | None) -> tuple[ScoredTokens, int]:
        client = self._ensure_client()
        permit = self._begin_attempt(call)
        request = call.request
        endpoint: Any
        params: dict[str, Any] = {"model": self.model, "max_tokens": 1, "temperature": 0.0}
        if self.config.prompt_logprobs == "echo":
            assert prompt is not None
            endpoint = client.completions
            params.update(prompt=prompt + continuation, echo=True, logprobs=1)
        elif request.messages is not None:
            endpoint = client.chat.completions
            messages = [{"role": m.role, "content": m.content} for m in request.messages]
            params["messages"] = [*messages, {"role": "assistant", "content": continuation}]
            params["extra_body"] = {
                "prompt_logprobs": 1,
                "add_generation_prompt": False,
                "continue_final_message": True,
            }
        else:
            assert prompt is not None
            endpoint = client.completions
            params.update(prompt=prompt + continuation, extra_body={"prompt_logprobs": 1})
        try:
            async with asyncio.timeout(call.remaining()):
                response = await endpoint.with_streaming_response.create(
                    **params, timeout=call.remaining()
                ).__aenter__()
            data = await _json_body(response, call)
            choice = first_choice(data.get("choices"), required=True)
            assert choice is not None
            if self.config.prompt_logprobs == "echo":
                assert prompt is not None
                scored = read_echo(choice, prompt + continuation, continuation)
            else:
                where = data if request.messages is not None else choice
                scored = read_vllm(where.get("prompt_logprobs"), call.prompt_limit, continuation)
            # the usage, when sane, counts the continuation too; else the tokens the server read
            limit = call.prompt_limit + len(continuation.encode("utf-8", "replace"))
            usage = data.get("usage")
            counted = token_count(usage.get("prompt_tokens")) if isinstance(usage, dict) else None
            prompt_tokens = counted if counted is not None and counted <= limit else min(scored.echoed_tokens, limit)
        except BaseException as exc:
            mapped = self._settle(permit, exc, call)
            if mapped is exc:
                raise
            raise mapped from exc
        permit.success()
        return scored, prompt_tokens

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
            response = await self._open(client, call, stream=False)
            generation = self._read_response(await _json_body(response, call), call)
        except BaseException as exc:
            mapped = self._settle(permit, exc, call)
            if mapped is exc:
                raise
            raise mapped from exc
        permit.success()
        return generation

    async def _attempt_open_stream(self, call: _Call) -> _OpenStream:
        """Open the stream and read up to the first piece of text: the part that may be retried."""
        client = self._ensure_client()
        permit = self._begin_attempt(call)
        response: Any = None
        try:
            response = await self._open(client, call, stream=True)
            events = SSEReader(response.http_response.aiter_raw(), max_events=self.config.max_stream_events)
            acc = _Accumulator(
                chat=call.request.is_chat,
                logprobs="logprobs" not in self._refused,
                tier=self.name,
                top_k=call.request.top_logprobs if "logprobs" not in self._refused else 0,
                calls={} if call.request.offers_tools else None,
            )
            first = await self._next_piece(events, acc, call)
            if first is None and not acc.complete(events.done):
                raise Malformed("the stream ended before any output or finish_reason")
        except BaseException as exc:
            if response is not None:
                await _close_quietly(response)
            mapped = self._settle(permit, exc, call)
            if mapped is exc:
                raise
            raise mapped from exc
        return _OpenStream(response, events, acc, permit, first)

    async def _open(self, client: openai.AsyncOpenAI, call: _Call, *, stream: bool) -> Any:
        """Send one call and return the response with its body unread, repeating the call once per
        optional parameter the server refuses. The body is read by the caller, through the capped
        transport, and parsed here rather than by the SDK."""
        endpoint = client.chat.completions if call.request.is_chat else client.completions
        while True:
            params = self._params(call, stream=stream)
            remaining = call.remaining()
            try:
                async with asyncio.timeout(remaining):
                    # Entered by hand: the response outlives this call (a stream is read by the
                    # caller's loop), and the caller closes it, which is all the exit would do.
                    return await endpoint.with_streaming_response.create(**params, timeout=remaining).__aenter__()
            except openai.APIStatusError as exc:
                refused = _refused_param(exc, params)
                if refused is None:
                    raise
                log.info("tier %s: the upstream refuses %s; no longer sent", self.name, refused)
                self._refused.add(refused)

    async def _next_piece(self, events: SSEReader, acc: _Accumulator, call: _Call) -> str | None:
        """The next non-empty piece of text, or None when the stream has ended."""
        while True:
            async with asyncio.timeout(call.remaining()):
                data = await events.next()
            if data is None:
                return None
            piece = acc.add(event_object(data), call)
            if piece:
                return piece

    def _params(self, call: _Call, *, stream: bool) -> dict[str, Any]:
        request = call.request
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": call.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
        }
        if request.seed is not None:
            params["seed"] = request.seed
        if request.n > 1 and not stream:  # the cascade asks for n > 1 only through generate
            params["n"] = request.n
        if request.stop:
            params["stop"] = list(request.stop)
        if request.messages is not None:
            params["messages"] = [_upstream_message(m) for m in request.messages]
            params.update(_tool_params(request))
        else:
            params["prompt"] = request.prompt
        # passed through as the client sent them: the upstream enforces them (or refuses, which the
        # client then hears) rather than this tier answering without them
        if request.logit_bias:
            params["logit_bias"] = {str(token): bias for token, bias in request.logit_bias}
        if request.presence_penalty:
            params["presence_penalty"] = request.presence_penalty
        if request.frequency_penalty:
            params["frequency_penalty"] = request.frequency_penalty
        if request.response_format is not None:
            if request.is_chat:
                params["response_format"] = request.response_format.to_openai()
            else:  # not the SDK's completions parameter, but vLLM's and llama.cpp's servers take it
                params["extra_body"] = {"response_format": request.response_format.to_openai()}
        if "logprobs" not in self._refused:
            if request.is_chat:
                # top_logprobs=0 is OpenAI's "none of the alternatives"; llama-cpp-python's server
                # returns no logprobs at all without it.
                params["logprobs"] = True
                params["top_logprobs"] = request.top_logprobs
            else:
                params["logprobs"] = max(1, request.top_logprobs)
        if stream:
            params["stream"] = True
            if "stream_options" not in self._refused:
                params["stream_options"] = {"include_usage": True}
        return params

    def _read_response(self, body: dict[str, Any], call: _Call, index: int = 0) -> Generation:
        choice = first_choice(body.get("choices"), required=True, index=index)
        assert choice is not None
        if call.request.is_chat:
            message = typed_field(choice, "message", dict)
            text = typed_field(message or {}, "content", str) or ""
            calls = _tool_calls(message or {}) if call.request.offers_tools else None
        else:
            calls = None
            text = typed_field(choice, "text", str) or ""
        finish = typed_field(choice, "finish_reason", str)
        logprobs = None
        tops = None
        if "logprobs" not in self._refused:
            logprobs = token_logprobs(choice.get("logprobs"))
            if call.request.top_logprobs:
                tops = top_logprobs(choice.get("logprobs"), call.request.top_logprobs, call.completion_limit)
        # usage covers every choice: choice 0 carries it (merged below), the others count their own
        prompt_tokens, completion_tokens = (0, None) if index else _checked_usage(body.get("usage"), call, self.name)
        if prompt_tokens is None:
            prompt_tokens = _estimate_tokens(_prompt_text(call.request))
        if completion_tokens is None:
            counted = len(logprobs) if logprobs is not None else _estimate_tokens(text)
            completion_tokens = min(counted, call.max_tokens)
        generation = Generation(
            text=clean_text(text),
            finish_reason=_finish(finish),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            token_logprobs=logprobs,
            latency_s=time.monotonic() - call.started,
            model=model_name(body.get("model")) or self.model,
            top_logprobs=tops,
            tool_calls=calls,
            constrained=None if call.request.response_format is not None else False,
        )
        if index > 0 or call.request.n == 1:
            return generation
        others = tuple(self._read_response(body, call, i) for i in range(1, call.request.n))
        if completion_tokens is None:
            completion_tokens = generation.completion_tokens + sum(g.completion_tokens for g in others)
        return replace(generation, completion_tokens=completion_tokens, others=others)

    # -- failures --------------------------------------------------------------------------------

    def _new_call(self, request: GenerationRequest) -> _Call:
        now = time.monotonic()
        deadline = now + self.timeout_s
        if request.deadline is not None:
            deadline = min(deadline, request.deadline)
        max_tokens = request.max_tokens
        if self.max_tokens is not None:
            max_tokens = min(max_tokens, self.max_tokens)
        return _Call(request=request, deadline=deadline, started=now, max_tokens=max_tokens)

    def _settle(self, permit: Permit, exc: BaseException, call: _Call) -> BaseException:
        """Report an attempt's failure to the breaker and the log; return what it should raise."""
        verdict = self._classify(exc)
        if verdict is None:  # cancelled, or not the upstream's doing
            permit.release()
            return exc
        if verdict.healthy:
            permit.success()
        else:
            permit.failure()
        log.warning("tier %s: upstream attempt %d failed: %s", self.name, call.attempts, verdict.detail)
        return verdict.error()  # built after the breaker heard of it: its cool-down is current

    def _classify(self, exc: BaseException) -> _Verdict | None:
        """What an attempt's exception means: what to raise, whether the upstream looked healthy,
        and the full story for the log."""
        unacceptable = _cause(exc, Unacceptable)
        if unacceptable is not None:
            return _Verdict(
                lambda: UpstreamError(
                    f"tier {self.name}: the upstream's answer was refused: {unacceptable}",
                    retry_after=self._client_retry_after(None),
                ),
                healthy=False,
                detail=str(unacceptable),
            )
        if isinstance(exc, openai.APIStatusError):
            return self._classify_status(exc)
        if isinstance(exc, (openai.APITimeoutError, TimeoutError, httpx2.TimeoutException)):
            return _Verdict(lambda: _Retryable("timed out", timed_out=True), healthy=False, detail="timed out")
        if isinstance(exc, (openai.APIConnectionError, httpx2.TransportError)):
            cause = exc.__cause__ or exc
            detail = f"connection failed: {type(cause).__name__}: {cause}"
            summary = f"connection failed ({type(cause).__name__})"
            return _Verdict(lambda: _Retryable(summary, detail), healthy=False, detail=detail)
        if isinstance(exc, Malformed):
            detail = f"malformed response: {exc}"
            return _Verdict(lambda: _Retryable("malformed response", detail), healthy=False, detail=detail)
        if isinstance(exc, ErrorEvent):
            detail = f"error event in the stream: {exc}"
            return _Verdict(lambda: _Retryable("an error event in the stream", detail), healthy=False, detail=detail)
        return None

    def _classify_status(self, exc: openai.APIStatusError) -> _Verdict:
        status = exc.status_code
        text = _error_text(exc)
        detail = f"HTTP {status}: {text}"
        hint = parse_retry_after(exc.response.headers, limit=self.timeout_s)
        if status in _RETRYABLE_STATUS or status >= 500:
            return _Verdict(
                lambda: _Retryable(f"HTTP {status}", detail, retry_after=hint), healthy=False, detail=detail
            )
        if status in _REQUEST_STATUS:
            if _is_context_length(exc, text):
                return _Verdict(
                    lambda: ContextLengthError(
                        f"tier {self.name}: the prompt and max_tokens do not fit the upstream model's "
                        f"context (HTTP {status})"
                    ),
                    healthy=True,
                    detail=detail,
                )
            return _Verdict(
                lambda: RequestError(
                    f"tier {self.name}: the upstream rejected the request (HTTP {status})",
                    param=_identifier(exc.param),
                    code=_identifier(exc.code),
                ),
                healthy=True,
                detail=detail,
            )
        return _Verdict(
            lambda: UpstreamError(
                f"tier {self.name}: the upstream answered HTTP {status}",
                retry_after=self._client_retry_after(hint),
            ),
            healthy=True,
            detail=detail,
        )

    def _give_up(self, exc: _Retryable, call: _Call) -> UnavailableError:
        attempts = f"{call.attempts} attempt{'s' if call.attempts != 1 else ''}"
        if exc.timed_out or call.remaining() <= 0:
            return DeadlineError(
                f"tier {self.name}: deadline passed after {attempts}; last: {exc.summary}",
                retry_after=_DEADLINE_RETRY_AFTER_S,
            )
        if exc.retry_after is not None and exc.retry_after >= call.remaining():
            why = "the upstream asks to wait past the deadline"
        else:
            why = f"gave up after {attempts}"
        return UpstreamError(
            f"tier {self.name}: {why}; last: {exc.summary}",
            retry_after=self._client_retry_after(exc.retry_after),
        )

    def _stream_cut(self, permit: Permit, exc: Exception, call: _Call, acc: _Accumulator) -> BaseException:
        mapped = self._settle(permit, exc, call)
        if isinstance(mapped, UnavailableError):  # refused whole, e.g. over the size limits
            self._failed_total += 1
            return mapped
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
            f"tier {self.name}: the upstream stream broke {where}: {mapped.summary}",
            retry_after=self._client_retry_after(mapped.retry_after),
        )

    def _client_retry_after(self, upstream: float | None) -> float:
        """The one Retry-After rule for a client whose request this tier failed (module docstring)."""
        breaker = self.breaker.retry_after()
        if upstream is None and breaker <= 0:
            return float(self.retry_after_s)
        return max(1.0, upstream or 0.0, breaker)


@dataclass
class _Verdict:
    error: Callable[[], BaseException]
    healthy: bool
    detail: str


@dataclass
class _OpenStream:
    response: Any
    events: SSEReader
    acc: _Accumulator
    permit: Permit
    first: str | None


@dataclass
class _Accumulator:
    """Folds stream chunks into the final answer."""

    chat: bool
    logprobs: bool
    tier: str
    top_k: int = 0  # top-k alternatives asked for; 0: none read
    parts: list[str] = field(default_factory=list)
    token_logprobs: list[float] | None = field(default_factory=list)
    tops: list[TokenLogprob] | None = field(default_factory=list)
    unsent_tops: int = 0  # index of the first token not yet handed out with a piece
    finish_reason: str | None = None
    chunks: int = 0  # completion chunks seen, with or without text
    usage: tuple[int | None, int | None] = (None, None)
    model: str | None = None
    prompt_estimate: int | None = None  # when the server reports no usage
    calls: dict[int, _StreamedCall] | None = None  # streamed tool calls by index; None: not read
    call_fragments: int = 0

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, chunk: dict[str, Any], call: _Call) -> str:
        if "usage" in chunk and chunk["usage"] is not None:
            self.usage = _checked_usage(chunk["usage"], call, self.tier)
        model = model_name(chunk.get("model"))
        if model:
            self.model = model
        choice = first_choice(chunk.get("choices"), required=False)
        if choice is None:
            return ""
        self.chunks += 1
        if self.chat:
            delta = typed_field(choice, "delta", dict) or {}
            piece = typed_field(delta, "content", str) or ""
            if self.calls is not None:
                self._add_calls(delta, call)
        else:
            piece = typed_field(choice, "text", str) or ""
        finish = typed_field(choice, "finish_reason", str)
        if piece and self.token_logprobs is not None:
            lps = token_logprobs(choice.get("logprobs")) if self.logprobs else None
            if lps is None:
                self.token_logprobs = None  # one piece without them makes the set unusable
            else:
                self.token_logprobs.extend(lps)
        if piece and self.top_k and self.tops is not None:
            tops = top_logprobs(choice.get("logprobs"), self.top_k, call.completion_limit - len(self.tops))
            if tops is None:
                self.tops = None  # as for the logprobs: a gap would misplace every later token
            else:
                self.tops.extend(tops)
        if finish:
            self.finish_reason = finish
        piece = clean_text(piece)
        if piece:
            self.parts.append(piece)
            if len(self.parts) > call.piece_limit:
                raise Unacceptable(
                    f"a stream of more than {call.piece_limit} pieces of text for max_tokens={call.max_tokens}"
                )
        return piece

    def _add_calls(self, delta: dict[str, Any], call: _Call) -> None:
        """Fragments of tool calls, as OpenAI streams them: by index, the id and name first, the
        arguments in pieces. Each fragment counts as a piece against the stream's bound."""
        assert self.calls is not None
        for raw in typed_field(delta, "tool_calls", list) or ():
            if not isinstance(raw, dict):
                raise Malformed(f"a streamed tool call is {type(raw).__name__}, not an object")
            index = raw.get("index", 0)
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_CALLS:
                raise Malformed(f"a streamed tool call's index is {str(index)[:32]!r}")
            function = typed_field(raw, "function", dict) or {}
            entry = self.calls.setdefault(index, _StreamedCall())
            entry.id = entry.id or typed_field(raw, "id", str)
            # OpenAI sends the name once; llama-cpp-python's server repeats it in every fragment
            entry.name = entry.name or typed_field(function, "name", str) or ""
            arguments = function.get("arguments")
            entry.arguments += arguments if isinstance(arguments, str) else _arguments_text(arguments)
            self.call_fragments += 1
            if self.call_fragments > call.piece_limit:
                raise Unacceptable(
                    f"a stream of more than {call.piece_limit} tool-call fragments for max_tokens={call.max_tokens}"
                )

    def tool_calls(self) -> tuple[ToolCall, ...] | None:
        if self.calls is None:
            return None
        ordered = [self.calls[i] for i in sorted(self.calls)]
        return tuple(_tool_call(c.id, c.name, c.arguments) for c in ordered)

    def take_tops(self) -> tuple[TokenLogprob, ...] | None:
        """The tokens that arrived since the last piece handed out (None when none are kept)."""
        if not self.top_k or self.tops is None:
            return None
        taken = tuple(self.tops[self.unsent_tops :])
        self.unsent_tops = len(self.tops)
        return taken

    def complete(self, done: bool) -> bool:
        """Whether the upstream said the answer is whole: a finish_reason, or [DONE] after a chunk."""
        return self.finish_reason is not None or (done and self.chunks > 0)

    def prompt_count(self, call: _Call) -> int:
        """The prompt tokens the server reported, else an estimate (made once per call)."""
        if self.usage[0] is not None:
            return self.usage[0]
        if self.prompt_estimate is None:
            self.prompt_estimate = _estimate_tokens(_prompt_text(call.request))
        return self.prompt_estimate

    def completion_count(self, call: _Call) -> int:
        """Servers send about one token per chunk; logprobs, when present, count exactly. Never
        more than was asked for."""
        if self.usage[1] is not None:
            return self.usage[1]
        counted = len(self.token_logprobs) if self.token_logprobs else len(self.parts)
        return min(counted, call.max_tokens)

    def so_far(self, call: _Call) -> tuple[int, int]:
        """(prompt, completion) tokens spent so far, counted as `generation` counts them (a
        stream cut short is priced from these)."""
        return self.prompt_count(call), self.completion_count(call)

    def generation(self, call: _Call, default_model: str, *, ttft_s: float | None) -> Generation:
        text = self.text
        logprobs = tuple(self.token_logprobs) if self.token_logprobs is not None and text else None
        tops = tuple(self.tops) if self.top_k and self.tops is not None and text else None
        completion_tokens = self.completion_count(call)
        reason = self.finish_reason
        if reason is None:  # [DONE] without a finish_reason: see the module docstring
            reason = "length" if completion_tokens >= call.max_tokens else "stop"
        return Generation(
            text=text,
            finish_reason=_finish(reason),
            prompt_tokens=self.prompt_count(call),
            completion_tokens=completion_tokens,
            token_logprobs=logprobs,
            latency_s=time.monotonic() - call.started,
            ttft_s=ttft_s,
            model=self.model or default_model,
            top_logprobs=tops,
            tool_calls=self.tool_calls(),
            constrained=None if call.request.response_format is not None else False,
        )


# -- transport and stream framing ----------------------------------------------------------------


# -- response reading ----------------------------------------------------------------------------


def _checked_usage(usage: Any, call: _Call, tier: str) -> tuple[int | None, int | None]:
    """The server's (prompt, completion) token counts, each None where it sent none; both None,
    with a warning, when either is impossible for this request (module docstring)."""
    if usage is None:
        return None, None
    if not isinstance(usage, dict):
        log.warning("tier %s: upstream usage refused (not an object: %.200r); estimating", tier, usage)
        return None, None
    counts = []
    for name, limit in (("prompt_tokens", call.prompt_limit), ("completion_tokens", call.completion_limit)):
        value = usage.get(name)
        count = token_count(value)
        if value is not None and (count is None or count > limit):
            log.warning(
                "tier %s: upstream usage refused (%s=%.100r, at most %d possible); estimating",
                tier,
                name,
                value,
                limit,
            )
            return None, None
        counts.append(count)
    return counts[0], counts[1]


def top_logprobs(logprobs: Any, k: int, max_tokens: int) -> tuple[TokenLogprob, ...] | None:
    """Each token's piece, logprob and at most k alternatives, from a chat (`content`) or legacy
    completions (`tokens`, `token_logprobs`, `top_logprobs`) shape, clamped as the module
    docstring says; None when the shape is wrong or there are more than `max_tokens` tokens."""
    if not isinstance(logprobs, dict):
        return None
    rows: list[tuple[Any, Any, Any]] = []
    content = logprobs.get("content")
    if isinstance(content, list):
        for item in content:
            if not isinstance(item, dict):
                return None
            rows.append((item.get("token"), item.get("logprob"), item.get("top_logprobs")))
    else:
        tokens, values, tops = logprobs.get("tokens"), logprobs.get("token_logprobs"), logprobs.get("top_logprobs")
        if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
            return None
        if not isinstance(tops, list) or len(tops) != len(tokens):
            return None
        rows = list(zip(tokens, values, tops, strict=True))
    if len(rows) > max_tokens:
        return None
    out: list[TokenLogprob] = []
    for token, value, alternatives in rows:
        logprob = _logprob(value)
        if not isinstance(token, str) or logprob is None:
            return None
        out.append(TokenLogprob(_piece(token), logprob, _alternatives(alternatives, k)))
    return tuple(out)


def _alternatives(raw: Any, k: int) -> tuple[tuple[str, float], ...]:
    """At most k (piece, logprob) pairs, likeliest first, from a chat list of objects or a
    completions object mapping piece to logprob; what is not a well-formed pair is left out."""
    pairs: list[tuple[str, float]] = []
    if isinstance(raw, dict):
        items: list[tuple[Any, Any]] = list(raw.items())[: 4 * k]  # bound the work on a huge object
    elif isinstance(raw, list):
        items = [(a.get("token"), a.get("logprob")) for a in raw[: 4 * k] if isinstance(a, dict)]
    else:
        return ()
    for token, value in items:
        logprob = _logprob(value)
        if isinstance(token, str) and logprob is not None:
            pairs.append((_piece(token), logprob))
    pairs.sort(key=lambda pair: -pair[1])
    return tuple(pairs[:k])


def _logprob(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    if not math.isfinite(number) or number > 1e-6:  # a probability above 1 is not one
        return None
    return min(number, 0.0)


def _piece(token: str) -> str:
    return clean_text(token[:MAX_PIECE_CHARS])


def _finish(reason: str | None) -> FinishReason:
    return "length" if reason == "length" else "stop"


def _prompt_limit(request: GenerationRequest) -> int:
    # a token per byte of everything sent (tools, schemas, calls: router.reservation), and room for
    # a hosted API's own system prompt; admission reserves this same bound
    return prompt_token_bound(request, per_message=_TEMPLATE_TOKENS_PER_MESSAGE, fixed=_TEMPLATE_TOKENS)


def _prompt_text(request: GenerationRequest) -> str:
    if request.prompt is not None:
        return request.prompt
    # what the prompt holds: the messages, their calls, and the tools the template renders
    parts = [m.content for m in request.messages or ()]
    parts += [c.arguments for m in request.messages or () for c in m.tool_calls]
    parts += [f"{t.name} {t.description or ''} {t.parameters_json or ''}" for t in request.tools]
    return "\n".join(parts)


# -- tool calls ----------------------------------------------------------------------------------

# An upstream's call names and ids reach the client and the ledger: cut to a sane length.
_MAX_CALL_NAME_CHARS = 256
_MAX_CALL_ID_CHARS = 256


@dataclass
class _StreamedCall:
    id: str | None = None
    name: str = ""
    arguments: str = ""


def _upstream_message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["content"] = m.content or None  # as OpenAI's own: an answer of calls alone has no content
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _tool_params(request: GenerationRequest) -> dict[str, Any]:
    """tools, tool_choice and parallel_tool_calls as the client gave them (passed through)."""
    if not request.tools:
        return {}
    params: dict[str, Any] = {"tools": [t.to_openai() for t in request.tools]}
    choice = request.tool_choice
    if isinstance(choice, NamedTool):
        params["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        params["tool_choice"] = choice
    if not request.parallel_tool_calls:
        params["parallel_tool_calls"] = False
    return params


def _tool_calls(message: dict[str, Any]) -> tuple[ToolCall, ...] | None:
    """A response message's `tool_calls`, read as any upstream field is (see the module
    docstring): a wrong type makes the answer malformed; names and ids are cut to a sane length
    and at most `MAX_CALLS` calls are kept. None when there are none."""
    raw = typed_field(message, "tool_calls", list)
    if not raw:
        return None
    calls = []
    for item in raw[:MAX_CALLS]:
        if not isinstance(item, dict):
            raise Malformed(f"a tool call is {type(item).__name__}, not an object")
        function = typed_field(item, "function", dict)
        if function is None:
            raise Malformed("a tool call has no function")
        name = typed_field(function, "name", str)
        if not name:
            raise Malformed("a tool call has no function name")
        arguments = function.get("arguments")
        text = arguments if isinstance(arguments, str) else _arguments_text(arguments)
        calls.append(_tool_call(typed_field(item, "id", str), name, text))
    return tuple(calls)


def _arguments_text(arguments: Any) -> str:
    # some servers send arguments as an object rather than its JSON text; anything else is wrong
    if arguments is None:
        return ""
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    raise Malformed(f"a tool call's arguments are {type(arguments).__name__}, not a string")


def _tool_call(call_id: str | None, name: str, arguments: str) -> ToolCall:
    if call_id is None or not 0 < len(call_id) <= _MAX_CALL_ID_CHARS or not call_id.isprintable():
        call_id = new_call_id()  # the client echoes it back: ours rather than a malformed one
    return ToolCall(
        call_id,
        clean_text(name[:_MAX_CALL_NAME_CHARS]),
        clean_text(arguments),
    )


def _estimate_tokens(text: str) -> int:
    # Only when the server reports no usage: about four characters a token in English.
    return max(1, round(len(text) / 4)) if text else 0


# -- upstream error reading ----------------------------------------------------------------------


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


def _identifier(value: Any) -> str | None:
    return value if isinstance(value, str) and _IDENTIFIER.match(value) else None


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


async def _json_body(response: Any, call: _Call) -> dict[str, Any]:
    """The whole body of a response (through the capped transport, within the call's deadline),
    closed after, as one JSON object. A JSON body is UTF-8 (RFC 8259); what is not becomes U+FFFD
    rather than a failure."""
    try:
        async with asyncio.timeout(call.remaining()):
            body = await response.read()
    finally:
        await _close_quietly(response)
    return json_object(body.decode("utf-8", "replace"))


async def _close_quietly(response: Any) -> None:
    # Closing a broken stream may fail again; the first error is the one to keep.
    with contextlib.suppress(Exception):
        await response.close()
