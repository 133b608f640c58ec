"""Feedback as ground truth: what the labels a client posts (POST /v1/feedback) say about its answers.

Shadow agreement (`router.quality.shadow`) is a proxy for correctness; the application often knows
the real thing (the user clicked thumbs-down, the tests passed, the extracted JSON was accepted).
A label carries a score in [0, 1] or a boolean (stored as 1 or 0). This module is the one place
that says what labels mean, so the report (`router.reports.quality`), the live drift detector
(`router.quality.shadow`) and the eval import (`evals.importer`) read them alike:

- a label says the answer was right when its score is at least `RIGHT_AT` (0.5): a boolean reads
  as itself, a graded score as the nearer end;
- a request may be labelled several times (a thumbs-up corrected later), by the key that made it
  and by admin reviewers; every label is kept with who gave it (`Feedback.role`). The request's
  verdict is its latest **admin** label where it has one, whatever came after, and its latest
  label otherwise: a client cannot overrule a reviewer by labelling last (a label whose role was
  not recorded, posted before roles were, reads as a client's);
- a label is about the answer the client received: the request's final tier, at the threshold
  and task that tier answered under (`answered`). Only requests to `auto` whose answer was
  verified count per threshold: a tier named by the client, or an answer returned unverified
  because the next tier was down, passed no threshold;
- the drift detector counts each request once, with its first label: a CUSUM cannot take an
  observation back, and a client relabelling one request many times must not move it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from router.config import SHADOW_KEY
from router.ledger.entries import Feedback, LedgerEntry

RIGHT_AT = 0.5  # a label's score at or above this says the answer was right


def is_right(score: float) -> bool:
    return score >= RIGHT_AT


ADMIN = "admin"  # a label posted by a key with the admin role: a reviewer's
CLIENT = "client"  # a label posted by the key that made the request


def reviewed(label: Feedback) -> bool:
    """Whether an admin reviewer gave the label (as recorded when it was posted)."""
    return label.role == ADMIN


@dataclass(frozen=True)
class Verdict:
    """A request's labels, folded: the latest admin label decides, else the latest; the first is
    what drift saw."""

    request_id: str
    right: bool  # the deciding label's
    score: float  # the deciding label's score
    labels: int  # how many the request has
    ts: float  # when the deciding label was received
    first_right: bool
    first_ts: float
    by: str = ""  # the name of the key whose label decides
    reviewed: bool = False  # an admin reviewer's label decides


def verdicts(labels: Iterable[Feedback]) -> dict[str, Verdict]:
    """Each labelled request's verdict, from its labels (in any order: they are read by the
    time the service received them)."""
    out: dict[str, Verdict] = {}
    for fb in sorted(labels, key=lambda f: (f.ts, f.feedback_id)):
        before = out.get(fb.request_id)
        right = is_right(fb.score)
        if before is None:
            out[fb.request_id] = Verdict(
                fb.request_id, right, fb.score, 1, fb.ts, right, fb.ts, fb.key_id, reviewed(fb)
            )
        elif reviewed(fb) or not before.reviewed:  # a client's label never replaces a reviewer's
            out[fb.request_id] = replace(
                before,
                right=right,
                score=fb.score,
                labels=before.labels + 1,
                ts=fb.ts,
                by=fb.key_id,
                reviewed=reviewed(fb),
            )
        else:
            out[fb.request_id] = replace(before, labels=before.labels + 1)
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
