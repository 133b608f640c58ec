"""Scoring jobs: another tier's candidate answer read by this model, and that reading reused.

A scoring job (`Job.score_from` set) is another tier's candidate answer read by this model: its
prompt is the rendered request followed by the candidate's tokens, prefilled like any prompt but
with logits asked for only where they predict a candidate token (at most `SCORE_ROWS_PER_STEP` rows
a step, so one long answer never makes a step's output buffer vocabulary-times-hundreds wide). It
reports each candidate token's log-softmax and whether it was the argmax, and ends without decoding
(`ScoredEvent`): the verification pass of speculative decoding.

One prefill, two uses. When this engine has already scored the rejected answer (a `cross_tier`
verifier's scoring job; `Job.reuse_scored`), that pass has verified it as a draft: a greedy job
starts with the answer's tokens that were the argmax there, their KV copied from the prefix cache
(a scoring job leaves prompt + that agreed start there), and reads only the last of them again
(draft source "scored"). Sampling needs the whole distribution at each position, and
`top_logprobs` the alternatives, which a scoring pass does not keep: such jobs, and any whose KV
was evicted, draft from the answer as usual (`drafting`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from router.backends.llama.jobs import ScoredEvent, Seq, put
from router.backends.llama.prefix_cache import PrefixCache, common_prefix
from router.backends.llama.tokens import TokenTaking

# Logits rows a scoring job may ask for in one decode step (each is a vocabulary of floats).
SCORE_ROWS_PER_STEP = 64


class Scoring(TokenTaking):
    """Scoring jobs' prefill and results, and the greedy start they allow: `LlamaEngine`'s scoring methods."""

    n_batch: int
    prefix: PrefixCache

    def _take_scored(self, seq: Seq) -> bool:
        """Start a greedy newcomer whose rejected answer a scoring job already read from where that
        reading stopped agreeing: the answer begins with the rejected answer's tokens the scoring
        found to be the argmax (greedy decoding would have kept exactly those), their KV copied
        from the prefix cache (the job's own tenant's entries), and only the last of them is read
        again, for the next token's logits. False, changing nothing, when the job is not such a one
        or the KV has been evicted; it then drafts from the rejected answer as usual."""
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
        shared = ((e.seq_id, common_prefix(known, e.tokens)) for e in self.prefix.of(job.tenant))
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

    def _put_scoring(self, batch: Any, n: int, seq: Seq) -> tuple[int, int]:
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
            put(batch, n, tokens[pos], pos, seq.seq_id, want)
            n += 1
            rows += want
        seq.n_prefilled += take
        return n, rows

    def _score(self, scoring: list[tuple[Seq, int, int]], rows: np.ndarray) -> None:
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
