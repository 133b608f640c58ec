"""Whether a tier's accepted answer and a larger tier's answer to the same request agree.

Shadow escalation (`router.quality.shadow`) uses agreement with the larger tier as its stand-in for
"right": production traffic has no reference answers. What counts as agreeing depends on the
task, so a rule is chosen by the request's task (`router.tasks`):

- `maths`: the final numbers agree (the extractor graders and the `math_answer` verifier use);
- `choice`: the same option letter (the MMLU grader's extraction);
- `code`: where the caller sent tests (only a key allowed to may, see `router.admission.auth`), both
  answers run them in the sandbox and agree when the same tests pass; without tests, text;
- anything else, and any task whose rule cannot read both answers: normalised text similarity
  (below).

The task rules read answers with the graders' and verifiers' extractors, which live in packages
the core does not import; they are plugins, registered per task name through the entry-point
group ``tierroute.agreement`` (the built-ins by `evals.agreement_rules`), exactly as verifiers are. The
text rule is the core's own and always there, so a shadow pair is always judged.

The text rule: both answers case-folded, whitespace collapsed and the punctuation around words
stripped, and their first `_MAX_TEXT` characters compared; they agree when their similarity,
2 * (characters of their longest common subsequence) / (total characters), is at least
`TEXT_THRESHOLD` = 0.8. Long free-form answers from two models rarely reach it even when both are
right, so an open-ended tier's agreement rate is a lower bound on its accuracy; the report says so.

The subsequence is measured bit-parallel (Hyyroe's algorithm: one pass over one text, a few integer
operations on a bit per character of the other), so a comparison takes milliseconds whatever the
texts are, and it runs on a worker thread, never on the event loop. difflib's ratio, used before,
is the same kind of number (its matching blocks are a common subsequence, so it is never larger)
but its time depends on the texts: two 4,000-character answers of repeated short words took
seconds, and "a a a ..." against "a  a  a ..." twelve minutes.
"""

from __future__ import annotations

import asyncio
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from router.generation import GenerationRequest
from router.plugins import Registry

AGREEMENT = "tierroute.agreement"
TEXT_THRESHOLD = 0.8
_MAX_TEXT = 4000  # characters compared: longer answers rarely reach the threshold anyway


@dataclass(frozen=True)
class Agreement:
    agree: bool
    rule: str  # number | choice | code_tests | text
    detail: str  # why, in a few words
    answer: str | None  # the accepted answer's extracted form
    shadow: str | None  # the shadow answer's extracted form


class AgreementRule(Protocol):
    """Compare two answers to `request` for one task; None when the rule cannot read them (no
    number in either, no option letter, no tests to run): the text rule decides then."""

    async def __call__(self, request: GenerationRequest, answer: str, shadow: str) -> Agreement | None: ...


RegisterRule = Callable[[str, AgreementRule], None]


class AgreementRegistry(Registry[AgreementRule]):
    """Agreement rules by task name."""

    kind = "agreement rule"

    @classmethod
    def from_entry_points(cls) -> AgreementRegistry:
        reg = cls()
        reg.load(AGREEMENT)
        return reg

    async def compare(self, task: str | None, request: GenerationRequest, answer: str, shadow: str) -> Agreement:
        if task is not None and task in self:
            found = await self.get(task)(request, answer, shadow)
            if found is not None:
                return found
        return await asyncio.to_thread(text_agreement, answer, shadow)


_PUNCT = string.punctuation  # ASCII only, as before


def normalise(text: str) -> str:
    """Case-folded, whitespace collapsed, punctuation around words stripped."""
    # each word stripped on its own: a regex over the whole text took time quadratic in a run of
    # punctuation inside a word (26 s for 40,000 characters of it)
    words = (word.strip(_PUNCT) for word in text.casefold().split())
    return " ".join(word for word in words if word)


def common_subsequence(a: str, b: str) -> int:
    """The length of the longest common subsequence of `a` and `b` (Hyyroe 2004, bit-parallel):
    bit j of `v` is 0 where the LCS of the text read so far and b[:j+1] gains a character."""
    if len(a) < len(b):
        a, b = b, a
    masks: dict[str, int] = {}
    bit = 1
    for ch in b:
        masks[ch] = masks.get(ch, 0) | bit
        bit <<= 1
    full = bit - 1
    v = full
    for ch in a:
        m = masks.get(ch)
        if m is not None:
            u = v & m
            v = ((v + u) | (v - u)) & full
    return len(b) - v.bit_count()


def similarity(a: str, b: str) -> float:
    """2 * LCS / total characters: 1.0 for equal texts, 0.0 for texts with no character in common."""
    if a == b:
        return 1.0
    return 2 * common_subsequence(a, b) / (len(a) + len(b))


def text_agreement(answer: str, shadow: str, threshold: float = TEXT_THRESHOLD) -> Agreement:
    a, b = normalise(answer)[:_MAX_TEXT], normalise(shadow)[:_MAX_TEXT]
    ratio = similarity(a, b)
    agree = ratio >= threshold
    detail = f"similarity {ratio:.2f} {'>=' if agree else '<'} {threshold:.2f}"
    return Agreement(agree, "text", detail, a[:200], b[:200])
