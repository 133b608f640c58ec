"""The llama.cpp engine: one thread owns the model and context, and decodes many sequences per step.

A llama context is not thread-safe, so exactly one thread touches it. Callers submit `Job`s to a
bounded queue and read events back on their own asyncio loop. Each decode step builds one
`llama_batch` holding the next token of every running sequence plus a chunk of a newcomer's prompt
(so a long prompt never stalls the others for its whole length), then samples every sequence
from its own logits row with its own parameters.

This module is the thread, the queue and the loop (admit, step, release). What a step does for
one sequence is inherited from the package's other modules: `sampling` (logprobs from the rows
we already have, logit_bias and penalties), `grammar` (GBNF constraints, held to a per-sequence
time budget here), `tokens` (verifying drafts, taking tokens, stop strings, events), `drafting`
(speculative decoding from a draft model or a rejected answer), `spec_cascade` (a research
mode), `scoring` (another tier's answer read by this model, and that reading reused).

Failure is contained at two levels. An error in one sequence's own work (its random generator,
sampling, decoding its pieces, stop strings) fails that request and no other. An error in the
shared work (a decode step, the KV cache) fails every request in flight with a 503, frees the
model and loads it again, a few times with growing pauses: while it does, the engine is not
ready, new work is refused as unavailable, and no thread can reach the freed model (tokenizing
from callers' threads holds `ModelGuard`, which the engine thread drains before freeing). When
the restarts are spent the engine stays down and says so (`alive`), for the process supervisor.
"""

from __future__ import annotations

import codecs
import ctypes
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from router.backends.grammar_budget import GrammarBudget
from router.backends.llama.drafting import Drafting
from router.backends.llama.jobs import ErrorEvent, Job, Seq, State, put
from router.backends.llama.native import ModelGuard, physical_cores, read_ahead, route_native_logs
from router.backends.llama.prefix_cache import PrefixCache, common_prefix, leading
from router.backends.llama.scoring import Scoring
from router.backends.llama.vocab import vocab_signature
from router.errors import (
    ContextLengthError,
    DeadlineError,
    ModelError,
    OverloadedError,
    UnavailableError,
)

log = logging.getLogger(__name__)


