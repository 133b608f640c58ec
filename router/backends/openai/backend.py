"""The `openai` backend's request flow: one logical request, its attempts, the breaker, the stream.

One logical request gives one `Generation` or one exception, never both and never two:

- The SDK's own retries are off. What is the upstream's passing trouble
  (`router.backends.openai.failures` says which: connection errors, timeouts, HTTP
  408/409/429/5xx, and a 200 whose body is not a well-formed completion) is tried again by
  `router.backends.openai.failover`: at once on another deployment of the tier when it has several
  (`router.backends.openai.deployments`), else after a backoff with jitter that honours
  `Retry-After` (`router.backends.openai.retry.RetryPolicy`), never past the deadline:
  `request.deadline` or now + the tier's `timeout_s`, whichever is sooner. Each attempt may use
  only the time that remains.
- `generate` makes one non-streaming call per attempt: cheaper, and retryable as a whole.
- `stream` retries only until the first piece of text has been yielded. After that a failure
  raises, because retrying would repeat text the caller already has, and returning what arrived as
  if it were complete would pass off a truncated answer.
- Each attempt passes through its deployment's `CircuitBreaker` (see `router.backends.openai.breaker`):
  every failed attempt counts as a failure; a deliberate answer, including a 4xx rejecting our
  request, counts as the upstream being alive, and so does an answer too large for the tier that
  the request asked for (`router.backends.openai.answer_size`: the request's 400, charged), and a
  5xx or an error event while the deployment answers a one-token request of the tier's own
  (`router.backends.openai.outages`: the request's 502, not retried, charged).
- The answer says which deployment gave it (`Generation.deployment`, and `Delta.deployment` on
  each piece of a stream), for the `tierroute` object, the ledger and /metrics.

When a server refuses `logprobs` or `stream_options` with a 400 naming them, the call is
repeated once without that parameter; the deployment stops sending it only when a probe of the
tier's own is refused with it (`router.backends.openai.refusals`: a client steers the words).

`score_continuation` (for the `cross_tier` verifier) makes one non-streaming call per attempt
under the same retries, breaker, deadline and size caps, in the way `tiers[].openai.prompt_logprobs`
names; the answer is read, and clamped, by `router.backends.openai.prompt_scoring`.

The rest is in the package's other modules: `client` (the SDK client over the capped transport),
`call` (one request's deadline, bounds and body), `reading` and `streams` (what an answer says,
checked and clamped), `failures` (what a failed attempt means and what the client hears).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import httpx2
import openai

from router.backends.base import Backend, ContinuationScore, ScoringUnsupportedError
from router.backends.openai import failover, unanswered
from router.backends.openai.answer_size import estimate, refusal
from router.backends.openai.breaker import CircuitBreaker, Permit
from router.backends.openai.call import (
    Call,
    completion_limit,
    prompt_limit,
    request_params,
)
from router.backends.openai.client import close_quietly, json_body, post
from router.backends.openai.deployments import Deployment, Pool
from router.backends.openai.failures import DEADLINE_RETRY_AFTER_S, Failures, Retryable, refused_param
from router.backends.openai.outages import judged
from router.backends.openai.prompt_scoring import ScoredTokens, read_echo, read_vllm, render_chat
from router.backends.openai.reading import checked_usage, read_response
from router.backends.openai.refusals import PROBE_TIMEOUT_S
from router.backends.openai.retry import RetryPolicy
from router.backends.openai.streams import Accumulator, next_piece
from router.backends.openai.upstream_io import Cut, FewerChoices, Malformed, SSEReader, first_choice, token_count
from router.errors import (
    ConfigError,
    DeadlineError,
    RequestError,
    ResidencyError,
    UnavailableError,
)
from router.generation import Delta, Generation, GenerationRequest
from router.telemetry import spans
from router.telemetry.attempts import upstream_done, upstream_span

if TYPE_CHECKING:
    from router.config import OpenAIBackendSettings, Settings, TierSettings

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# After a stream's deadline, how long its slot and connection wait for a reader that has stopped.
_HELD_GRACE_S = 1.0
# A timeout this close to the deadline is the deadline's (timers fire at it or a little after).
_DEADLINE_SLACK_S = 0.01


@dataclass
class _OpenStream:
    """A stream opened and read up to its first piece of text: what `stream` goes on reading."""

    response: Any
    events: SSEReader
    acc: Accumulator
    permit: Permit
    first: str | None
    deployment: Deployment
    let_go: bool = False  # its slot and connection were given up (the stream ended, or its deadline passed)


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
        local: bool = False,
    ) -> None:
        super().__init__(name)
        self.config = config
        self.local = local  # the tier's `local`: False refuses every request that must stay here
        self.model = config.model
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self.retry_after_s = retry_after_s
        self.policy = RetryPolicy(
            max_attempts=config.max_attempts,
            backoff_initial_s=config.backoff_initial_s,
            backoff_max_s=max(config.backoff_max_s, config.backoff_initial_s),
        )
        self.pool = Pool(name, config, timeout_s=timeout_s, retry_after_s=retry_after_s, breaker=breaker)
        self._started = False
        self._closed = False
        self._attempts_total = 0
        self._retries_total = 0
        self._failed_total = 0
        self._usage_raised_total = 0  # usage counts raised to their floor (`reading`)
        self._closing: set[asyncio.Future[None]] = set()  # upstream streams being closed at their deadline
        self._judging: set[asyncio.Future[None]] = set()  # deadline cuts waiting for a probe's verdict

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
            local=tier.is_local,
        )

    def prompt_token_limit(self, request: GenerationRequest) -> int:
        """The usage this backend accepts from its server (`call` module docstring, Usage)."""
        return prompt_limit(request, self.config.hosted_prompt_tokens)

    def completion_token_limit(self, request: GenerationRequest) -> int:
        return completion_limit(request, self.max_tokens)

    def refuse_oversized(self, request: GenerationRequest, *, stream: bool) -> None:
        """The 400 for a request whose answer, as the client asks for it, cannot fit under
        max_response_bytes (`router.backends.openai.answer_size`)."""
        max_tokens = request.max_tokens if self.max_tokens is None else min(request.max_tokens, self.max_tokens)
        limit = self.config.max_response_bytes
        refused = refusal(request, max_tokens=max_tokens, limit=limit, stream=stream, tier=self.name)
        if refused is not None:
            raise refused

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._closed:
            raise UnavailableError(f"tier {self.name}: backend is closed")
        self.pool.start()
        self._started = True

    async def close(self) -> None:
        self._closed = True
        for judging in list(self._judging):
            judging.cancel()
        await asyncio.gather(*self._judging, return_exceptions=True)
        await self.pool.close()

    @property
    def breaker(self) -> CircuitBreaker:
        """The first deployment's breaker: the tier's own when it has one `base_url`."""
        return self.pool.deployments[0].breaker

    @property
    def failures(self) -> Failures:
        return self.pool.deployments[0].failures

    @property
    def gives_logprobs(self) -> bool:
        """Whether answers carry the sampled tokens' logprobs (off by config, or refused upstream)."""
        return all("logprobs" not in d.refused for d in self.pool.deployments)

    @property
    def ready(self) -> bool:
        # An open breaker does not make the tier unready: every replica shares the upstream, so
        # taking this one out of a load balancer would help nobody. The breaker shows in stats().
        return self._started and not self._closed

    def stats(self) -> dict[str, float]:
        # the tier's breaker gauges: its one deployment's, or with several, open only when all are
        breakers = [d.breaker.stats() for d in self.pool.deployments]
        tier = {
            key: (min if key in ("breaker_open", "breaker_half_open", "consecutive_failures") else sum)(
                b[key] for b in breakers
            )
            for key in breakers[0]
        }
        return {
            **tier,
            "upstream_attempts_total": float(self._attempts_total),
            "upstream_retries_total": float(self._retries_total),
            "upstream_failed_requests_total": float(self._failed_total),
            "usage_raised_total": float(self._usage_raised_total),
        }

    def deployment_stats(self) -> dict[str, dict[str, float]]:
        return self.pool.stats()

    def _ensure_client(self, deployment: Deployment) -> openai.AsyncOpenAI:
        if self._closed:
            raise UnavailableError(f"tier {self.name}: backend is closed")
        return deployment.ensure_client()

    # -- the two ways to generate ------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> Generation:
        call = self._new_call(request)
        with self._traced(call):
            return await self._with_retries(call, self._attempt_generate)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        call = self._new_call(request)
        call.streamed = True
        with self._traced(call):
            opened = await self._with_retries(call, self._attempt_open_stream)
            events, acc, permit, where = opened.events, opened.acc, opened.permit, opened.deployment
            ttft: float | None = None
            held = self._hold_until_deadline(call, opened)
            try:
                piece = opened.first
                while piece is not None:
                    if ttft is None:
                        ttft = time.monotonic() - call.started
                    yield Delta(
                        piece,
                        *acc.so_far(call),
                        top_logprobs=acc.take_tops(),
                        deployment=where.name,
                        deployment_shown=where.shown,
                    )
                    try:
                        piece = await next_piece(events, acc, call)
                    except Exception as exc:
                        mapped = await self._stream_cut(permit, exc, call, acc, where)
                        if mapped is exc:
                            raise
                        raise mapped from exc
                if not acc.complete():
                    # cut: a probe says whose doing (`outages`), as for any failure mid-stream
                    done = "[DONE]" if events.done else "the end of the stream"
                    cut = Cut(f"{done} without a finish_reason after {len(acc.text)} characters")
                    mapped = await self._stream_cut(permit, cut, call, acc, where)
                    raise mapped from cut
                permit.success()
                where.answered()
            finally:
                held.cancel()
                if not opened.let_go:
                    opened.let_go = True
                    permit.release()  # no-op when an outcome was reported; covers an abandoned stream
                    where.outstanding -= 1
                await close_quietly(opened.response)
        final = acc.generation(call, where.model, ttft_s=ttft)  # its usage held to its floors here
        self._usage_raised_total += call.usage_raised
        yield dataclasses.replace(final, deployment=where.name, deployment_shown=where.shown)

    def _hold_until_deadline(self, call: Call, opened: _OpenStream) -> asyncio.TimerHandle:
        """Let go of a stream's deployment slot and upstream connection once its deadline (and a
        grace) has passed, whatever the caller is doing. A client that stops reading leaves the
        stream suspended at a `yield`, where no timeout runs: without this the slot
        (`max_concurrent`) and the connection were held as long as that client liked, and two
        such clients refused every other request to a tier of two deployments of
        `max_concurrent = 1`. When it reads again, the stream ends with DeadlineError."""

        def let_go() -> None:
            if opened.let_go:
                return
            opened.let_go = True
            opened.permit.release()  # the client was slow, not the upstream
            opened.deployment.outstanding -= 1
            closing = asyncio.ensure_future(close_quietly(opened.response))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

        delay = max(0.0, call.deadline - time.monotonic()) + _HELD_GRACE_S
        return asyncio.get_running_loop().call_later(delay, let_go)

    @contextlib.contextmanager
    def _traced(self, call: Call) -> Iterator[None]:
        """The upstream call's span (`router.telemetry.attempts`), under the tier attempt's, its
        `traceparent` sent with every attempt; it ends with the attempts made and the breaker's
        state. A no-op while tracing is off."""
        if not spans.active():
            yield
            return
        only = self.pool.deployments[0].settings.base_url if len(self.pool.deployments) == 1 else None
        url = urlsplit(only) if only is not None else None
        host, port = (url.hostname, url.port) if url is not None else (None, None)
        span = upstream_span(call.request.trace, self.name, host, port, self._breaker_states())
        parent = spans.traceparent(span)
        if parent is not None:
            call.headers = {"traceparent": parent}
        try:
            yield
        except BaseException as exc:
            spans.fail(span, exc)
            raise
        finally:
            upstream_done(span, call.attempts, self._breaker_states())

    def _breaker_states(self) -> str:
        """The breaker's state; with several deployments, each one's as `name=state,...`."""
        found = self.pool.deployments
        if len(found) == 1:
            return found[0].breaker.state
        return ",".join(f"{d.name}={d.breaker.state}" for d in found)

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
        with self._traced(call):
            scored, prompt_tokens = await self._with_retries(call, attempt)
        return ContinuationScore(
            token_logprobs=scored.logprobs,
            top1=scored.top1,
            prompt_tokens=max(prompt_tokens, len(scored.logprobs)),
            continuation_tokens=len(scored.logprobs),
            seconds=time.monotonic() - call.started,
        )

    async def _attempt_score(
        self, call: Call, where: Deployment, *, continuation: str, prompt: str | None
    ) -> tuple[ScoredTokens, int]:
        client = self._ensure_client(where)
        permit = self._begin_attempt(call, where)
        request = call.request
        endpoint: Any
        params: dict[str, Any] = {"model": where.model, "max_tokens": 1, "temperature": 0.0}
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
                    **params, timeout=call.remaining(), extra_headers=call.headers
                ).__aenter__()
            data = await json_body(response, call)
            choice = first_choice(data.get("choices"), required=True)
            assert choice is not None
            if self.config.prompt_logprobs == "echo":
                assert prompt is not None
                scored = read_echo(choice, prompt + continuation, continuation)
            else:
                found = data if request.messages is not None else choice
                scored = read_vllm(found.get("prompt_logprobs"), call.prompt_limit, continuation)
            # the usage, when sane, counts the continuation too; else the tokens the server read
            limit = call.prompt_limit + len(continuation.encode("utf-8", "replace"))
            usage = data.get("usage")
            counted = token_count(usage.get("prompt_tokens")) if isinstance(usage, dict) else None
            prompt_tokens = counted if counted is not None and counted <= limit else min(scored.echoed_tokens, limit)
        except BaseException as exc:
            mapped = await self._settle(permit, exc, call, where)
            if mapped is exc:
                raise
            raise mapped from exc
        finally:
            where.outstanding -= 1
        permit.success()
        where.answered()
        return scored, prompt_tokens

    # -- attempts --------------------------------------------------------------------------------

    async def _with_retries(self, call: Call, attempt_fn: Callable[[Call, Deployment], Awaitable[_T]]) -> _T:
        try:
            return await failover.attempts(
                call, self.pool, self.policy, attempt_fn, attempt_timeout_s=self.config.attempt_timeout_s
            )
        except failover.GaveUp as gave_up:
            self._failed_total += 1
            exc = gave_up.last
            # Chain to what the upstream did, not to the internal marker that carried it here.
            raise gave_up.deployment.failures.give_up(exc, call) from (exc.__cause__ or exc)
        finally:
            self._retries_total += max(0, call.attempts - 1)

    def _begin_attempt(self, call: Call, where: Deployment) -> Permit:
        """Admit one attempt at `where`; the caller takes one off its `outstanding` when it ends."""
        if call.remaining() <= 0:
            # Checked before the breaker: an attempt we never make says nothing about the upstream.
            raise DeadlineError(
                f"tier {self.name}: deadline passed before attempt {call.attempts + 1}",
                retry_after=DEADLINE_RETRY_AFTER_S,
            )
        permit = where.breaker.acquire()
        call.attempts += 1
        self._attempts_total += 1
        where.attempts_total += 1
        where.outstanding += 1
        return permit

    async def _attempt_generate(self, call: Call, where: Deployment) -> Generation:
        client = self._ensure_client(where)
        permit = self._begin_attempt(call, where)
        try:
            response = await self._open(client, call, where, stream=False)
            body = await json_body(response, call)
            try:
                generation = read_response(
                    body, call, tier=self.name, model=where.model, logprobs="logprobs" not in call.unsent(where.refused)
                )
            except Malformed as exc:  # what it generated, if its usage says, for its charge (`unanswered`)
                exc.completion_tokens = checked_usage(body.get("usage"), call, self.name)[1]  # type: ignore[attr-defined]
                raise
        except BaseException as exc:
            mapped = await self._settle(permit, exc, call, where)
            if mapped is exc:
                raise
            raise mapped from exc
        finally:
            where.outstanding -= 1
        permit.success()
        where.answered()
        self._usage_raised_total += call.usage_raised
        return dataclasses.replace(generation, deployment=where.name, deployment_shown=where.shown)

    async def _attempt_open_stream(self, call: Call, where: Deployment) -> _OpenStream:
        """Open the stream and read up to the first piece of text: the part that may be retried
        (here or at another deployment). Once it returns, `stream` owns the attempt's outcome and
        its place in `where.outstanding`."""
        client = self._ensure_client(where)
        permit = self._begin_attempt(call, where)
        response: Any = None
        try:
            response = await self._open(client, call, where, stream=True)
            events = SSEReader(response.http_response.aiter_raw(), max_events=self.config.max_stream_events)
            logprobs = "logprobs" not in call.unsent(where.refused)
            acc = Accumulator(
                chat=call.request.is_chat,
                logprobs=logprobs,
                tier=self.name,
                top_k=call.request.top_logprobs if logprobs else 0,
                calls={} if call.request.offers_tools else None,
            )
            first = await next_piece(events, acc, call)
            if first is None and not acc.complete():
                # llama-cpp-python's answer to a streamed prompt over its context: judged as a cut
                raise Cut("the stream ended before any output or finish_reason")
        except BaseException as exc:
            where.outstanding -= 1
            if response is not None:
                await close_quietly(response)
            mapped = await self._settle(permit, exc, call, where)
            if mapped is exc:
                raise
            raise mapped from exc
        return _OpenStream(response, events, acc, permit, first, where)

    async def _open(self, client: openai.AsyncOpenAI, call: Call, where: Deployment, *, stream: bool) -> Any:
        """Send one call and return the response with its body unread, repeating the call once per
        optional parameter the server seems to refuse: without it for this request, and for every
        request only when the deployment refuses it to a request of the tier's own
        (`router.backends.openai.refusals`). The body is read by the caller, through the capped
        transport, and parsed here rather than by the SDK."""
        path = "chat/completions" if call.request.is_chat else "completions"
        while True:
            params = self._sized_params(call, where, stream=stream)
            # The try's share of the time (`call.remaining()`) bounds the open here and each read
            # before the first piece (`next_piece`, `json_body`). The HTTP client's own timeout,
            # which also bounds every later read of a stream, is the whole deadline: once text
            # has reached the client the stream has all the time left, not the first try's share.
            to_deadline = call.deadline - time.monotonic()
            try:
                async with asyncio.timeout(call.remaining()):
                    # The response outlives this call (a stream is read by the caller's loop),
                    # and the caller closes it.
                    # the SDK's body, headers and errors without its per-call work (`client.post`)
                    return await post(client, path, params, timeout_s=to_deadline, headers=call.headers)
            except openai.APIStatusError as exc:
                refused = refused_param(exc, params)
                if refused is None:
                    raise
                # the words may be the client's doing: they decide for this request alone
                seconds = min(PROBE_TIMEOUT_S, call.remaining())
                chat = call.request.is_chat
                if not await where.refusals.refuses(refused, client, where.model, chat=chat, seconds=seconds):
                    log.info(
                        "tier %s: deployment %s refused a request in words naming %s; that request goes on without it",
                        self.name,
                        where.logged,
                        refused,
                    )
                    call.omitted.add(refused)

    def _sized_params(self, call: Call, where: Deployment, *, stream: bool) -> dict[str, Any]:
        """The body of one attempt, and what an honest answer to it takes (`call.answer_bytes`). The
        tier's own logprobs are left out of a request whose answer they would take over
        max_response_bytes (`router.backends.openai.answer_size`); what the client asked for fits,
        or admission would have refused it."""
        limit = self.config.max_response_bytes
        while True:
            unsent = call.unsent(where.refused)
            logprobs = "logprobs" not in unsent
            size = estimate(
                call.request,
                max_tokens=call.max_tokens,
                logprobs=logprobs,
                top_k=call.request.top_logprobs if logprobs else 0,
                stream=stream,
            )
            if size.typical <= limit or not logprobs:
                call.answer_bytes = size.most
                return request_params(call, model=where.model, refused=unsent, stream=stream)
            log.info(
                "tier %s: logprobs left out of a request whose answer they would take past max_response_bytes (%d)",
                self.name,
                limit,
            )
            call.omitted.add("logprobs")

    # -- failures --------------------------------------------------------------------------------

    def _new_call(self, request: GenerationRequest) -> Call:
        # every way a request leaves for an upstream (generate, stream, score) starts here: one place
        # where a request a guard keeps on the machine cannot pass (router.guards, keep_local)
        if request.local_only and not self.local:
            raise ResidencyError(self.name)
        now = time.monotonic()
        deadline = now + self.timeout_s
        if request.deadline is not None:
            deadline = min(deadline, request.deadline)
        max_tokens = request.max_tokens
        if self.max_tokens is not None:
            max_tokens = min(max_tokens, self.max_tokens)
        return Call(
            request=request,
            deadline=deadline,
            started=now,
            max_tokens=max_tokens,
            hosted_prompt_tokens=self.config.hosted_prompt_tokens,
        )

    async def _settle(
        self, permit: Permit, exc: BaseException, call: Call, where: Deployment, *, chars: int | None = None
    ) -> BaseException:
        """Report an attempt's failure to its deployment's breaker and the log; return what it
        should raise. A `Retry-After` on a retryable failure marks that deployment only. A 5xx or an
        error event is the deployment's only when it fails a request of the tier's own too
        (`router.backends.openai.outages`); `chars`: the text a stream gave before it failed."""
        too_large = None
        if call.answer_bytes > self.config.max_response_bytes:
            too_large = functools.partial(unanswered.too_large, self.name, self.config.max_response_bytes, call, where)
        fewer = None
        if isinstance(exc, FewerChoices):
            fewer = functools.partial(unanswered.fewer_choices, self.name, call, where, exc)
        refused, undecided = None, False
        if judged(exc):
            try:
                answers = await where.outages.answers(
                    where.ensure_client(),
                    where.model,
                    where.refused,
                    chat=call.request.is_chat,
                    stream=call.streamed,
                    seconds=call.deadline - time.monotonic(),
                )
            except BaseException:
                permit.release()
                raise
            undecided = answers is None
            if answers:
                refused = functools.partial(unanswered.refused, self.name, call, where, exc, chars)
        verdict = where.failures.classify(exc, too_large=too_large, refused=refused, fewer=fewer)
        if verdict is None:  # cancelled, or not the upstream's doing
            permit.release()
            return exc
        cut = _deadline_cut(exc, call)
        if undecided:  # no verdict before the deadline: the breaker hears nothing either way
            permit.release()
        elif cut:  # the request's own length, or a hung deployment: a probe says which, later
            where.failed_attempts_total += 1
            self._judge_later(permit, call, where)
        elif verdict.healthy:
            permit.success()
            where.outages.answered()
        else:
            where.failed_attempts_total += 1
            if judged(exc) and where.name in call.outage_counted:
                permit.release()  # its own retry, failed on the verdict already counted (`outages`)
            else:
                permit.failure()
            if judged(exc):
                call.outage_counted.add(where.name)
            else:
                where.outages.failed()
        log.warning(
            "tier %s: upstream attempt %d (deployment %s) failed: %s",
            self.name,
            call.attempts,
            where.logged,
            verdict.detail,
        )
        mapped = verdict.error()  # built after the breaker heard of it: its cool-down is current
        if isinstance(mapped, Retryable) and mapped.retry_after:
            where.mark(mapped.retry_after)
        if cut and chars is None and isinstance(mapped, Retryable):  # after text: what it streamed
            mapped.spent = unanswered.timed_out(call, where, streamed=call.streamed)
        return mapped

    def _judge_later(self, permit: Permit, call: Call, where: Deployment) -> None:
        """Report a deadline cut to the breaker once a probe of the tier's own says what it was: the
        request's own length when the deployment answers (a success), else (a failure, or no answer
        within the tier's `timeout_s`: a deployment that hangs) a failure. The request does not wait:
        it ends as its deadline says. A server that takes one request at a time answers the probe
        after what is left of the cut request (a non-streamed one goes on without its reader)."""

        async def judge() -> None:
            answers: bool | None = None
            try:
                answers = await where.outages.answers(
                    where.ensure_client(),
                    where.model,
                    where.refused,
                    chat=call.request.is_chat,
                    stream=call.streamed,
                    seconds=self.timeout_s,
                )
            except BaseException:
                permit.release()
                raise
            if answers:
                permit.success()
                return
            permit.failure()
            log.warning(
                "tier %s: deployment %s gave no answer to the tier's own request after a request's deadline "
                "passed: counted as its failure",
                self.name,
                where.logged,
            )

        judging = asyncio.ensure_future(judge())
        self._judging.add(judging)
        judging.add_done_callback(self._judging.discard)

    async def _stream_cut(
        self, permit: Permit, exc: Exception, call: Call, acc: Accumulator, where: Deployment
    ) -> BaseException:
        mapped = await self._settle(permit, exc, call, where, chars=len(acc.text))
        if isinstance(mapped, (UnavailableError, Retryable)):  # refused whole, or broken: it failed
            self._failed_total += 1
        return where.failures.mid_stream(mapped, call, len(acc.text))


def _deadline_cut(exc: BaseException, call: Call) -> bool:
    """Whether an attempt timed out at its request's own deadline, not at a share of it that leaves
    time for another deployment (`failover`): a cut the request's own length can make (issue 38's
    review: `max_tokens` 256 with EOS suppressed ran past a tier's 6 s)."""
    timeout = (openai.APITimeoutError, TimeoutError, httpx2.TimeoutException)
    return isinstance(exc, timeout) and time.monotonic() >= call.deadline - _DEADLINE_SLACK_S
