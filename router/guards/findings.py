"""What a detector finds: a kind of data and where it is, and the one way its text is named outside
the request, a keyed digest.

A finding lives as long as its request. What leaves the request (the `tierroute` object, /metrics,
the ledger's notes, logs) names a finding by its kind, its count and `digest`: an HMAC under a key
drawn when the process starts and never written anywhere, so a phone number's digest cannot be
reversed by trying every phone number, and two requests of one process carrying the same card can
still be told apart from two carrying different ones.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Protocol

_KEY = secrets.token_bytes(32)  # per process, never stored: digests mean nothing outside it


@dataclass(frozen=True)
class Finding:
    """`kind` (an entity kind: "EMAIL_ADDRESS", "AWS_ACCESS_KEY", "JUDGE_OVERRIDE") found at
    text[start:end] of the text the detector was given, with the detector's confidence."""

    kind: str
    start: int
    end: int
    score: float = 1.0

    def overlaps(self, other: Finding) -> bool:
        return self.start < other.end and other.start < self.end


class Detector(Protocol):
    """One method: the findings in a text. `kinds` is what it can find."""

    kinds: frozenset[str]

    def detect(self, text: str) -> list[Finding]: ...


def digest(text: str) -> str:
    """A short keyed digest of a found span: the only form in which its text leaves the request."""
    return hmac.new(_KEY, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:16]


def merged(findings: list[Finding]) -> list[Finding]:
    """Findings without overlaps, in order: of two that overlap the longer stays (the higher score
    on a tie), so a card number is not also redacted as the phone number inside it."""
    ordered = sorted(findings, key=lambda f: (-(f.end - f.start), -f.score, f.start))
    kept: list[Finding] = []
    for f in ordered:
        if not any(f.overlaps(k) for k in kept):
            kept.append(f)
    return sorted(kept, key=lambda f: f.start)
