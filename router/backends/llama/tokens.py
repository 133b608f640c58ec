"""Taking a sequence's tokens from its logits rows: verifying its draft, appending, stop strings,
and the events its caller hears.

The per-token path after a decode step: `_advance` judges each drafted token (`drafting`,
`spec_cascade`) and chooses the next one (`sampling`, `grammar`), `_take` and `_append` add it to
the answer, and `_finish` sends the `DoneEvent`. An error here is this sequence's own: it fails
that request alone (`_fail_one`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from router.backends.llama.drafting import REUSE_MIN_LEN, REUSE_PAUSE_STEPS, REUSE_ROWS_PER_STEP, speculative_accept
from router.backends.llama.grammar import GrammarConstraint
from router.backends.llama.jobs import DoneEvent, ErrorEvent, Job, Seq, TokenEvent
from router.backends.llama.spec_cascade import CascadeRule
from router.errors import ModelError
from router.generation import TokenLogprob

# the engine's logger: what its thread logs reads under one name, whichever part logged it
log = logging.getLogger("router.backends.llama.engine")


class TokenTaking(GrammarConstraint, CascadeRule):
    """From logits rows to the answer's text and events: `LlamaEngine`'s per-token methods."""

    name: str
    n_ctx: int
    tokens_out: int
    _mem: Any
    _dmem: Any

    def _fail_one(self, job: Job, exc: Exception) -> None:
        """One sequence's own work failed: that request gets an error, the others carry on."""
        log.error("llama engine %s: a sequence failed", self.name, exc_info=exc)
        job.emit(ErrorEvent(ModelError(f"generation failed: {type(exc).__name__}")))
        job.cancelled = True

    def _sample(self, outputs: list[tuple[Seq, int]], rows: np.ndarray) -> None:
        import llama_cpp as lc

        now = time.monotonic()
        r = 0
        for seq, k in outputs:
            try:
                self._advance(seq, rows[r : r + k], now, lc)
            except Exception as exc:  # noqa: BLE001 - this sequence's own work: fail it alone
                self._fail_one(seq.job, exc)
            r += k

    def _advance(self, seq: Seq, rows: np.ndarray, now: float, lc: Any) -> None:
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

    def _take(self, seq: Seq, token: int | None, row: np.ndarray, now: float, lc: Any) -> bool:
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

    def _append(self, seq: Seq, token: int, logprob: float, top: TokenLogprob | None) -> bool:
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

    def _check_stop(self, seq: Seq) -> bool:
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

    def _emit_safe(self, seq: Seq) -> None:
        hold = max((len(s) for s in seq.job.stop), default=1) - 1
        safe = len(seq.text) - hold
        if safe > seq.emitted:
            seq.job.emit(TokenEvent(seq.text[seq.emitted : safe], len(seq.generated), seq.busy_s, self._unsent(seq)))
            seq.emitted = safe

    @staticmethod
    def _unsent(seq: Seq) -> tuple[TokenLogprob, ...]:
        """The tokens not yet sent with an event: a stream's pieces carry their own tokens."""
        if seq.tops_sent == len(seq.tops):
            return ()
        unsent = tuple(seq.tops[seq.tops_sent :])
        seq.tops_sent = len(seq.tops)
        return unsent

    def _finish(self, seq: Seq, reason: str) -> None:
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
