"""The llama.cpp engine: one thread owns the model and context, and decodes many sequences per step.

A llama context is not thread-safe, so exactly one thread touches it. Callers submit `Job`s to a
bounded queue and read events back on their own asyncio loop. Each decode step builds one
`llama_batch` holding the next token of every running sequence plus a chunk of a newcomer's prompt
(so a long prompt never stalls the others for its whole length), then samples every sequence
from its own logits row with its own parameters.

Logprobs come from the logits rows we already have: the log-softmax at the sampled token. This
avoids `logits_all=True`, which computes vocabulary logits for every prompt token. A job that asks
for `top_logprobs` alternatives gets them from the same row and normaliser (one partial sort of
the row per token); a job that does not pays nothing for it.

A job with a grammar (`Job.grammar`, GBNF from a response_format) gets its own llama.cpp grammar
sampler, cloned from a parsed prototype kept per grammar, and advanced with each token it takes:
constrained and free sequences share every decode step. The token is first chosen as for a free
sequence and kept when the grammar allows it, which costs a check of one token; only when it does
not is the choice made again among the likeliest `GRAMMAR_CANDIDATES` the grammar allows, and only
when it allows none of those among the whole vocabulary (a 151k-token scan, rare). The end token
is allowed only where the grammar is complete. `logit_bias` and the presence and frequency
penalties reshape a copy of the row before any of this; logprobs stay the model's own. Grammar
time is summed per sequence and held to `grammar_budget` (router.backends.grammar_budget): a
sequence past it is ended alone, as a bad request.

A scoring job (`Job.score_from` set) is another tier's candidate answer read by this model: its
prompt is the rendered request followed by the candidate's tokens, prefilled like any prompt but
with logits asked for only where they predict a candidate token (at most `SCORE_ROWS_PER_STEP` rows
a step, so one long answer never makes a step's output buffer vocabulary-times-hundreds wide). It
reports each candidate token's log-softmax and whether it was the argmax, and ends without decoding
(`ScoredEvent`): the verification pass of speculative decoding.

Speculative decoding. Decode time is almost all inside `llama_decode`, and a step reading k+1
tokens of one sequence costs little more than a step reading one, so a sequence may put a draft
of k tokens after its last one and have every position's logits back from the same step. Drafts
come from a draft model of the same vocabulary (`draft_model_path`: a second context on the same
thread, sequence ids shared with the target's, one draft decode per drafted position for all
drafting sequences together, and its KV caught up lazily with what the target kept), or from a
lower tier's rejected answer (`Job.reuse_tokens`), whose first chunk goes into the very step that
ends the prompt's prefill. Row i of a sequence judges draft token i: under greedy it is kept when
it is the argmax (so the answer is token for token the plain one), under sampling by the standard
rejection rule (`speculative_accept`: the answer's distribution is the target's own); the row
after the last kept token gives one token more. Refused positions leave both KV caches
(`llama_memory_seq_rm`). Jobs with a grammar, `logit_bias` or penalties do not draft: their
target distribution is a reshaped row, which the simple rule would have to re-derive per position
(with grammar state advanced speculatively), for the rare request that asks for both.

One prefill, two uses. When this engine has already scored the rejected answer (a `cross_tier`
verifier's scoring job; `Job.reuse_scored`), that pass has verified it as a draft: a greedy job
starts with the answer's tokens that were the argmax there, their KV copied from the prefix cache
(a scoring job leaves prompt + that agreed start there), and reads only the last of them again
(draft source "scored"). Sampling needs the whole distribution at each position, and
`top_logprobs` the alternatives, which a scoring pass does not keep: such jobs, and any whose KV
was evicted, draft from the answer as above.

The speculative cascade (`spec_cascade`, a research mode, off by default) loosens that check for
the draft model's tokens: at each drafted position a deferral rule (`cascade_defers`) compares the
draft model's distribution q with the target's p and either keeps the token unchecked (the output
follows q there) or defers, and the position is judged as above. Positions nothing was drafted for
(the token after a draft, or where drafting stopped) are the target's own. The answer is then a
mix of the two models: neither greedy-identical to the target nor distributed as its samples.

Failure is contained at two levels. An error in one sequence's own work (its random generator,
sampling, decoding its pieces, stop strings) fails that request and no other. An error in the
shared work (a decode step, the KV cache) fails every request in flight with a 503, frees the
model and loads it again, a few times with growing pauses: while it does, the engine is not
ready, new work is refused as unavailable, and no thread can reach the freed model (tokenizing
from callers' threads holds `ModelGuard`, which the engine thread drains before freeing). When
the restarts are spent the engine stays down and says so (`alive`), for the process supervisor.
"""

from __future__ import annotations

import asyncio
import codecs
import ctypes
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from router.backends.grammar_budget import GrammarBudget
from router.errors import (
    ContextLengthError,
    DeadlineError,
    ModelError,
    OverloadedError,
    RequestError,
    UnavailableError,
)
from router.generation import TokenLogprob

log = logging.getLogger(__name__)

# Logits rows a scoring job may ask for in one decode step (each is a vocabulary of floats).
SCORE_ROWS_PER_STEP = 64
# A constrained sequence whose sampled token the grammar refuses is offered its likeliest tokens
# next, this many and then this many (with the end tokens, which a finished answer needs however
# unlikely the model finds them); only when the grammar refuses all of them is the whole
# vocabulary checked (about 55 ms for Qwen's 151,936 tokens, against 0.02 ms for 256).
GRAMMAR_CANDIDATES = (256, 8192)
# Parsed grammars kept on the engine thread, cloned per sequence (parsing a schema's grammar
# costs far more than cloning it).
GRAMMAR_PROTOTYPES = 32
# Tokens of a rejected answer verified per sequence in one step: each is a logits row of the
# vocabulary, so a 300-token answer is read in a few steps rather than one very wide output buffer.
REUSE_ROWS_PER_STEP = 64
# After the answer leaves the rejected answer (a reworded first sentence, say), the rejected answer
# drafts again from where its text shows the answer's last this-many tokens (prompt lookup). A
# draft refused in part is followed by a shorter one (verifying k tokens on a CPU costs about
# k/4 single steps here, so long wrong drafts are not free); one refused outright pauses reuse.
REUSE_NGRAM = 3
REUSE_MIN_LEN = 4
# The first rejected-answer draft's length, doubled after each draft kept whole (up to
# REUSE_ROWS_PER_STEP): an answer the model disagrees with from its first token costs a 17-token
# pass, not a 65-token one, and one it agrees with is still read in a few steps.
REUSE_FIRST_LEN = 16
REUSE_PAUSE_STEPS = 8
# Token ids read (as text, specials included) to tell two vocabularies apart, beyond their sizes.
VOCAB_SAMPLE = 512


