"""The speculative cascade (`spec_cascade`, a research mode, off by default).

It loosens speculative decoding's check (`drafting`) for the draft model's tokens: at each drafted
position a deferral rule (`cascade_defers`) compares the draft model's distribution q with the
target's p and either keeps the token unchecked (the output follows q there) or defers, and the
position is judged as usual. Positions nothing was drafted for (the token after a draft, or where
drafting stopped) are the target's own. The answer is then a mix of the two models: neither
greedy-identical to the target nor distributed as its samples. Its own module so the exact mode's
code reads without it.
"""

from __future__ import annotations

import numpy as np

from router.backends.llama.jobs import Seq
from router.backends.llama.sampling import Sampling

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


class CascadeRule(Sampling):
    """Whether the cascade keeps a drafted token unchecked: `LlamaEngine`'s cascade methods."""

    # (rule, margin) of the speculative cascade (`cascade_defers`); None: exact speculative decoding
    spec_cascade: tuple[str, float] | None
    draft_counts: dict[str, list[int]]

    def _cascade_keeps(self, seq: Seq, i: int, row: np.ndarray) -> bool:
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

    def _cascade_counts(self, seq: Seq) -> tuple[list[int], list[int]]:
        return self.draft_counts["cascade"], seq.drafts.setdefault("cascade", [0, 0])
