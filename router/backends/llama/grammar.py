"""Grammar constraints: a sequence with a GBNF grammar (from a response_format) takes only tokens
it allows.

A job with a grammar (`Job.grammar`) gets its own llama.cpp grammar sampler, cloned from a parsed
prototype kept per grammar, and advanced with each token it takes: constrained and free sequences
share every decode step. The token is first chosen as for a free sequence and kept when the
grammar allows it, which costs a check of one token; only when it does not is the choice made
again among the likeliest `GRAMMAR_CANDIDATES` the grammar allows, and only when it allows none of
those among the whole vocabulary (a 151k-token scan, rare). The end token is allowed only where
the grammar is complete. `logit_bias` and the penalties reshape the row before any of this
(`sampling`). Grammar time is summed per sequence and held to `grammar_budget`
(router.backends.grammar_budget) by the engine's loop: a sequence past it is ended alone, as a bad
request.
"""

from __future__ import annotations

import ctypes
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from router.backends.llama.jobs import ErrorEvent, Seq
from router.backends.llama.sampling import Sampling
from router.errors import RequestError

# A constrained sequence whose sampled token the grammar refuses is offered its likeliest tokens
# next, this many and then this many (with the end tokens, which a finished answer needs however
# unlikely the model finds them); only when the grammar refuses all of them is the whole
# vocabulary checked (about 55 ms for Qwen's 151,936 tokens, against 0.02 ms for 256).
GRAMMAR_CANDIDATES = (256, 8192)
# Parsed grammars kept on the engine thread, cloned per sequence (parsing a schema's grammar
# costs far more than cloning it).
GRAMMAR_PROTOTYPES = 32


class GrammarConstraint(Sampling):
    """Per-sequence grammar state and the constrained choice: `LlamaEngine`'s grammar methods."""

    _grammars: OrderedDict[str, Any]  # GBNF -> parsed prototype; engine thread
    _cand: Any
    _cand_view: Any
    _eog_ids: np.ndarray
    grammar_s: float
    grammar_tokens: int
    grammar_full_scans: int
    grammar_dead_ends: int

    def _constrained(self, seq: Seq, row: np.ndarray, token: int) -> int | None:
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

    def _attach_grammar(self, seq: Seq) -> bool:
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
    def _drop_grammar(seq: Seq) -> None:
        import llama_cpp as lc

        if seq.grammar is not None:
            lc.llama_sampler_free(seq.grammar)
            seq.grammar = None