def physical_cores() -> int:
    """Physical cores from /proc/cpuinfo (llama.cpp gains nothing from SMT siblings)."""
    import os

    try:
        cores: set[tuple[str, str]] = set()
        phys = core = ""
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "physical id":
                    phys = value
                elif key == "core id":
                    core = value
                elif not key and (phys or core):
                    cores.add((phys, core))
                    phys = core = ""
        if phys or core:
            cores.add((phys, core))
        if cores:
            return len(cores)
    except OSError:
        pass
    return os.cpu_count() or 1


_native_log_callback: Any = None


def _route_native_logs() -> None:
    """Send llama.cpp's own log lines to Python logging (debug), instead of raw stderr, where
    harmless vocabulary notices look like errors to an operator."""
    global _native_log_callback
    import llama_cpp as lc

    if _native_log_callback is not None:
        return
    native = logging.getLogger("llama_cpp.native")

    @lc.llama_log_callback  # type: ignore[untyped-decorator]
    def forward(level: int, text: bytes, user_data: Any) -> None:
        native.debug("%s", text.decode("utf-8", errors="replace").rstrip())

    _native_log_callback = forward  # ctypes callbacks must outlive every call into llama.cpp
    lc.llama_log_set(forward, ctypes.c_void_p(0))


def speculative_accept(
    p: tuple[np.ndarray, np.ndarray], q: tuple[np.ndarray, np.ndarray] | None, x: int, rng: np.random.Generator
) -> tuple[bool, int]:
    """The standard speculative rejection rule for one drafted token `x` drawn from `q`: keep it
    with probability min(1, p(x)/q(x)), else draw from max(0, p - q) renormalised. Whatever q is,
    the token that comes out is distributed as p (the target's own sampling distribution).
    Distributions are sparse, (ids, probs); q None is a fixed draft (a point mass on x: a
    rejected answer's token), for which the rule keeps x with probability p(x) and else draws from
    p without x."""
    p_ids, p_probs = p
    q_ids, q_probs = (np.asarray([x]), np.asarray([1.0])) if q is None else q
    px = float(p_probs[p_ids == x].sum())
    qx = float(q_probs[q_ids == x].sum())
    if qx > 0.0 and rng.random() * qx < px:
        return True, x
    ids = np.union1d(p_ids, q_ids)
    pf = np.zeros(ids.shape[0])
    qf = np.zeros(ids.shape[0])
    pf[np.searchsorted(ids, p_ids)] = p_probs
    qf[np.searchsorted(ids, q_ids)] = q_probs
    residual = np.maximum(pf - qf, 0.0)
    total = residual.sum()
    if total <= 0.0:  # p == q (up to rounding): the draft would have been kept; draw from p itself
        residual, total = pf, pf.sum()
    return False, int(ids[rng.choice(ids.shape[0], p=residual / total)])


# a deferral rule's comparison counts a difference this small as a tie, which keeps: opt at margin
# 1 compares max q with max p - TV(p, q), equal where q's excess over p sits on p's argmax alone
CASCADE_TIE = 1e-9


def total_variation(p: tuple[np.ndarray, np.ndarray], q: tuple[np.ndarray, np.ndarray]) -> float:
    """Half the L1 distance between two sparse distributions (ids, probs); mass outside both
    supports (beyond `_dist`'s top candidates) is not seen, so this is a slight underestimate."""
    ids = np.union1d(p[0], q[0])
    pf = np.zeros(ids.shape[0])
    qf = np.zeros(ids.shape[0])
    pf[np.searchsorted(ids, p[0])] = p[1]
    qf[np.searchsorted(ids, q[0])] = q[1]
    return 0.5 * float(np.abs(pf - qf).sum())


def cascade_defers(
    rule: str, margin: float, p: tuple[np.ndarray, np.ndarray], q: tuple[np.ndarray, np.ndarray]
) -> bool:
    """Whether the speculative cascade defers to the target at one drafted position (Narasimhan
    et al., "Faster Cascades via Speculative Decoding"): q is the draft model's distribution
    there, p the target's. chow looks at the draft model alone; diff asks whether the target is
    surer by more than the margin; opt scales the margin by how far apart the two are (TV), so
    two models that agree defer rarely however unsure both are. The decision depends on p and q
    only, never on the drafted token: where it keeps, the output follows q; where it defers, p."""
    q_max = float(q[1].max()) + CASCADE_TIE
    if rule == "chow":
        return q_max < 1.0 - margin
    p_max = float(p[1].max())
    if rule == "diff":
        return q_max < p_max - margin
    if rule == "opt":
        return q_max < p_max - margin * total_variation(p, q)
    raise ValueError(f"unknown speculative cascade rule {rule!r}")