class LlamaEngine(Scoring, Drafting):
    """Owns one llama.cpp model and context on a dedicated thread. Its per-sequence work is
    inherited from the package's parts (`Scoring` brings `TokenTaking`, `GrammarConstraint`,
    `CascadeRule` and `Sampling` with it; `Drafting`)."""

    def __init__(
        self,
        model_path: Path,
        *,
        n_ctx: int = 4096,
        n_threads: int = 0,
        n_batch: int = 512,
        n_parallel: int = 4,
        max_queue: int = 64,
        prefix_cache_slots: int = 4,
        kv_cache_type: str = "f16",
        name: str = "llamacpp",
        max_restarts: int = 3,
        restart_backoff_s: float = 1.0,
        healthy_after_s: float = 60.0,
        draft_model_path: Path | None = None,
        draft_max: int = 8,
        draft_p_min: float = 0.6,
        draft_max_batch: int = 1,
        spec_cascade: tuple[str, float] | None = None,
        grammar_budget: GrammarBudget | None = None,
    ) -> None:
        self.model_path = model_path
        # (rule, margin) of the speculative cascade (`cascade_defers`); None: exact speculative decoding
        self.spec_cascade = spec_cascade
        self.draft_model_path = draft_model_path
        self.draft_max = draft_max  # most tokens the draft model proposes per sequence per step
        self.draft_p_min = draft_p_min  # drafting stops before a token the draft model is less sure of
        # the draft model drafts only while at most this many sequences decode: a batch already
        # shares one read of the weights among its sequences, which is what drafting buys
        self.draft_max_batch = draft_max_batch
        # source ("model", "rejected") -> [tokens drafted, tokens accepted], every job since start
        # "scored": rejected-answer tokens a scoring pass had verified, taken without a pass of their own
        self.draft_counts: dict[str, list[int]] = {"model": [0, 0], "rejected": [0, 0], "scored": [0, 0]}
        if spec_cascade is not None:
            # the draft model's tokens its rule kept unchecked (drafted = accepted); "model" then
            # counts the rest: the deferred ones, verified as usual, and those after a refusal
            self.draft_counts["cascade"] = [0, 0]
        self.vocab_signature: tuple[Any, ...] | None = None
        self._dmodel: Any = None  # the draft model, its context, KV memory and batch (when configured)
        self._dctx: Any = None
        self._dmem: Any = None
        self._dbatch: Any = None
        self.n_ctx = n_ctx
        self.n_threads = n_threads or physical_cores()
        self.n_batch = n_batch
        self.n_parallel = n_parallel
        self.max_queue = max_queue
        self.kv_cache_type = kv_cache_type
        self.name = name
        self.prefix = PrefixCache(first_id=n_parallel, slots=prefix_cache_slots)
        self._pending: deque[Job] = deque()
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self._guard = ModelGuard(name)
        self.state: State = "new"
        self.max_restarts = max_restarts  # in a row: a run longer than healthy_after_s resets the count
        self.restart_backoff_s = restart_backoff_s  # doubled after each failed run
        self.healthy_after_s = healthy_after_s
        self.restarts = 0
        self.active = 0
        self.steps = 0
        self.tokens_out = 0
        self.tokens_read = 0  # tokens put through the target's decode (prompt, answer and drafts)
        self.chat_template: str | None = None
        self.bos_text = ""
        self.eos_text = ""
        self._piece_buf = ctypes.create_string_buffer(128)
        self._grammars: OrderedDict[str, Any] = OrderedDict()  # GBNF -> parsed prototype; engine thread
        self._grammar_ok: dict[str, bool] = {}  # GBNFs llama.cpp has parsed (or refused) before
        self.grammar_s = 0.0  # time spent in grammar checks, all sequences (the overhead of constraining)
        self.grammar_tokens = 0  # tokens sampled under a grammar
        self.grammar_full_scans = 0  # of those, chosen by checking the whole vocabulary
        self.grammar_dead_ends = 0  # sequences ended because the grammar allowed no token at all
        self.grammar_budget = grammar_budget or GrammarBudget()  # each constrained sequence's grammar time
        self.grammar_overruns = 0  # sequences ended for passing it

    # ---- public, any thread -----------------------------------------------------------------

    def start(self) -> None:
        """Load the model on a new engine thread; raise what stopped the first load."""
        with self._cv:
            self._stop = False
            self.state = "loading"
        self._loaded.clear()
        self._load_error = None
        self._thread = threading.Thread(target=self._run, name=f"llama-engine-{self.name}", daemon=True)
        self._thread.start()
        self._loaded.wait()
        if self._load_error is not None:
            self._thread.join()
            self._thread = None
            raise self._load_error

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def started(self) -> bool:
        """Has start() been called (and not undone by stop())? A restarting engine is started."""
        return self._thread is not None

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def alive(self) -> bool:
        """False once the engine has given up restarting: only a new process can serve this tier."""
        return self.state != "failed"

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    def submit(self, job: Job) -> None:
        n_prompt = len(job.prompt_tokens)
        if n_prompt == 0:
            raise ContextLengthError("the prompt is empty after tokenization")
        if n_prompt + 1 > self.n_ctx:
            raise ContextLengthError(
                f"This model's maximum context length is {self.n_ctx} tokens, but the prompt has "
                f"{n_prompt} tokens. Shorten the prompt."
            )
        with self._cv:
            if self.state != "ready":
                raise self.unavailable_error()
            if len(self._pending) >= self.max_queue:
                raise OverloadedError(f"tier '{self.name}' is at capacity; retry later", retry_after=2.0)
            self._pending.append(job)
            self._cv.notify()

    def unavailable_error(self) -> UnavailableError:
        if self.state == "failed":
            return UnavailableError(f"tier '{self.name}' is down (its engine failed and was not restarted)", 60.0)
        return UnavailableError(f"tier '{self.name}' is not ready ({self.state}); retry later", retry_after=5.0)

    # ---- tokenizer (read-only on the model: safe from any thread while the model is loaded) ----

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        import llama_cpp as lc

        data = text.encode("utf-8")
        cap = len(data) + 16
        with self._guard.use():
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
            if n < 0:
                cap = -n
                buf = (lc.llama_token * cap)()
                n = lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def check_grammar(self, gbnf: str) -> bool:
        """Whether llama.cpp accepts this grammar (it refuses, say, left recursion, which a schema's
        references can make). Any thread; remembered per grammar."""
        known = self._grammar_ok.get(gbnf)
        if known is not None:
            return known
        import llama_cpp as lc

        with self._guard.use():
            sampler = lc.llama_sampler_init_grammar(self._vocab, gbnf.encode(), b"root")
            if sampler:
                lc.llama_sampler_free(sampler)
        self._grammar_ok[gbnf] = bool(sampler)
        return bool(sampler)

    def _load(self) -> None:
        import llama_cpp as lc

        route_native_logs()
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        read_ahead(self.model_path)
        if self.draft_model_path is not None:
            read_ahead(self.draft_model_path)  # both files' reads started together
        model = lc.llama_model_load_from_file(str(self.model_path).encode(), mparams)
        if not model:
            raise ModelError(f"llama.cpp could not load {self.model_path}")
        self._model = model
        self._vocab = lc.llama_model_get_vocab(model)
        self.n_vocab = lc.llama_vocab_n_tokens(self._vocab)
        cparams = self._context_params(self.n_parallel + self.prefix.slots)
        ctx = lc.llama_init_from_model(model, cparams)
        if not ctx:
            raise ModelError(f"llama.cpp could not create a context for {self.model_path}")
        self._ctx = ctx
        self._mem = lc.llama_get_memory(ctx)
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        tmpl = lc.llama_model_chat_template(model, None)
        self.chat_template = tmpl.decode("utf-8") if tmpl else None
        self._piece_buf = ctypes.create_string_buffer(128)
        # one candidate buffer for grammar checks, viewed from numpy to fill and read it without a loop
        self._cand = (lc.llama_token_data * self.n_vocab)()
        self._cand_view = np.ctypeslib.as_array(self._cand)
        # the end tokens: a grammar that is complete allows only these (once per load, ~0.1 s on 152k)
        self._eog_ids = np.asarray(
            [t for t in range(self.n_vocab) if lc.llama_vocab_is_eog(self._vocab, t)], dtype=np.int64
        )
        self.bos_text, self.eos_text = (
            self._piece(t, special=True).decode("utf-8", errors="replace") if t >= 0 else ""
            for t in (lc.llama_vocab_bos(self._vocab), lc.llama_vocab_eos(self._vocab))
        )
        self.vocab_signature = vocab_signature(self._vocab)
        if self.draft_model_path is not None:
            self._load_draft()

    def _context_params(self, n_seq_max: int) -> Any:
        """A context's settings, the target's and the draft model's alike: the same size, batch,
        threads and KV cache type; only the number of sequences differs."""
        import llama_cpp as lc

        cparams = lc.llama_context_default_params()
        cparams.n_ctx = self.n_ctx
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = min(self.n_batch, 512)
        cparams.n_seq_max = n_seq_max
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.kv_unified = True  # sequences share the whole context; admission reserves cells
        cparams.no_perf = True
        if self.kv_cache_type != "f16":
            kv_type = {"q8_0": lc.GGML_TYPE_Q8_0, "q4_0": lc.GGML_TYPE_Q4_0}[self.kv_cache_type]
            cparams.type_k = kv_type
            cparams.type_v = kv_type
            cparams.flash_attn_type = 1  # llama.cpp needs flash attention for a quantized V cache
        return cparams

    def _load_draft(self) -> None:
        """The draft model and a second context of its own, with one sequence per slot (the same
        ids as the target's): its KV follows each sequence's accepted tokens."""
        import llama_cpp as lc

        path = self.draft_model_path
        assert path is not None
        model = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
        if not model:
            raise ModelError(f"llama.cpp could not load the draft model {path}")
        self._dmodel = model
        if vocab_signature(lc.llama_model_get_vocab(model)) != self.vocab_signature:
            raise ModelError(f"draft model {path.name} has another vocabulary than {self.model_path.name}")
        ctx = lc.llama_init_from_model(model, self._context_params(self.n_parallel))
        if not ctx:
            raise ModelError(f"llama.cpp could not create a context for the draft model {path}")
        self._dctx = ctx
        self._dmem = lc.llama_get_memory(ctx)
        self._dbatch = lc.llama_batch_init(self.n_batch, 0, 1)

    def _free(self) -> None:
        """Free whatever _load made (all of it, or what it got to before failing)."""
        import llama_cpp as lc

        for sampler in self._grammars.values():
            lc.llama_sampler_free(sampler)
        self._grammars.clear()
        if getattr(self, "_batch", None) is not None:
            lc.llama_batch_free(self._batch)
        if getattr(self, "_ctx", None):
            lc.llama_free(self._ctx)
        if getattr(self, "_model", None):
            lc.llama_model_free(self._model)
        self._batch = self._ctx = self._model = self._vocab = self._mem = None
        if getattr(self, "_dbatch", None) is not None:
            lc.llama_batch_free(self._dbatch)
        if getattr(self, "_dctx", None):
            lc.llama_free(self._dctx)
        if getattr(self, "_dmodel", None):
            lc.llama_model_free(self._dmodel)
        self._dbatch = self._dctx = self._dmodel = self._dmem = None

    def _run(self) -> None:
        """The engine thread: load, serve until stopped or broken, and after a break free the model
        and load it again, up to max_restarts times in a row with doubling pauses."""
        crashes = 0
        while True:
            try:
                self._load()
            except BaseException as exc:
                self._free()
                if not self._loaded.is_set():  # the first load: start() reports it
                    self._load_error = exc
                    self._set_state("stopped")
                    self._loaded.set()
                    return
                log.exception("llama engine %s could not reload its model", self.name)
            else:
                self.prefix.clear()
                self._guard.open()
                self._set_state("ready")
                self._loaded.set()
                began = time.monotonic()
                try:
                    self._serve()
                    return  # stopped
                except BaseException:
                    log.exception("llama engine %s crashed; failing its requests", self.name)
                finally:
                    self._set_state("stopped" if self._stop else "restarting")
                    self._guard.close()  # wait out any tokenize still reading the model
                    self._free()
                if time.monotonic() - began > self.healthy_after_s:
                    crashes = 0
            crashes += 1
            if crashes > self.max_restarts:
                log.critical("llama engine %s failed %d times in a row; tier down until restarted", self.name, crashes)
                self._set_state("failed")
                return
            self.restarts += 1
            pause = self.restart_backoff_s * 2 ** (crashes - 1)
            with self._cv:
                if self._cv.wait_for(lambda: self._stop, timeout=pause):
                    self.state = "stopped"
                    return
            log.warning("llama engine %s: restart %d (pause was %.1f s)", self.name, self.restarts, pause)

    def _set_state(self, state: State) -> None:
        """Change state; leaving 'ready' fails every waiting job (under the same lock submit takes,
        so none slips in between)."""
        with self._cv:
            self.state = state
            if state != "ready":
                for job in self._pending:
                    job.emit(ErrorEvent(self.unavailable_error()))
                self._pending.clear()

    def _serve(self) -> None:
        """Admit, step and release until stopped; a shared failure fails every running sequence
        (as unavailable: the cascade may escalate) and propagates to _run."""
        running: list[Seq] = []
        free_ids = list(range(self.n_parallel - 1, -1, -1))
        reserved = 0
        try:
            while True:
                with self._cv:
                    while not self._stop and not running and not self._pending:
                        self._cv.wait()
                    if self._stop:
                        break
                    admitted = self._admit(running, free_ids, reserved)
                for seq in admitted:
                    if seq.job.grammar is not None and not self._attach_grammar(seq):
                        free_ids.append(seq.seq_id)
                        continue
                    reserved += seq.reserved
                    if not self._take_scored(seq):
                        self._reuse_prefix(seq, running)
                    running.append(seq)
                self.active = len(running)
                # drop sequences whose caller left or whose deadline passed: within one step
                now = time.monotonic()
                for seq in list(running):
                    if seq.job.cancelled or (seq.job.deadline is not None and now > seq.job.deadline):
                        if not seq.job.cancelled:
                            seq.job.emit(ErrorEvent(DeadlineError("generation passed its deadline")))
                        reserved -= self._release(seq, running, free_ids)
                    elif seq.grammar is not None and not self.grammar_budget.allows(seq.grammar_s, len(seq.generated)):
                        self.grammar_overruns += 1  # this sequence alone: its grammar cost the others too much
                        seq.job.emit(ErrorEvent(self.grammar_budget.error(seq.grammar_s, len(seq.generated))))
                        reserved -= self._release(seq, running, free_ids)
                self.active = len(running)
                if not running:
                    continue
                self._step(running)
                for seq in list(running):
                    if seq.job.cancelled:  # finished (or failed alone) inside _step
                        reserved -= self._release(seq, running, free_ids)
                self.active = len(running)
        except BaseException:
            self._set_state("restarting")  # before anyone hears of the failure: no new work after it
            # the cause goes to the log (by _run), not to clients
            failure = UnavailableError(f"tier '{self.name}' failed mid-answer; restarting", 5.0)
            for seq in running:
                seq.job.emit(ErrorEvent(failure))
            raise
        finally:
            for seq in running:
                self._drop_grammar(seq)
            self.active = 0

    def _admit(self, running: list[Seq], free_ids: list[int], reserved: int) -> list[Seq]:
        """Take newcomers from the queue (caller holds the lock) while a slot and their worst-case
        KV cells are free. A newcomer sharing a prompt prefix with a sequence of its own tenant still
        prefilling waits a step, so it can copy that KV instead of computing it again
        (self-consistency samples); another tenant's is no reason to wait, since it cannot copy it."""
        admitted: list[Seq] = []
        deferred: list[Job] = []
        while self._pending and len(admitted) < len(free_ids):
            job = self._pending[0]
            if job.cancelled:
                self._pending.popleft()
                continue
            need = min(len(job.prompt_tokens) + job.max_tokens, self.n_ctx)
            budget = self.n_ctx - reserved - sum(a.reserved for a in admitted)
            if need > budget - self.prefix.cells:
                self.prefix.evict_until(self._mem, max(0, need - (budget - self.prefix.cells)))
            if (running or admitted) and need > budget - self.prefix.cells:
                break  # wait for a running sequence to leave
            self._pending.popleft()
            if any(
                common_prefix(job.prompt_tokens, o.job.prompt_tokens) > o.n_prefilled + PrefixCache.MIN and o.prefilling
                for o in running
                if o.job.tenant == job.tenant
            ) or any(
                common_prefix(job.prompt_tokens, a.job.prompt_tokens) >= PrefixCache.MIN
                for a in admitted
                if a.job.tenant == job.tenant
            ):
                deferred.append(job)
                continue
            seq = Seq(job=job, seq_id=free_ids[-1 - len(admitted)], started=time.monotonic(), reserved=need)
            try:
                # OpenAI's seeds are signed 64-bit; numpy wants them unsigned: the same bits, read so
                seq.rng = np.random.default_rng(None if job.seed is None else job.seed % (1 << 64))
                seq.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            except Exception as exc:  # noqa: BLE001 - this request's own setup: fail it alone
                self._fail_one(job, exc)
                continue
            admitted.append(seq)
        self._pending.extendleft(reversed(deferred))
        for seq in admitted:
            free_ids.remove(seq.seq_id)
        return admitted

    def _reuse_prefix(self, seq: Seq, running: list[Seq]) -> None:
        """Start a newcomer from the longest prompt prefix it shares with its own tenant's cached
        entries or running sequences (never another tenant's: `prefix_cache`)."""
        import llama_cpp as lc

        prompt, tenant = seq.job.prompt_tokens, seq.job.tenant
        sources = [(e.seq_id, e.tokens) for e in self.prefix.of(tenant)]
        sources += [(o.seq_id, o.job.prompt_tokens[: o.n_prefilled]) for o in running if o.job.tenant == tenant]
        best_id, best = -1, 0
        for sid, tokens in sources:
            n = common_prefix(prompt, tokens)
            if n > best:
                best_id, best = sid, n
        # at least one token must be decoded for logits: for a scoring job, the one before the candidate
        best = min(best, (seq.job.score_from or len(prompt)) - 1)
        self.prefix.lookups += 1
        if best >= PrefixCache.MIN:
            lc.llama_memory_seq_cp(self._mem, best_id, seq.seq_id, 0, best)
            seq.n_prefilled = best
            self.prefix.hits += 1
            self.prefix.tokens_saved += best
            self.prefix.touch(best_id)

    def _release(self, seq: Seq, running: list[Seq], free_ids: list[int]) -> int:
        import llama_cpp as lc

        if not seq.prefilling and not seq.job.cancelled_by_caller:
            # of a scored candidate, only the start this model agrees with is kept (with the prompt
            # before it, which later requests share): the start of this model's own answer if the
            # candidate is rejected and escalates here (`_take_scored`)
            end = None if seq.job.score_from is None else seq.job.score_from + leading(seq.top1)
            self.prefix.store(self._mem, seq.seq_id, seq.job.prompt_tokens[:end], seq.job.tenant)
        lc.llama_memory_seq_rm(self._mem, seq.seq_id, -1, -1)
        if self._dmem is not None:
            lc.llama_memory_seq_rm(self._dmem, seq.seq_id, -1, -1)
        self._drop_grammar(seq)
        running.remove(seq)
        free_ids.append(seq.seq_id)
        seq.job.cancelled = True
        return seq.reserved

    def _step(self, running: Sequence[Seq]) -> None:
        import llama_cpp as lc

        t0 = time.monotonic()
        batch = self._batch
        n = 0
        outputs: list[tuple[Seq, int]] = []  # each sequence asking for logits, and its rows (1 + its draft)
        decoding = [seq for seq in running if not seq.prefilling]
        for seq in running:
            seq.draft, seq.draft_q, seq.draft_source = [], [], ""
        # drafts first, within what the batch holds after every decoding sequence's own token
        room = self.n_batch - len(decoding)
        by_model: list[Seq] = []
        for seq in decoding:
            if not seq.job.may_draft:
                continue
            if self._take_reuse(seq, room):
                room -= len(seq.draft)
            elif self._dctx is not None:
                by_model.append(seq)
        if by_model and room > 0 and len(decoding) <= self.draft_max_batch:
            self._draft_by_model(by_model, room)
        # decoding sequences first: their next token and its draft, logits for each
        for seq in decoding:
            base = seq.pos - 1
            put(batch, n, seq.generated[-1], base, seq.seq_id, True)
            n += 1
            for i, token in enumerate(seq.draft):
                put(batch, n, token, base + 1 + i, seq.seq_id, True)
                n += 1
            outputs.append((seq, 1 + len(seq.draft)))
        # then prompt chunks within what is left of the batch
        for seq in running:
            if not seq.prefilling or n >= self.n_batch or seq.job.score_from is not None:
                continue
            prompt = seq.job.prompt_tokens
            take = min(len(prompt) - seq.n_prefilled, self.n_batch - n)
            for i in range(take):
                last = seq.n_prefilled + i == len(prompt) - 1
                put(batch, n, prompt[seq.n_prefilled + i], seq.n_prefilled + i, seq.seq_id, last)
                n += 1
            seq.n_prefilled += take
            if not seq.prefilling:
                # a rejected answer goes in right after the prompt's end: one pass reads both
                if seq.job.may_draft and self._take_reuse(seq, self.n_batch - n):
                    for i, token in enumerate(seq.draft):
                        put(batch, n, token, len(prompt) + i, seq.seq_id, True)
                        n += 1
                outputs.append((seq, 1 + len(seq.draft)))
        # scoring jobs last, so that their logits rows follow every generating sequence's
        scoring: list[tuple[Seq, int, int]] = []  # (job, its first logits row, its rows)
        n_out = sum(k for _, k in outputs)
        first_row = n_out
        for seq in running:
            if seq.prefilling and seq.job.score_from is not None and n < self.n_batch:
                n, rows_taken = self._put_scoring(batch, n, seq)
                scoring.append((seq, first_row, rows_taken))
                first_row += rows_taken
        batch.n_tokens = n
        self.tokens_read += n
        rc = lc.llama_decode(self._ctx, batch)
        if rc == 1 and self.prefix.entries:  # no KV slot: cached prefixes are the first to go
            self.prefix.evict_until(self._mem, self.n_ctx)
            rc = lc.llama_decode(self._ctx, batch)
        if rc != 0:
            raise ModelError(f"llama_decode returned {rc}")
        n_rows = first_row
        # a step that only prefills asks for no logits, and llama.cpp then has no rows to point to
        rows = (
            np.ctypeslib.as_array(lc.llama_get_logits(self._ctx), shape=(n_rows, self.n_vocab))
            if n_rows
            else np.zeros((0, self.n_vocab), dtype=np.float32)
        )
        self._sample(outputs, rows[:n_out])
        dt = time.monotonic() - t0
        self.steps += 1
        share = dt / max(1, len(running))
        for seq in running:
            seq.busy_s += share
        self._score(scoring, rows)  # after the shares: a finished job reports this step too
