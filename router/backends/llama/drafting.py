"""Speculative decoding: drafts a sequence's next tokens, for one decode step to verify together.

Decode time is almost all inside `llama_decode`, and a step reading k+1 tokens of one sequence
costs little more than a step reading one, so a sequence may put a draft of k tokens after its
last one and have every position's logits back from the same step. Drafts come from a draft model
of the same vocabulary (`draft_model_path`: a second context on the same thread, sequence ids
shared with the target's, one draft decode per drafted position for all drafting sequences
together, and its KV caught up lazily with what the target kept), or from a lower tier's rejected
answer (`Job.reuse_tokens`), whose first chunk goes into the very step that ends the prompt's
prefill. Row i of a sequence judges draft token i (`tokens`): under greedy it is kept when it is
the argmax (so the answer is token for token the plain one), under sampling by the standard
rejection rule (`speculative_accept`: the answer's distribution is the target's own); the row
after the last kept token gives one token more. Refused positions leave both KV caches
(`llama_memory_seq_rm`). Jobs with a grammar, `logit_bias` or penalties do not draft: their
target distribution is a reshaped row, which the simple rule would have to re-derive per position
(with grammar state advanced speculatively), for the rare request that asks for both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from router.backends.llama.jobs import Seq, put
from router.backends.llama.sampling import Sampling
from router.errors import ModelError

# Tokens of a rejected answer verified per sequence in one step: each is a logits row of the
# vocabulary, so a 300-token answer is read in a few steps rather than one very wide output buffer.
REUSE_ROWS_PER_STEP = 64
# After the answer leaves the rejected answer (a reworded first sentence, say), the rejected answer
# drafts again from where its text shows the answer's last this-many tokens (prompt lookup). A
# draft refused in part is followed by a shorter one (verifying k tokens on a CPU costs about
# k/4 single steps here, so long wrong drafts are not free); one refused outright pauses reuse.
# (The first draft's length, REUSE_FIRST_LEN, is a sequence's starting state: `jobs`.)
REUSE_NGRAM = 3
REUSE_MIN_LEN = 4
REUSE_PAUSE_STEPS = 8


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


class Drafting(Sampling):
    """Drafts from a rejected answer or the draft model: `LlamaEngine`'s drafting methods."""

    _dbatch: Any
    _dctx: Any
    _eog_ids: np.ndarray
    draft_max: int
    draft_p_min: float
    n_batch: int
    n_ctx: int
    n_vocab: int
    spec_cascade: tuple[str, float] | None

    def _draft_cap(self, seq: Seq) -> int:
        """Most tokens a draft may hold for `seq`: the tokens it keeps, with the one the target adds
        after them, stay within its max_tokens (the KV cells admission reserved) and the context."""
        return min(seq.job.max_tokens - len(seq.generated) - 1, self.n_ctx - seq.pos - 2)

    def _take_reuse(self, seq: Seq, room: int) -> bool:
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
    def _realign(seq: Seq) -> int | None:
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
    def _tokens(seq: Seq, start: int, stop: int) -> list[int]:
        """Tokens [start, stop) of the sequence's prompt followed by its answer."""
        prompt = seq.job.prompt_tokens
        cut = len(prompt)
        return prompt[start:stop] + seq.generated[max(0, start - cut) : max(0, stop - cut)]

    def _draft_by_model(self, seqs: list[Seq], room: int) -> None:
        """Draft up to draft_max tokens for each of `seqs` with the draft model, all sequences in
        one draft decode per drafted position. The draft context first catches up with what the
        target kept since this sequence last drafted (its whole prompt, the first time)."""
        import llama_cpp as lc

        batch = self._dbatch
        n = 0
        active: list[tuple[Seq, int]] = []  # (sequence, its draft's cap), in logits-row order
        for seq in seqs:
            cap = min(self.draft_max, self._draft_cap(seq), room)
            if cap < 1 or n >= self.n_batch:
                continue
            take = min(seq.pos - seq.d_pos, self.n_batch - n)
            for i, token in enumerate(self._tokens(seq, seq.d_pos, seq.d_pos + take)):
                put(batch, n, token, seq.d_pos + i, seq.seq_id, seq.d_pos + i == seq.pos - 1)
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
            going: list[tuple[Seq, int]] = []
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
                    put(batch, n, token, seq.d_pos, seq.seq_id, True)
                    seq.d_pos += 1
                    n += 1
                    going.append((seq, cap))
            active = going