def vocab_signature(vocab: Any) -> tuple[Any, ...]:
    """What tells two vocabularies apart: their size, special ids, and the text of a spread of
    tokens. Two models agreeing here tokenize alike, so one's tokens can be the other's draft."""
    import llama_cpp as lc

    n = lc.llama_vocab_n_tokens(vocab)
    buf = ctypes.create_string_buffer(256)
    pieces = []
    for t in sorted({*range(0, n, max(1, n // VOCAB_SAMPLE)), n - 1}):
        k = lc.llama_token_to_piece(vocab, t, buf, len(buf), 0, True)
        pieces.append(bytes(buf.raw[: max(k, 0)]))
    specials = tuple(
        int(f(vocab)) for f in (lc.llama_vocab_bos, lc.llama_vocab_eos, lc.llama_vocab_eot, lc.llama_vocab_pad)
    )
    return (n, specials, tuple(pieces))


def read_vocab_signature(path: Path) -> tuple[Any, ...]:
    """A model file's vocabulary signature, reading the vocabulary only (no weights)."""
    import llama_cpp as lc

    _route_native_logs()
    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelError(f"llama.cpp could not read the vocabulary of {path}")
    try:
        return vocab_signature(lc.llama_model_get_vocab(model))
    finally:
        lc.llama_model_free(model)


def vocab_mismatch(target: Path, draft: Path) -> str | None:
    """Why `draft` cannot draft for `target` (their vocabularies differ), naming both; None if it can."""
    a, b = read_vocab_signature(target), read_vocab_signature(draft)
    if a == b:
        return None
    if a[0] != b[0]:
        why = f"{a[0]} tokens against {b[0]}"
    elif a[1] != b[1]:
        why = f"special token ids (bos, eos, eot, pad) {a[1]} against {b[1]}"
    else:
        why = "the same size but different token texts"
    return f"draft model {draft.name} has another vocabulary than {target.name}: {why}"


# ---- events sent back to the caller's loop --------------------------------------------------


@dataclass(frozen=True)
class TokenEvent:
    text: str  # text safe to emit (never part of a pending stop string)
    completion_tokens: int = 0  # generated so far
    busy_s: float = 0.0  # this sequence's share of the steps so far
    top_logprobs: tuple[TokenLogprob, ...] = ()  # the tokens generated since the last event, when asked for


@dataclass(frozen=True)
class DoneEvent:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    token_logprobs: tuple[float, ...]
    ttft_s: float | None
    busy_s: float
    queued_s: float
    top_logprobs: tuple[TokenLogprob, ...] | None = None  # every generated token, when asked for
    # (source, drafted, accepted) per draft source ("model", "rejected") that drafted for this job
    drafts: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True)
class ScoredEvent:
    """A scoring job's result: per candidate token, its logprob and whether it was the argmax."""

    token_logprobs: tuple[float, ...]
    top1: tuple[bool, ...]
    prompt_tokens: int  # prefilled in all, the candidate's included
    busy_s: float
    queued_s: float


@dataclass(frozen=True)
class ErrorEvent:
    error: BaseException


Event = TokenEvent | DoneEvent | ScoredEvent | ErrorEvent


@dataclass
class Job:
    """A generation request as the engine sees it. `cancel()` is safe from any thread."""

    prompt_tokens: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    deadline: float | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event]
    submitted: float = field(default_factory=time.monotonic)
    top_logprobs: int = 0  # alternatives per generated token; 0: none computed
    cancelled: bool = False
    cancelled_by_caller: bool = False
    # set: score prompt_tokens[score_from:] given what precedes them, and decode nothing
    score_from: int | None = None
    grammar: str | None = None  # GBNF every generated token must keep satisfiable
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), ids < n_vocab
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # a lower tier's rejected answer in this model's tokens: the first draft of the answer
    reuse_tokens: tuple[int, ...] = ()
    # set when a scoring job of this engine already read prompt + reuse_tokens (a `cross_tier`
    # verifier): the logprobs of the leading reuse tokens it found to be this model's argmax. A
    # greedy job takes those tokens as its answer's start, without a pass of its own, when their
    # KV is still in the prefix cache (the scoring job left it there); else it drafts as usual.
    reuse_scored: tuple[float, ...] | None = None

    @property
    def reshapes_logits(self) -> bool:
        return bool(self.logit_bias or self.presence_penalty or self.frequency_penalty)

    @property
    def may_draft(self) -> bool:
        """Drafts are verified against the model's own row; a grammar or reshaped logits would make
        the target distribution another one, so such jobs decode a token a step, as before."""
        return self.grammar is None and not self.reshapes_logits and self.score_from is None

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled_by_caller = True
        self.cancelled = True

    def emit(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            self.cancelled = True


@dataclass
class _Seq:
    job: Job
    seq_id: int
    started: float
    n_prefilled: int = 0
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[TokenLogprob] = field(default_factory=list)  # only when the job asks for top_logprobs
    tops_sent: int = 0
    text: str = ""
    emitted: int = 0  # chars of text already sent
    first_token_at: float | None = None
    busy_s: float = 0.0
    rng: np.random.Generator | None = None
    decoder: Any = None
    reserved: int = 0
    top1: list[bool] = field(default_factory=list)  # scoring jobs: each candidate token the argmax?
    grammar: Any = None  # this sequence's own llama_sampler (grammar state advances with its tokens)
    grammar_s: float = 0.0  # engine time spent on that grammar: held to the engine's GrammarBudget
    counts: dict[int, int] = field(default_factory=dict)  # generated tokens' counts, for the penalties
    d_pos: int = 0  # tokens of prompt + answer in the draft model's KV for this sequence
    draft: list[int] = field(default_factory=list)  # this step's drafted tokens
    draft_q: list[tuple[np.ndarray, np.ndarray] | None] = field(default_factory=list)  # sampled from (ids, probs)
    draft_source: str = ""
    # where in the rejected answer (job.reuse_tokens) the answer's next token is expected: while
    # the two agree it follows them; None once they part, until an n-gram finds the place again
    reuse_next: int | None = 0
    reuse_hint: int = 0  # where the last agreement ended: the search for the place starts there
    reuse_len: int = REUSE_FIRST_LEN  # the next rejected-answer draft's length (adapts to agreement)
    reuse_pause: int = 0  # steps left without rejected-answer drafts, after one was refused outright
    drafts: dict[str, list[int]] = field(default_factory=dict)  # source -> [drafted, accepted]

    @property
    def pos(self) -> int:
        return self.n_prefilled + len(self.generated)

    @property
    def prefilling(self) -> bool:
        return self.n_prefilled < len(self.job.prompt_tokens)


class ModelGuard:
    """Lets other threads make read-only native calls on the model (tokenizing) only while it is
    loaded: `use()` refuses once `close()` has begun, and `close()` returns when the last user has
    left, so the engine thread never frees a model that another thread is reading."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cv = threading.Condition()
        self._users = 0
        self._open = False

    def open(self) -> None:
        with self._cv:
            self._open = True

    @contextmanager
    def use(self) -> Iterator[None]:
        with self._cv:
            if not self._open:
                raise UnavailableError(f"tier '{self.name}' has no model loaded now; retry later", retry_after=5.0)
            self._users += 1
        try:
            yield
        finally:
            with self._cv:
                self._users -= 1
                self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._open = False
            self._cv.wait_for(lambda: self._users == 0)


State = Literal["new", "loading", "ready", "restarting", "failed", "stopped"]


class LlamaEngine:
    """Owns one llama.cpp model and context on a dedicated thread."""

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

    def _piece(self, token: int, *, special: bool = False) -> bytes:
        """A token's bytes. Engine thread only: it reuses one buffer instead of allocating per token."""
        import llama_cpp as lc

        buf = self._piece_buf
        n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            self._piece_buf = buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return bytes(buf.raw[: max(n, 0)])

    # ---- the engine thread -------------------------------------------------------------------

    def _load(self) -> None:
        import llama_cpp as lc

        _route_native_logs()
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
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
        running: list[_Seq] = []
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

    def _fail_one(self, job: Job, exc: Exception) -> None:
        """One sequence's own work failed: that request gets an error, the others carry on."""
        log.error("llama engine %s: a sequence failed", self.name, exc_info=exc)
        job.emit(ErrorEvent(ModelError(f"generation failed: {type(exc).__name__}")))
        job.cancelled = True

    def _admit(self, running: list[_Seq], free_ids: list[int], reserved: int) -> list[_Seq]:
        """Take newcomers from the queue (caller holds the lock) while a slot and their worst-case
        KV cells are free. A newcomer sharing a prompt prefix with a sequence still prefilling waits
        a step, so it can copy that KV instead of computing it again (self-consistency samples)."""
        admitted: list[_Seq] = []
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
                _common_prefix(job.prompt_tokens, o.job.prompt_tokens) > o.n_prefilled + PrefixCache.MIN
                and o.prefilling
                for o in running
            ) or any(_common_prefix(job.prompt_tokens, a.job.prompt_tokens) >= PrefixCache.MIN for a in admitted):
                deferred.append(job)
                continue
            seq = _Seq(job=job, seq_id=free_ids[-1 - len(admitted)], started=time.monotonic(), reserved=need)
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

    def _reuse_prefix(self, seq: _Seq, running: list[_Seq]) -> None:
        """Start a newcomer from the longest cached or running prompt prefix it shares."""
        import llama_cpp as lc

        prompt = seq.job.prompt_tokens
        sources = [(e.seq_id, e.tokens) for e in self.prefix.entries]
        sources += [(o.seq_id, o.job.prompt_tokens[: o.n_prefilled]) for o in running]
        best_id, best = -1, 0
        for sid, tokens in sources:
            n = _common_prefix(prompt, tokens)
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

    def _take_scored(self, seq: _Seq) -> bool:
        """Start a greedy newcomer whose rejected answer a scoring job already read from where that
        reading stopped agreeing: the answer begins with the rejected answer's tokens the scoring
        found to be the argmax (greedy decoding would have kept exactly those), their KV copied
        from the prefix cache, and only the last of them is read again, for the next token's
        logits. False, changing nothing, when the job is not such a one or the KV has been evicted;
        it then drafts from the rejected answer as usual."""
        import llama_cpp as lc

        job = seq.job
        if job.reuse_scored is None or not job.may_draft or job.temperature > 0.0 or job.top_logprobs:
            return False
        prompt = job.prompt_tokens
        agreed = min(len(job.reuse_scored), len(job.reuse_tokens), job.max_tokens - 1, self.n_ctx - len(prompt) - 2)
        if agreed < 1:
            # the first token is refused already: skip the draft that would find that out again
            seq.reuse_next, seq.reuse_pause = None, 1
            return False
        known = [*prompt, *job.reuse_tokens[:agreed]]
        shared = ((e.seq_id, _common_prefix(known, e.tokens)) for e in self.prefix.entries)
        sid, have = max(shared, key=lambda entry: entry[1], default=(-1, 0))
        if have < len(known) - 1:
            return False
        self.prefix.lookups += 1
        self.prefix.hits += 1
        self.prefix.tokens_saved += len(known) - 1
        self.prefix.touch(sid)
        lc.llama_memory_seq_cp(self._mem, sid, seq.seq_id, 0, len(known) - 1)
        seq.n_prefilled = len(prompt)
        seq.first_token_at = time.monotonic()
        # the token after them was refused by the scoring (unless the answer's length cut them short)
        refused = int(agreed == len(job.reuse_scored) < len(job.reuse_tokens))
        for c in (self.draft_counts["scored"], seq.drafts.setdefault("scored", [0, 0])):
            c[0] += agreed + refused
            c[1] += agreed
        # the rejected answer parts from the answer right after these: it drafts again only where
        # the answer's own tokens find their place in it (and not in the very next step)
        seq.reuse_next, seq.reuse_hint, seq.reuse_pause = None, agreed, 1
        for token, logprob in zip(job.reuse_tokens[:agreed], job.reuse_scored, strict=False):
            if not self._append(seq, token, logprob, None):
                break  # a stop string or the length ended the answer: released after admission
        return True

    def _release(self, seq: _Seq, running: list[_Seq], free_ids: list[int]) -> int:
        import llama_cpp as lc

        if not seq.prefilling and not seq.job.cancelled_by_caller:
            # of a scored candidate, only the start this model agrees with is kept (with the prompt
            # before it, which later requests share): the start of this model's own answer if the
            # candidate is rejected and escalates here (`_take_scored`)
            end = None if seq.job.score_from is None else seq.job.score_from + _leading(seq.top1)
            self.prefix.store(self._mem, seq.seq_id, seq.job.prompt_tokens[:end])
        lc.llama_memory_seq_rm(self._mem, seq.seq_id, -1, -1)
        if self._dmem is not None:
            lc.llama_memory_seq_rm(self._dmem, seq.seq_id, -1, -1)
        self._drop_grammar(seq)
        running.remove(seq)
        free_ids.append(seq.seq_id)
        seq.job.cancelled = True
        return seq.reserved

    def _step(self, running: Sequence[_Seq]) -> None:
        import llama_cpp as lc

        t0 = time.monotonic()
        batch = self._batch
        n = 0
        outputs: list[tuple[_Seq, int]] = []  # each sequence asking for logits, and its rows (1 + its draft)
        decoding = [seq for seq in running if not seq.prefilling]
        for seq in running:
            seq.draft, seq.draft_q, seq.draft_source = [], [], ""
        # drafts first, within what the batch holds after every decoding sequence's own token
        room = self.n_batch - len(decoding)
        by_model: list[_Seq] = []
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
            self._put(batch, n, seq.generated[-1], base, seq.seq_id, True)
            n += 1
            for i, token in enumerate(seq.draft):
                self._put(batch, n, token, base + 1 + i, seq.seq_id, True)
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
                self._put(batch, n, prompt[seq.n_prefilled + i], seq.n_prefilled + i, seq.seq_id, last)
                n += 1
            seq.n_prefilled += take
            if not seq.prefilling:
                # a rejected answer goes in right after the prompt's end: one pass reads both
                if seq.job.may_draft and self._take_reuse(seq, self.n_batch - n):
                    for i, token in enumerate(seq.draft):
                        self._put(batch, n, token, len(prompt) + i, seq.seq_id, True)
                        n += 1
                outputs.append((seq, 1 + len(seq.draft)))
        # scoring jobs last, so that their logits rows follow every generating sequence's
        scoring: list[tuple[_Seq, int, int]] = []  # (job, its first logits row, its rows)
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

    def _draft_cap(self, seq: _Seq) -> int:
        """Most tokens a draft may hold for `seq`: the tokens it keeps, with the one the target adds
        after them, stay within its max_tokens (the KV cells admission reserved) and the context."""
        return min(seq.job.max_tokens - len(seq.generated) - 1, self.n_ctx - seq.pos - 2)

    def _take_reuse(self, seq: _Seq, room: int) -> bool:
        """Draft from the rejected answer where the answer so far follows it, or where its last
        REUSE_NGRAM tokens appear in it again; False when neither holds."""
        reuse = seq.job.reuse_tokens
        if not reuse:
            return False
        if seq.reuse_pause > 0:
            seq.reuse_pause -= 1
            return False
        start = seq.reuse_next
        if start is None or start >= len(reuse):
            start = self._realign(seq)
        if start is None:
            return False
        cap = min(seq.reuse_len, room, self._draft_cap(seq), len(reuse) - start)
        if cap < 1:
            return False
        seq.reuse_next = start
        seq.draft = list(reuse[start : start + cap])
        seq.draft_q = [None] * cap
        seq.draft_source = "rejected"
        return True

    @staticmethod
    def _realign(seq: _Seq) -> int | None:
        """Where the rejected answer continues the answer's last REUSE_NGRAM tokens: the first such
        place from the last agreement on, else from its start; None when it nowhere does."""
        reuse, gen = seq.job.reuse_tokens, seq.generated
        if len(gen) < REUSE_NGRAM:
            return None
        tail = tuple(gen[-REUSE_NGRAM:])
        last = len(reuse) - REUSE_NGRAM  # a match must leave a token to draft
        for first in (seq.reuse_hint, 0):
            for j in range(first, last):
                if reuse[j : j + REUSE_NGRAM] == tail:
                    return j + REUSE_NGRAM
        return None

    @staticmethod
    def _tokens(seq: _Seq, start: int, stop: int) -> list[int]:
        """Tokens [start, stop) of the sequence's prompt followed by its answer."""
        prompt = seq.job.prompt_tokens
        cut = len(prompt)
        return prompt[start:stop] + seq.generated[max(0, start - cut) : max(0, stop - cut)]

    def _draft_by_model(self, seqs: list[_Seq], room: int) -> None:
        """Draft up to draft_max tokens for each of `seqs` with the draft model, all sequences in
        one draft decode per drafted position. The draft context first catches up with what the
        target kept since this sequence last drafted (its whole prompt, the first time)."""
        import llama_cpp as lc

        batch = self._dbatch
        n = 0
        active: list[tuple[_Seq, int]] = []  # (sequence, its draft's cap), in logits-row order
        for seq in seqs:
            cap = min(self.draft_max, self._draft_cap(seq), room)
            if cap < 1 or n >= self.n_batch:
                continue
            take = min(seq.pos - seq.d_pos, self.n_batch - n)
            for i, token in enumerate(self._tokens(seq, seq.d_pos, seq.d_pos + take)):
                self._put(batch, n, token, seq.d_pos + i, seq.seq_id, seq.d_pos + i == seq.pos - 1)
                n += 1
            seq.d_pos += take
            if seq.d_pos == seq.pos:
                active.append((seq, cap))
                room -= cap
        eog = self._eog_ids
        while n:
            batch.n_tokens = n
            rc = lc.llama_decode(self._dctx, batch)
            if rc != 0:
                raise ModelError(f"draft llama_decode returned {rc}")
            rows = np.ctypeslib.as_array(lc.llama_get_logits(self._dctx), shape=(len(active), self.n_vocab))
            n = 0
            going: list[tuple[_Seq, int]] = []
            for r, (seq, cap) in enumerate(active):
                row, job = rows[r], seq.job
                q: tuple[np.ndarray, np.ndarray] | None = None
                if job.temperature <= 0.0:
                    token = int(row.argmax())
                    if self.spec_cascade is not None:  # its rule reads q under greedy too (at temperature 1)
                        q = self._dist(row, 1.0, 1.0)
                    sure = 1.0 / float(np.exp(row - row[token]).sum())
                else:
                    q = self._dist(row, job.temperature, job.top_p)
                    sure = float(q[1][0])
                if sure < self.draft_p_min:  # likely refused: the target's own step is cheaper
                    continue
                if job.temperature > 0.0 and q is not None:
                    gen = seq.rng if seq.rng is not None else np.random.default_rng()
                    token = int(q[0][gen.choice(q[0].shape[0], p=q[1])])
                seq.draft.append(token)
                seq.draft_q.append(q)
                seq.draft_source = "model"
                if len(seq.draft) < cap and token not in eog:
                    self._put(batch, n, token, seq.d_pos, seq.seq_id, True)
                    seq.d_pos += 1
                    n += 1
                    going.append((seq, cap))
            active = going

    def _put_scoring(self, batch: Any, n: int, seq: _Seq) -> tuple[int, int]:
        """Put the next chunk of a scoring job into the batch, asking for logits only at the
        positions that predict a candidate token, at most SCORE_ROWS_PER_STEP of them; return the
        batch's new length and the rows asked for."""
        tokens = seq.job.prompt_tokens
        first = (seq.job.score_from or 1) - 1  # the position that predicts the first candidate token
        last = len(tokens) - 2  # the one that predicts the last: the last token itself predicts nothing
        start = seq.n_prefilled
        take = min(len(tokens) - start, self.n_batch - n, max(first, start) + SCORE_ROWS_PER_STEP - start)
        rows = 0
        for pos in range(start, start + take):
            want = first <= pos <= last
            self._put(batch, n, tokens[pos], pos, seq.seq_id, want)
            n += 1
            rows += want
        seq.n_prefilled += take
        return n, rows

    def _score(self, scoring: list[tuple[_Seq, int, int]], rows: np.ndarray) -> None:
        """Read each scoring job's rows: the next token's log-softmax and whether it is the argmax;
        a job whose candidate is all prefilled reports and leaves."""
        for seq, first_row, count in scoring:
            try:
                if count:
                    # rows are in position order; each predicts the next candidate token not yet scored
                    done = (seq.job.score_from or 0) + len(seq.logprobs)
                    targets = np.asarray(seq.job.prompt_tokens[done : done + count])
                    block = rows[first_row : first_row + count]
                    peak = block.max(axis=1)
                    lse = peak + np.log(np.exp(block - peak[:, None]).sum(axis=1))
                    picked = block[np.arange(count), targets]
                    seq.logprobs.extend(float(v) for v in picked - lse)
                    seq.top1.extend(bool(v) for v in block.argmax(axis=1) == targets)
                if not seq.prefilling:
                    seq.job.cancelled = True  # released by _serve after this step, its prompt cached
                    seq.job.emit(
                        ScoredEvent(
                            token_logprobs=tuple(seq.logprobs),
                            top1=tuple(seq.top1),
                            prompt_tokens=len(seq.job.prompt_tokens),
                            busy_s=seq.busy_s,
                            queued_s=seq.started - seq.job.submitted,
                        )
                    )
            except Exception as exc:  # noqa: BLE001 - this job's own work: fail it alone
                self._fail_one(seq.job, exc)

    @staticmethod
    def _put(batch: Any, i: int, token: int, pos: int, seq_id: int, logits: bool) -> None:
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq_id
        batch.logits[i] = 1 if logits else 0

    def _sample(self, outputs: list[tuple[_Seq, int]], rows: np.ndarray) -> None:
        import llama_cpp as lc

        now = time.monotonic()
        r = 0
        for seq, k in outputs:
            try:
                self._advance(seq, rows[r : r + k], now, lc)
            except Exception as exc:  # noqa: BLE001 - this sequence's own work: fail it alone
                self._fail_one(seq.job, exc)
            r += k

    def _advance(self, seq: _Seq, rows: np.ndarray, now: float, lc: Any) -> None:
        """Take the sequence's next tokens from its logits rows: row i checks draft token i (kept or
        replaced by the rejection rule; greedy: kept when it is the argmax), and the row after the
        last kept draft token gives one more token of the target's own. Without a draft: one token.
        Then drop the refused draft positions from both KV caches."""
        job, draft = seq.job, seq.draft
        base = seq.pos  # where the first draft token (or the next token) sits
        start = len(seq.generated)
        accepted = 0
        # counted as they are decided, before the tokens are taken: a DoneEvent sent while taking them reports them
        counts = (self.draft_counts[seq.draft_source], seq.drafts.setdefault(seq.draft_source, [0, 0])) if draft else ()
        for c in counts:
            c[0] += len(draft)
        for i in range(len(draft) + 1):
            row = rows[i]
            if i < len(draft):
                x = draft[i]
                if self._cascade_keeps(seq, i, row):
                    kept, token = True, x
                    for c in counts:  # moved from the draft model's count to the rule's
                        c[0] -= 1
                    for c in self._cascade_counts(seq):
                        c[0] += 1
                        c[1] += 1
                    accepted += 1
                    if not self._take(seq, token, row, now, lc):
                        break
                    continue
                if job.temperature <= 0.0:
                    best = int(row.argmax())
                    kept, token = best == x, best
                else:
                    gen = seq.rng if seq.rng is not None else np.random.default_rng()
                    kept, token = speculative_accept(
                        self._dist(row, job.temperature, job.top_p), seq.draft_q[i], x, gen
                    )
                accepted += kept
                for c in counts:
                    c[1] += kept
                if not self._take(seq, token, row, now, lc) or not kept:
                    break
            else:
                shaped = self._reshaped(seq, row) if job.reshapes_logits else row
                chosen: int | None = self._pick(shaped, job, seq.rng)
                if seq.grammar is not None and chosen is not None:
                    chosen = self._constrained(seq, shaped, chosen)
                self._take(seq, chosen, row, now, lc)
        if job.reuse_tokens and seq.reuse_next is not None:
            new = tuple(seq.generated[start:])
            at = seq.reuse_next
            seq.reuse_next = at + len(new) if new == job.reuse_tokens[at : at + len(new)] else None
            seq.reuse_hint = max(seq.reuse_hint, at + accepted if seq.draft_source == "rejected" else at)
        if seq.draft_source == "rejected":
            if accepted == len(draft):
                seq.reuse_len = min(REUSE_ROWS_PER_STEP, 2 * seq.reuse_len)
            else:
                seq.reuse_len = max(REUSE_MIN_LEN, accepted)
                seq.reuse_pause = REUSE_PAUSE_STEPS if accepted == 0 else 0
        if not draft:
            return
        if job.cancelled:  # finished inside the draft: the whole sequence is released after this step
            return
        # a KV cache that cannot drop the refused positions would verify later drafts against them
        if not lc.llama_memory_seq_rm(self._mem, seq.seq_id, base + accepted, -1):
            raise ModelError("the KV cache could not drop refused draft positions")
        if self._dmem is not None and seq.d_pos > base + accepted:
            seq.d_pos = base + accepted
            if not lc.llama_memory_seq_rm(self._dmem, seq.seq_id, seq.d_pos, -1):
                raise ModelError("the draft model's KV cache could not drop refused draft positions")

    def _cascade_keeps(self, seq: _Seq, i: int, row: np.ndarray) -> bool:
        """Whether the speculative cascade keeps draft token i unchecked: only the draft model's
        tokens (a rejected answer's have no q), with p read from the target's row as q was read
        from the draft model's (the job's sampling distribution, or temperature 1 under greedy)."""
        q = seq.draft_q[i] if self.spec_cascade is not None and seq.draft_source == "model" else None
        if q is None or self.spec_cascade is None:
            return False
        job = seq.job
        p = self._dist(row, job.temperature, job.top_p) if job.temperature > 0.0 else self._dist(row, 1.0, 1.0)
        rule, margin = self.spec_cascade
        return not cascade_defers(rule, margin, p, q)

    def _cascade_counts(self, seq: _Seq) -> tuple[list[int], list[int]]:
        return self.draft_counts["cascade"], seq.drafts.setdefault("cascade", [0, 0])

    def _take(self, seq: _Seq, token: int | None, row: np.ndarray, now: float, lc: Any) -> bool:
        """Append one chosen token, emit or finish; whether the sequence goes on."""
        job = seq.job
        if seq.first_token_at is None:
            seq.first_token_at = now
        if token is None:  # the grammar allows nothing at all: end here, the verifier judges what there is
            self._finish(seq, "stop")
            return False
        if lc.llama_vocab_is_eog(self._vocab, token):
            self._finish(seq, "stop")
            return False
        if seq.grammar is not None:
            t0 = time.perf_counter()
            lc.llama_sampler_accept(seq.grammar, token)
            spent = time.perf_counter() - t0
            self.grammar_s += spent
            seq.grammar_s += spent
        if job.presence_penalty or job.frequency_penalty:
            seq.counts[token] = seq.counts.get(token, 0) + 1
        # log-softmax normaliser of the model's own row (T=1): logprobs are the model's, whatever sampled
        peak = row.max()
        lse = peak + np.log(np.exp(row - peak).sum())
        logprob = float(row[token] - lse)
        top = self._top(row, lse, self._piece(token), logprob, job.top_logprobs) if job.top_logprobs else None
        return self._append(seq, token, logprob, top)

    def _append(self, seq: _Seq, token: int, logprob: float, top: TokenLogprob | None) -> bool:
        """Add a token the answer takes (its logprob known) to the text, emit or finish; whether
        the sequence goes on."""
        job = seq.job
        seq.generated.append(token)
        seq.logprobs.append(logprob)
        self.tokens_out += 1
        seq.text += seq.decoder.decode(self._piece(token))
        if top is not None:
            seq.tops.append(top)
        if self._check_stop(seq):
            return False
        if len(seq.generated) >= job.max_tokens or seq.pos + 1 >= self.n_ctx:
            self._finish(seq, "length")
            return False
        self._emit_safe(seq)
        return True

    def _pick(self, row: np.ndarray, job: Job, rng: np.random.Generator | None) -> int:
        if job.temperature <= 0.0:
            return int(row.argmax())
        return self._sample_row(row, job.temperature, job.top_p, rng)

    def _reshaped(self, seq: _Seq, row: np.ndarray) -> np.ndarray:
        """The row with the job's logit_bias and penalties applied, as OpenAI applies them: a
        copy, so logprobs stay the model's own."""
        job = seq.job
        out = row.copy()
        for token, bias in job.logit_bias:
            out[token] += bias
        if seq.counts:
            ids = np.fromiter(seq.counts.keys(), dtype=np.int64, count=len(seq.counts))
            counts = np.fromiter(seq.counts.values(), dtype=np.float32, count=len(seq.counts))
            out[ids] -= job.presence_penalty + job.frequency_penalty * counts
        return out

    def _constrained(self, seq: _Seq, row: np.ndarray, token: int) -> int | None:
        """The token to take under the sequence's grammar. The one sampled freely is kept when the
        grammar allows it: the common case costs one token's check, not the vocabulary's. Else the
        choice is made again among the likeliest tokens the grammar allows, and only when it
        allows none of those among the whole vocabulary. Sampling, checking and sampling again
        from what is allowed draws from the constrained distribution itself."""
        t0 = time.perf_counter()
        self.grammar_tokens += 1
        try:
            if self._allowed(seq.grammar, np.asarray([token]), row[[token]]).size:
                return token
            allowed = np.zeros(0, dtype=np.int64)
            for k in GRAMMAR_CANDIDATES:
                if k >= row.shape[0]:
                    break
                ids = np.union1d(np.argpartition(row, -k)[-k:], self._eog_ids)
                allowed = self._allowed(seq.grammar, ids, row[ids])
                if allowed.size:
                    break
            if not allowed.size:
                self.grammar_full_scans += 1
                allowed = self._allowed(seq.grammar, np.arange(row.shape[0]), row)
            if not allowed.size:
                self.grammar_dead_ends += 1
                return None
            return int(allowed[self._pick(row[allowed], seq.job, seq.rng)])
        finally:
            spent = time.perf_counter() - t0
            self.grammar_s += spent
            seq.grammar_s += spent

    def _allowed(self, grammar: Any, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """Those of `ids` the grammar allows next (llama.cpp sets the others' logits to -inf)."""
        import llama_cpp as lc

        n = ids.shape[0]
        view = self._cand_view
        view["id"][:n] = ids
        view["logit"][:n] = 0.0  # any finite value: only whether it stays finite is read
        array = lc.llama_token_data_array(
            data=ctypes.cast(self._cand, ctypes.POINTER(lc.llama_token_data)), size=n, selected=-1, sorted=False
        )
        lc.llama_sampler_apply(grammar, ctypes.byref(array))
        allowed: np.ndarray = ids[np.isfinite(view["logit"][:n])]
        return allowed

    def _attach_grammar(self, seq: _Seq) -> bool:
        """Give a newcomer its own grammar state, cloned from the parsed prototype; False (and the
        job failed alone, as a bad request) when llama.cpp refuses the grammar."""
        import llama_cpp as lc

        gbnf = seq.job.grammar
        assert gbnf is not None
        t0 = time.perf_counter()
        proto = self._grammars.get(gbnf)
        if proto is None:
            proto = lc.llama_sampler_init_grammar(self._vocab, gbnf.encode(), b"root")
            if not proto:
                seq.job.emit(ErrorEvent(RequestError("the response format's grammar was refused by llama.cpp")))
                seq.job.cancelled = True
                return False
            self._grammars[gbnf] = proto
            while len(self._grammars) > GRAMMAR_PROTOTYPES:
                lc.llama_sampler_free(self._grammars.popitem(last=False)[1])
        self._grammars.move_to_end(gbnf)
        seq.grammar = lc.llama_sampler_clone(proto)
        seq.grammar_s += time.perf_counter() - t0  # parsing and cloning advance the first parse stacks
        return True

    @staticmethod
    def _drop_grammar(seq: _Seq) -> None:
        import llama_cpp as lc

        if seq.grammar is not None:
            lc.llama_sampler_free(seq.grammar)
            seq.grammar = None

    def _top(self, row: np.ndarray, lse: Any, piece: bytes, logprob: float, k: int) -> TokenLogprob:
        """The sampled token and the k likeliest at its position, under the model's own
        distribution (T=1, as the sampled token's logprob), most likely first."""
        k = min(k, row.shape[0])
        best = np.argpartition(row, -k)[-k:]
        best = best[np.argsort(-row[best], kind="stable")]
        alternatives = tuple((self._piece(int(t)).decode("utf-8", errors="replace"), float(row[t] - lse)) for t in best)
        return TokenLogprob(piece.decode("utf-8", errors="replace"), logprob, alternatives)

    @staticmethod
    def _sample_row(row: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator | None) -> int:
        top, probs = LlamaEngine._dist(row, temperature, top_p)
        gen = rng if rng is not None else np.random.default_rng()
        return int(top[gen.choice(len(top), p=probs)])

    @staticmethod
    def _dist(row: np.ndarray, temperature: float, top_p: float) -> tuple[np.ndarray, np.ndarray]:
        """The distribution a token is sampled from: (ids, probs), likeliest first."""
        # restrict to the top candidates first: a full-vocabulary sort per token is wasteful
        k = min(64, row.shape[0])
        top = np.argpartition(row, -k)[-k:]
        logits = row[top].astype(np.float64)
        order = np.argsort(-logits)
        top, logits = top[order], logits[order]
        # shift before scaling: every exponent is <= 0 whatever the temperature, so none overflows
        probs = np.exp((logits - logits[0]) / temperature)
        probs /= probs.sum()
        if top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
            top, probs = top[:keep], probs[:keep] / probs[:keep].sum()
        return top, probs

    def _check_stop(self, seq: _Seq) -> bool:
        stops = seq.job.stop
        if not stops:
            return False
        longest = max(len(s) for s in stops)
        window_start = max(0, seq.emitted - longest)
        hits = [i for i in (seq.text.find(s, window_start) for s in stops) if i >= 0]
        if not hits:
            return False
        seq.text = seq.text[: min(hits)]
        self._finish(seq, "stop")
        return True

    def _emit_safe(self, seq: _Seq) -> None:
        hold = max((len(s) for s in seq.job.stop), default=1) - 1
        safe = len(seq.text) - hold
        if safe > seq.emitted:
            seq.job.emit(TokenEvent(seq.text[seq.emitted : safe], len(seq.generated), seq.busy_s, self._unsent(seq)))
            seq.emitted = safe

    @staticmethod
    def _unsent(seq: _Seq) -> tuple[TokenLogprob, ...]:
        """The tokens not yet sent with an event: a stream's pieces carry their own tokens."""
        if seq.tops_sent == len(seq.tops):
            return ()
        unsent = tuple(seq.tops[seq.tops_sent :])
        seq.tops_sent = len(seq.tops)
        return unsent

    def _finish(self, seq: _Seq, reason: str) -> None:
        # mark the slot for release before the caller can hear of it: a caller that closes its
        # stream on the DoneEvent must not look like one that walked away (its prompt is cached)
        seq.job.cancelled = True
        seq.text += seq.decoder.decode(b"", final=True)
        if len(seq.text) > seq.emitted:
            seq.job.emit(TokenEvent(seq.text[seq.emitted :], len(seq.generated), seq.busy_s, self._unsent(seq)))
            seq.emitted = len(seq.text)
        seq.job.emit(
            DoneEvent(
                text=seq.text,
                finish_reason=reason,
                prompt_tokens=len(seq.job.prompt_tokens),
                completion_tokens=len(seq.generated),
                token_logprobs=tuple(seq.logprobs),
                ttft_s=(seq.first_token_at - seq.job.submitted) if seq.first_token_at else None,
                busy_s=seq.busy_s,
                queued_s=seq.started - seq.job.submitted,
                top_logprobs=tuple(seq.tops) if seq.job.top_logprobs else None,
                drafts=tuple((source, c[0], c[1]) for source, c in seq.drafts.items()),
            )
        )


def _leading(flags: Sequence[bool]) -> int:
    """How many of `flags` hold before the first that does not."""
    for i, flag in enumerate(flags):
        if not flag:
            return i
    return len(flags)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class _CacheEntry:
    seq_id: int
    tokens: list[int]
    used: float


class PrefixCache:
    """Prompt KV kept after a sequence leaves, under spare sequence ids, reused by newcomers that
    share a prefix (system prompts, few-shot examples, tool lists). Engine thread only."""

    MIN = 16  # shorter shared prefixes are not worth a lookup

    def __init__(self, first_id: int, slots: int) -> None:
        self.slots = slots
        self.first_id = first_id
        self.free = list(range(first_id + slots - 1, first_id - 1, -1))
        self.entries: list[_CacheEntry] = []
        self.lookups = 0
        self.hits = 0
        self.tokens_saved = 0

    @property
    def cells(self) -> int:
        return sum(len(e.tokens) for e in self.entries)

    def clear(self) -> None:
        """Forget every entry (their KV went with a freed context); the counters stay."""
        self.free = list(range(self.first_id + self.slots - 1, self.first_id - 1, -1))
        self.entries = []

    def touch(self, seq_id: int) -> None:
        for e in self.entries:
            if e.seq_id == seq_id:
                e.used = time.monotonic()

    def store(self, mem: Any, src_seq: int, tokens: list[int]) -> None:
        import llama_cpp as lc

        if self.slots == 0 or len(tokens) < self.MIN:
            return
        for e in list(self.entries):
            if _common_prefix(e.tokens, tokens) == len(e.tokens):  # an older, shorter copy
                self._drop(mem, e)
            elif _common_prefix(e.tokens, tokens) == len(tokens):  # already covered
                e.used = time.monotonic()
                return
        if not self.free:
            self._drop(mem, min(self.entries, key=lambda e: e.used))
        sid = self.free.pop()
        lc.llama_memory_seq_cp(mem, src_seq, sid, 0, len(tokens))
        self.entries.append(_CacheEntry(sid, list(tokens), time.monotonic()))

    def evict_until(self, mem: Any, cells: int) -> None:
        freed = 0
        for e in sorted(self.entries, key=lambda e: e.used):
            if freed >= cells:
                break
            freed += len(e.tokens)
            self._drop(mem, e)

    def _drop(self, mem: Any, entry: _CacheEntry) -> None:
        import llama_cpp as lc

        lc.llama_memory_seq_rm(mem, entry.seq_id, -1, -1)
        self.entries.remove(entry)
        self.free.append(entry.seq_id)
