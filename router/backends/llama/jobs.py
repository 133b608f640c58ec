"""What callers hand the engine (`Job`), what they hear back (the events), and the engine's own
record of a running sequence (`Seq`).

Kept apart from the loop so the backend can build jobs and read events without the engine's
internals, and so every part of the engine shares one definition of a sequence's state.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from router.generation import TokenLogprob

# The first rejected-answer draft's length, doubled after each draft kept whole (up to
# REUSE_ROWS_PER_STEP): an answer the model disagrees with from its first token costs a 17-token
# pass, not a 65-token one, and one it agrees with is still read in a few steps.
REUSE_FIRST_LEN = 16


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
    # whose prompt KV this job may start from, and whose it leaves behind: KV is copied only between
    # jobs of one tenant, kept or running (the request's tenant under the tier's prefix_cache_scope;
    # "" for the service's own work). A prefix reused answers sooner, so across tenants it would
    # tell one whether another had sent a prompt that starts as a guess of it does.
    tenant: str = ""

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
class Seq:
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


State = Literal["new", "loading", "ready", "restarting", "failed", "stopped"]


def put(batch: Any, i: int, token: int, pos: int, seq_id: int, logits: bool) -> None:
    """Fill slot i of a llama_batch with one token of one sequence (and whether to compute its logits)."""
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = seq_id
    batch.logits[i] = 1 if logits else 0
