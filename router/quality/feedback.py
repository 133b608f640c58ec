"""Feedback as ground truth: what the labels a client posts (POST /v1/feedback) say about its answers.

Shadow agreement (`router.quality.shadow`) is a proxy for correctness; the application often knows
the real thing (the user clicked thumbs-down, the tests passed, the extracted JSON was accepted).
A label carries a score in [0, 1] or a boolean (stored as 1 or 0). This module is the one place
that says what labels mean, so the report (`router.reports.quality`), the live drift detector
(`router.quality.shadow`) and the eval import (`evals.importer`) read them alike:

- a label says the answer was right when its score is at least `RIGHT_AT` (0.5): a boolean reads
  as itself, a graded score as the nearer end;
- a request may be labelled several times (a thumbs-up corrected later); every label is kept,
  and the request's verdict is its latest one (by the time the service received it);
- a label is about the answer the client received: the request's final tier, at the threshold
  and task that tier answered under (`answered`). Only requests to `auto` whose answer was
  verified count per threshold: a tier named by the client, or an answer returned unverified
  because the next tier was down, passed no threshold;
- the drift detector counts each request once, with its first label: a CUSUM cannot take an
  observation back, and a client relabelling one request many times must not move it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from router.config import SHADOW_KEY
from router.ledger.entries import Feedback, LedgerEntry

RIGHT_AT = 0.5  # a label's score at or above this says the answer was right


def is_right(score: float) -> bool:
    return score >= RIGHT_AT


@dataclass(frozen=True)
class Verdict:
    """A request's labels, folded: the latest decides; the first is what drift saw."""

    request_id: str
    right: bool  # the latest label's
    score: float  # the latest label's score
    labels: int  # how many the request has
    ts: float  # when the latest was received
    first_right: bool
    first_ts: float


def verdicts(labels: Iterable[Feedback]) -> dict[str, Verdict]:
    """Each labelled request's verdict, from its labels in the order the store returns them
    (oldest first)."""
    out: dict[str, Verdict] = {}
    for fb in sorted(labels, key=lambda f: (f.ts, f.feedback_id)):
        before = out.get(fb.request_id)
        out[fb.request_id] = Verdict(
            request_id=fb.request_id,
            right=is_right(fb.score),
            score=fb.score,
            labels=1 if before is None else before.labels + 1,
            ts=fb.ts,
            first_right=is_right(fb.score) if before is None else before.first_right,
            first_ts=fb.ts if before is None else before.first_ts,
        )
    return out


@dataclass(frozen=True)
class Answered:
    """What a label is about: the tier that gave the client its answer, the threshold it passed,
    and the request's task."""

    tier: str
    threshold: float
    task: str


def answered(entry: LedgerEntry) -> Answered | None:
    """The answer a request's labels judge, or None when it passed no threshold (a named tier, an
    unverified answer, shadow work)."""
    if entry.model != "auto" or entry.unverified or entry.key_id == SHADOW_KEY:
        return None
    final = [a for a in entry.attempts if a.tier == entry.tier and a.decision == "accepted"]
    if not final:
        return None
    return Answered(entry.tier, final[-1].threshold, entry.task or "open_ended")
