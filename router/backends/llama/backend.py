"""The local tier: llama-cpp-python in-process, behind the async Backend interface.

The engine thread (`llama.engine.LlamaEngine`) owns the context; this class renders the chat
template, tokenizes, submits a job and relays the engine's events on the caller's loop. The event
loop is never blocked: model loading, template rendering and tokenizing run in worker threads,
decoding on the engine thread. A prompt too long to possibly fit the context is refused by its
length in characters before any of that work: a megabyte of text costs the loop nothing.

`score_continuation` reads another tier's answer in one batched prefill (an engine scoring job):
the request rendered exactly as for generation (chat template with the generation prompt), then
the answer tokenized as plain text. An answer that does not fit the context with the prompt is
refused with `ContextLengthError`, not truncated: a score of part of an answer would be read as a
score of all of it.

A request with a `response_format` decodes under the grammar `router.structured.grammars` makes of it (one
grammar state per sequence in the engine, so constrained and free sequences share decode steps);
its answer is marked `constrained`. `logit_bias` and the penalties reshape each sequence's logits
in the engine; a bias on a token id outside this model's vocabulary is a 400, as OpenAI answers.

Speculative decoding (`draft_model`): the engine drafts with a second, smaller model of the same
vocabulary and verifies the drafts in its ordinary decode step; start-up refuses a draft model
whose vocabulary differs. Escalation reuse (`reuse_rejected`): a lower local tier's rejected
answer, tokenized by this model (the two share a vocabulary, or nothing is reused), is the
first draft, its first tokens read in the same pass as the prompt's last ones; if this tier has
just scored that very answer for a `cross_tier` verifier (found by its tokens among the recent
scorings), a greedy answer starts with what that pass found it agrees with, not read again.
Either way the answer is this model's own: under greedy the same tokens as without a draft,
under sampling the same distribution. Each answer reports what was drafted and accepted per
source (`Generation.drafts`: "model", "rejected", and "scored" for the start a scoring verified).
With `spec_cascade` (research mode) the draft model's tokens a deferral rule keeps are not
checked, and the answer is no longer this model's alone (source "cascade").

Prompt KV is reused only within a tenant: every job carries its request's tenant under the tier's
`prefix_cache_scope` (`sharer`), the engine copies KV only between jobs of one, and the recent
scorings are remembered per tenant too (a scoring found ready is an answer scored sooner).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.backends.base import Backend, ContinuationScore
from router.backends.llama.engine import LlamaEngine
from router.backends.llama.jobs import DoneEvent, ErrorEvent, Event, Job, ScoredEvent, TokenEvent
from router.backends.llama.vocab import vocab_mismatch
from router.errors import ContextLengthError, DeadlineError, ModelError, RequestError
from router.generation import Delta, Generation, GenerationRequest
from router.models.catalog import resolve_model
from router.structured.grammars import grammar_source, request_grammar
from router.structured.tools import chat_inputs, template_renders_tools

# No tokenizer we serve averages more characters per token than this, even on runs of spaces or
# repeated punctuation, so a longer prompt cannot fit the context and is refused untokenized.
MAX_CHARS_PER_TOKEN = 32
# scorings remembered per tier (a few answers' worth: the verifiers of one request run together)
SCORE_MEMO = 32

if TYPE_CHECKING:
    from router.config import LlamaCppSettings, Settings, TierSettings


def draft_problem(settings: LlamaCppSettings, cache_dir: Path | None) -> str | None:
    """Why this tier's draft model cannot draft for its model (a vocabulary that differs, a file
    that cannot be read), naming both; None when it can or none is configured. Reads the two
    vocabularies only, not the weights: cheap enough for `config check`."""
    if settings.draft_model is None:
        return None
    try:
        model = resolve_model(
            settings.model, cache_dir, sha256=settings.model_sha256, allow_unpinned=settings.allow_unpinned
        )
        draft = resolve_model(
            settings.draft_model, cache_dir, sha256=settings.draft_model_sha256, allow_unpinned=settings.allow_unpinned
        )
        return vocab_mismatch(model, draft)
    except ModelError as exc:
        return str(exc)


class LlamaCppBackend(Backend):
    def __init__(
        self,
        name: str,
        model_path: Path,
        settings: LlamaCppSettings,
        max_tokens_cap: int,
        draft_model_path: Path | None = None,
    ) -> None:
        super().__init__(name)
        self.model_path = model_path
        self.reuse_rejected = settings.reuse_rejected
        self.prefix_scope = settings.prefix_cache_scope
        self.engine = LlamaEngine(
            model_path,
            n_ctx=settings.n_ctx,
            n_threads=settings.n_threads,
            n_batch=settings.n_batch,
            n_parallel=settings.n_parallel,
            max_queue=settings.max_queue,
            prefix_cache_slots=settings.prefix_cache_slots,
            kv_cache_type=settings.kv_cache_type,
            name=name,
            draft_model_path=draft_model_path,
            draft_max=settings.draft_max,
            draft_p_min=settings.draft_p_min,
            draft_max_batch=settings.draft_max_batch,
            spec_cascade=None
            if settings.spec_cascade is None
            else (settings.spec_cascade.rule, settings.spec_cascade.margin),
        )
        self.max_tokens_cap = max_tokens_cap
        self._formatter: Any = None
        self._renders_tools = False  # the chat template has a tools section of its own
        self._starting: asyncio.Future[None] | None = None
        self.model_name = settings.model
        # recent scorings by their tokens: two cross_tier verifiers (say `mean` and `min`, or one
        # inside `learned`) reading the same answer share one prefill; concurrent askers share the
        # one in flight. Each still reports the full cost: it is what that score costs alone. Kept
        # per tenant (the key's first item, `sharer`): none reads another's, as with prompt KV.
        self._scored: OrderedDict[tuple[str, tuple[int, ...]], asyncio.Future[ContinuationScore]] = OrderedDict()

    @classmethod
    def from_settings(cls, tier: TierSettings, settings: Settings) -> LlamaCppBackend:
        assert tier.llamacpp is not None
        own, cache = tier.llamacpp, settings.models.cache_dir
        path = resolve_model(own.model, cache, sha256=own.model_sha256, allow_unpinned=own.allow_unpinned)
        draft_path = None
        if own.draft_model is not None:
            draft_path = resolve_model(
                own.draft_model, cache, sha256=own.draft_model_sha256, allow_unpinned=own.allow_unpinned
            )
        return cls(tier.name, path, tier.llamacpp, tier.max_tokens, draft_path)

    async def start(self) -> None:
        # callers that arrive while the model loads (an eval scoring many answers at once with a
        # tier nobody started) wait for that one load instead of finding the tier "not ready"
        if self._starting is None:
            if self.engine.started:
                return
            self._starting = asyncio.ensure_future(self._start())
        try:
            await asyncio.shield(self._starting)
        finally:
            if self._starting is not None and self._starting.done():
                self._starting = None

    async def _start(self) -> None:
        await asyncio.to_thread(self.engine.start)
        template = self.engine.chat_template
        if template:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            self._formatter = Jinja2ChatFormatter(
                template=template, eos_token=self.engine.eos_text, bos_token=self.engine.bos_text
            )
            self._renders_tools = template_renders_tools(template)

    async def close(self) -> None:
        await asyncio.to_thread(self.engine.stop)

    @property
    def ready(self) -> bool:
        return self.engine.ready

    @property
    def alive(self) -> bool:
        """False once the engine gave up restarting: liveness fails, so a supervisor restarts us."""
        return self.engine.alive

    def stats(self) -> dict[str, float]:
        return {
            "queue_depth": float(self.engine.queue_depth),
            "active_sequences": float(self.engine.active),
            "prefix_cache_lookups": float(self.engine.prefix.lookups),
            "prefix_cache_hits": float(self.engine.prefix.hits),
            "prefix_cache_tokens_saved": float(self.engine.prefix.tokens_saved),
            "tokens_read": float(self.engine.tokens_read),  # through the model's decode, drafts included
            "engine_restarts": float(self.engine.restarts),  # after failures of the shared decode step
        }

    def sharer(self, request: GenerationRequest) -> str:
        """Whose prompt KV a request may start from and leaves behind (`Job.tenant`): its tenant as
        this tier's `prefix_cache_scope` names it; the service's own work (no tenant) is one of its
        own, and under 'global' every request is everyone's."""
        if self.prefix_scope == "global":
            return "*"
        return "" if request.tenant is None else request.tenant.scope(self.prefix_scope)

    def draft_counts(self) -> dict[str, tuple[int, int]]:
        return {source: (c[0], c[1]) for source, c in self.engine.draft_counts.items()}

    def reuses(self, other: Backend) -> bool:
        """A loaded local tier of the same vocabulary: its answer's text, tokenized here, is a
        sequence of tokens that model could have written."""
        return (
            self.reuse_rejected
            and other is not self
            and isinstance(other, LlamaCppBackend)
            and self.engine.vocab_signature is not None
            and self.engine.vocab_signature == other.engine.vocab_signature
        )

    def prompt_token_limit(self, request: GenerationRequest) -> int:
        """The engine refuses a prompt that leaves no room in the context for one token. Tokens,
        not bytes of the request, bound it: a template may rewrite tools and calls (HTML-escaped,
        indented JSON) into more bytes than the client sent."""
        return self.engine.n_ctx - 1

    @property
    def max_prompt_chars(self) -> int:
        return self.engine.n_ctx * MAX_CHARS_PER_TOKEN

    def check_prompt_size(self, request: GenerationRequest) -> None:
        """400 for a prompt that cannot fit the context whatever it tokenizes to."""
        chars = len(request.prompt or "") if request.messages is None else sum(len(m.content) for m in request.messages)
        chars += sum(len(t.parameters_json or "") + len(t.description or "") for t in request.tools)
        if chars > self.max_prompt_chars:
            raise ContextLengthError(
                f"This model's maximum context length is {self.engine.n_ctx} tokens, and the prompt has "
                f"{chars} characters, more than that many tokens can hold. Shorten the prompt."
            )

    def prompt_tokens(self, request: GenerationRequest) -> list[int]:
        """The token ids the model will see: the chat template rendered, or the plain prompt.
        Blocking (rendering, native tokenizing): call it from a worker thread."""
        self.check_prompt_size(request)
        if request.messages is None:
            assert request.prompt is not None
            return self.engine.tokenize(request.prompt, add_special=True, parse_special=False)
        if self._formatter is None:
            raise ModelError(f"model {self.model_path.name} has no chat template; use /v1/completions")
        from jinja2 import TemplateError

        # tools and tool turns through the template's own tools section, or router.structured.tools' fallback
        messages, tools = chat_inputs(request, native=self._renders_tools)
        try:
            rendered = self._formatter(messages=messages, tools=tools)
        except (TemplateError, ValueError) as exc:  # the template's raise_exception: roles or order it refuses
            message = f"the model's chat template refused these messages: {exc}"[:500]
            raise RequestError(message, param="messages") from None
        added = bool(getattr(rendered, "added_special", False))
        return self.engine.tokenize(rendered.prompt, add_special=not added, parse_special=True)

    async def count_prompt_tokens(self, request: GenerationRequest) -> int | None:
        """The chat template rendered and tokenized, in a worker thread (nothing decoded)."""
        await self._ready()
        return len(await asyncio.to_thread(self.prompt_tokens, request))

    def grammar(self, request: GenerationRequest) -> str | None:
        """The GBNF the answer is decoded under, None for free text; RequestError (400) when the
        request's format cannot be one. Blocking (a first conversion, llama.cpp's parse): call it
        from a worker thread."""
        gbnf = request_grammar(request)
        if gbnf is None:
            return None
        if not self.engine.check_grammar(gbnf):
            # the converter's output parses; what llama.cpp refuses is a schema whose references
            # loop back on themselves before consuming any text
            raise RequestError(
                "the JSON schema cannot be decoded under a grammar (a $ref that refers back to itself "
                "before any text, which llama.cpp refuses as left recursion)",
                param=grammar_source(request),  # a forced call's functions, or the response_format
            )
        return gbnf

    def check_logit_bias(self, request: GenerationRequest) -> None:
        for token, _ in request.logit_bias:
            if token >= self.engine.n_vocab:
                raise RequestError(
                    f"logit_bias names token {token}; this model's vocabulary has {self.engine.n_vocab} tokens",
                    param="logit_bias",
                )

    def _job_inputs(self, request: GenerationRequest) -> tuple[list[int], str | None]:
        self.check_logit_bias(request)
        return self.prompt_tokens(request), self.grammar(request)

    @classmethod
    def scoring_support(cls, tier: TierSettings) -> str | None:
        return None

    def scoring_tokens(self, request: GenerationRequest, continuation: str) -> tuple[list[int], int]:
        """The prompt's tokens followed by the continuation's, and where the continuation starts.
        Blocking: call it from a worker thread."""
        if len(continuation) > self.max_prompt_chars:
            raise ContextLengthError(f"the answer to score has {len(continuation)} characters, more than fit")
        prompt = self.prompt_tokens(request)
        answer = self.engine.tokenize(continuation, add_special=False, parse_special=False)
        if not prompt or not answer:
            raise RequestError("nothing to score: the prompt or the answer is empty after tokenization")
        if len(prompt) + len(answer) + 1 > self.engine.n_ctx:
            raise ContextLengthError(
                f"This model's maximum context length is {self.engine.n_ctx} tokens; the prompt ({len(prompt)}) "
                f"and the answer to score ({len(answer)}) do not fit together."
            )
        return prompt + answer, len(prompt)

    async def _ready(self) -> None:
        if not self.engine.started:
            await self.start()
        if not self.engine.ready:  # restarting after a failure, or down for good
            raise self.engine.unavailable_error()

    async def _events(self, job: Job, request: GenerationRequest, doing: str) -> AsyncGenerator[Event, None]:
        """Submit `job` and yield its events until the caller stops; an ErrorEvent is raised, the
        request's deadline is a DeadlineError, and a caller that stops listening frees the job's
        slot within one engine step."""
        self.engine.submit(job)
        try:
            while True:
                try:
                    event = await asyncio.wait_for(job.events.get(), timeout=request.remaining())
                except TimeoutError:
                    raise DeadlineError(f"tier '{self.name}' did not {doing} before the deadline") from None
                if isinstance(event, ErrorEvent):
                    raise event.error
                yield event
        finally:
            job.cancel()

    async def score_continuation(self, request: GenerationRequest, continuation: str) -> ContinuationScore:
        await self._ready()
        self.check_prompt_size(request)
        tokens, score_from = await asyncio.to_thread(self.scoring_tokens, request, continuation)
        if request.remaining() == 0.0:
            raise DeadlineError(f"tier '{self.name}' did not score the answer before the deadline")
        key = (self.sharer(request), (score_from, *tokens))
        known = self._scored.get(key)
        if known is not None and not (known.done() and known.exception() is not None):
            self._scored.move_to_end(key)
            return await asyncio.wait_for(asyncio.shield(known), timeout=request.remaining())
        fut: asyncio.Future[ContinuationScore] = asyncio.get_running_loop().create_future()
        self._scored[key] = fut
        while len(self._scored) > SCORE_MEMO:
            self._scored.popitem(last=False)
        try:
            score = await self._score_tokens(request, tokens, score_from)
        except BaseException as exc:
            self._scored.pop(key, None)
            if not fut.done():
                fut.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
                fut.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        fut.set_result(score)
        return score

    async def _score_tokens(self, request: GenerationRequest, tokens: list[int], score_from: int) -> ContinuationScore:
        job = Job(
            prompt_tokens=tokens,
            max_tokens=0,
            temperature=0.0,
            top_p=1.0,
            seed=None,
            stop=(),
            deadline=request.deadline,
            loop=asyncio.get_running_loop(),
            events=asyncio.Queue(),
            score_from=score_from,
            tenant=self.sharer(request),
        )
        events = self._events(job, request, "score the answer")
        try:
            async for event in events:
                if isinstance(event, ScoredEvent):
                    return ContinuationScore(
                        token_logprobs=event.token_logprobs,
                        top1=event.top1,
                        prompt_tokens=event.prompt_tokens,
                        continuation_tokens=len(event.token_logprobs),
                        seconds=event.busy_s,
                    )
        finally:
            await events.aclose()
        raise AssertionError("the engine's event stream ended without a result")  # pragma: no cover

    def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        return self._stream(request, None)

    def stream_reusing(self, request: GenerationRequest, rejected: str) -> AsyncIterator[Delta | Generation]:
        return self._stream(request, rejected)

    def _reuse_tokens(self, rejected: str | None, prompt: list[int], max_tokens: int) -> tuple[int, ...]:
        """The rejected answer as this model's tokens, all of them (the engine drafts no more than
        the answer's room). Blocking: call it from a worker thread."""
        room = min(max_tokens, self.engine.n_ctx - len(prompt) - 1)
        if not rejected or room <= 1 or len(rejected) > self.max_prompt_chars:
            return ()
        return tuple(self.engine.tokenize(rejected, add_special=False, parse_special=False))

    def _scored_start(self, tenant: str, prompt: list[int], answer: tuple[int, ...]) -> tuple[float, ...] | None:
        """What a finished scoring of exactly these tokens for this tenant (a `cross_tier`
        verifier's, on this tier) learned about the rejected answer: the logprobs of its leading tokens that were this
        model's own top choice. None when none was scored here, or another tokenization of it (a
        clipped candidate): the engine then reads the answer as a draft itself."""
        if not answer:
            return None
        known = self._scored.get((tenant, (len(prompt), *prompt, *answer)))
        if known is None or not known.done() or known.cancelled() or known.exception() is not None:
            return None
        score = known.result()
        agreed = next((i for i, top in enumerate(score.top1) if not top), len(score.top1))
        return score.token_logprobs[:agreed]

    async def _stream(self, request: GenerationRequest, rejected: str | None) -> AsyncIterator[Delta | Generation]:
        await self._ready()
        self.check_prompt_size(request)  # before handing megabytes to a thread
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        tokens, grammar = await asyncio.to_thread(self._job_inputs, request)
        max_tokens = min(request.max_tokens, self.max_tokens_cap)
        answer = await asyncio.to_thread(self._reuse_tokens, rejected, tokens, max_tokens) if rejected else ()
        reuse = answer[: min(max_tokens, self.engine.n_ctx - len(tokens) - 1)]
        job = Job(
            prompt_tokens=tokens,
            max_tokens=max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=tuple(s for s in request.stop if s),
            deadline=request.deadline,
            top_logprobs=request.top_logprobs,
            loop=loop,
            events=asyncio.Queue(),
            grammar=grammar,
            logit_bias=request.logit_bias,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            reuse_tokens=reuse,
            reuse_scored=self._scored_start(self.sharer(request), tokens, answer),
            tenant=self.sharer(request),
        )
        events = self._events(job, request, "finish")
        try:
            async for event in events:
                if isinstance(event, TokenEvent):
                    if event.text:
                        yield Delta(
                            event.text,
                            len(job.prompt_tokens),
                            event.completion_tokens,
                            event.busy_s,
                            top_logprobs=event.top_logprobs if job.top_logprobs else None,
                        )
                elif isinstance(event, DoneEvent):
                    yield Generation(
                        text=event.text,
                        finish_reason=event.finish_reason,  # type: ignore[arg-type]
                        prompt_tokens=event.prompt_tokens,
                        completion_tokens=event.completion_tokens,
                        token_logprobs=event.token_logprobs,
                        latency_s=time.monotonic() - started,
                        ttft_s=event.ttft_s,
                        busy_s=event.busy_s,
                        model=self.model_name,
                        top_logprobs=event.top_logprobs,
                        constrained=grammar is not None,
                        drafts=event.drafts,
                    )
                    return
        finally:
            await events.aclose()  # a caller that stops listening frees the slot within one step
