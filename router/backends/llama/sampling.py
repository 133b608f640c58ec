"""Sampling one sequence's token from its logits row, with its own parameters.

Logprobs come from the logits rows we already have: the log-softmax at the sampled token. This
avoids `logits_all=True`, which computes vocabulary logits for every prompt token. A job that asks
for `top_logprobs` alternatives gets them from the same row and normaliser (one partial sort of
the row per token); a job that does not pays nothing for it.

`logit_bias` and the presence and frequency penalties reshape a copy of the row (`_reshaped`), so
logprobs stay the model's own. `Sampling` is a part of `LlamaEngine` (its methods run on the
engine thread, per token): the attributes declared here are the engine's, set when it loads.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from router.backends.llama.jobs import Job, Seq
from router.generation import TokenLogprob


class Sampling:
    """Token choice and the model's own logprobs: `LlamaEngine`'s sampling methods."""

    _vocab: Any
    _piece_buf: Any

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

    def _pick(self, row: np.ndarray, job: Job, rng: np.random.Generator | None) -> int:
        if job.temperature <= 0.0:
            return int(row.argmax())
        return self._sample_row(row, job.temperature, job.top_p, rng)

    def _reshaped(self, seq: Seq, row: np.ndarray) -> np.ndarray:
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
        top, probs = Sampling._dist(row, temperature, top_p)
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
