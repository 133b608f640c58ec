"""Signs that an answer went wrong, whatever the task: loops, truncation, refusals, emptiness, a
switch of language.

The other verifiers ask whether an answer is right for its task (a number, a passing test, a
confident model). This one asks only whether the text is the kind a model writes when it has gone
off the rails, so it applies to every request, open-ended chat included, where no task-specific
check exists. Small models fail in recognisable ways: they loop (the same words, line or sentence
again and again, often until the token cap), stop at the cap mid-sentence, refuse, answer
nothing, or answer in another script than the question's (a Latin-script question answered in
Chinese).

Each sign found lowers the score by its penalty (the penalties multiply); 1.0 means no sign was
found. What counts as a loop is a stretch where a unit of words repeats verbatim several times in
a row: "the the the ...", a sentence or paragraph written again and again. Numbers are compared
as they are, so counting ("1, 2, 3, 4, ...") is not a loop, but the same line under a
growing counter ("25. Calculate the total ...", "26. Calculate the total ...") is caught by the
line check, which ignores a line's list number. A question that asks for a translation or names
a language is exempt from the script check. Every answer has text to look at, so the verifier
never abstains.

The work is linear in the text times the longest loop unit tried (``loop_max_period`` tokens),
on at most the last ``max_chars`` characters: about a millisecond for a 512-token answer.

Params: ``penalties`` (a table sign = penalty in [0, 1] for any of the signs in SIGNS; 0 turns a
check off, e.g. ``{truncated = 0}`` for a tier whose answers are often cut on purpose), the loop
thresholds ``loop_min_copies``, ``loop_min_tokens``, ``loop_long_tokens``, ``loop_max_period``,
the line thresholds ``line_max_repeats``, ``line_min_words``, ``script_min_share`` and
``max_chars``. The defaults were chosen by reading the committed runs' loops
(scripts/degeneration_auroc.py measures them there).
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from router.generation import Generation, GenerationRequest
from verifiers.base import Score, VerifierContext, require_integers

SIGNS = ("empty", "refusal", "loop", "repeated_line", "truncated", "script")
DEFAULT_PENALTIES: dict[str, float] = {
    "empty": 1.0,  # nothing to accept
    "refusal": 0.9,
    "loop": 0.8,
    "repeated_line": 0.6,
    "truncated": 0.5,  # a cut answer may still hold what was asked (code before a cut example)
    "script": 0.8,
}

# Han and kana are written without spaces: one character is one token, as a word is elsewhere
_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|\w+|[^\w\s]")
_HAS_LETTER = re.compile(r"[^\W\d_]")
_SEGMENT_SPLIT = re.compile(r"\n+|(?<=[.!?])\s+")
_LIST_MARKER = re.compile(r"^\s*(?:[-*•>]+|\(?\d+[.):]|#+|step\s+\d+\s*[:.)]?)\s*", re.IGNORECASE)
_REFUSAL_WINDOW = 300  # a refusal opens the answer; deep inside reasoning the same words are not one
_REFUSAL = re.compile(
    r"""\bas\s+an?\s+(?:ai|artificial\s+intelligence|(?:ai\s+)?language\s+model)\b
      | \bI(?:['’]m|\s+am)\s+(?:sorry|afraid)\b[^.!?\n]{0,80}?\b(?:can(?:not|['’]t)|unable|not\s+able|won['’]t)\b
      | (?:^|[.!?]\s+)I\s+(?:can(?:not|['’]t)|won['’]t|will\s+not
                         |am\s+(?:not\s+able|unable)|['’]m\s+(?:not\s+able|unable))
        \s+(?:to\s+)?(?:help|assist|provide|answer|comply|fulfil+|create|write|generate|do\s+that|support)\b
    """,
    re.IGNORECASE | re.VERBOSE,
)

# Unicode blocks of the scripts a question and its answer are told apart by. Letters outside them
# count as "other"; only letters are classified (digits, punctuation and symbols say nothing).
_SCRIPT_RANGES: tuple[tuple[int, int, str], ...] = (
    (0x0041, 0x024F, "Latin"),
    (0x0370, 0x03FF, "Greek"),
    (0x0400, 0x052F, "Cyrillic"),
    (0x0530, 0x058F, "Armenian"),
    (0x0590, 0x05FF, "Hebrew"),
    (0x0600, 0x06FF, "Arabic"),
    (0x0750, 0x077F, "Arabic"),
    (0x0900, 0x097F, "Devanagari"),
    (0x0980, 0x09FF, "Bengali"),
    (0x0E00, 0x0E7F, "Thai"),
    (0x10A0, 0x10FF, "Georgian"),
    (0x1100, 0x11FF, "Hangul"),
    (0x1E00, 0x1EFF, "Latin"),
    (0x1F00, 0x1FFF, "Greek"),
    (0x3040, 0x30FF, "Kana"),
    (0x3130, 0x318F, "Hangul"),
    (0x3400, 0x4DBF, "Han"),
    (0x4E00, 0x9FFF, "Han"),
    (0xAC00, 0xD7AF, "Hangul"),
    (0xF900, 0xFAFF, "Han"),
    (0xFF21, 0xFF5A, "Latin"),  # fullwidth Latin letters
    (0xFF66, 0xFF9F, "Kana"),  # halfwidth katakana
    (0x20000, 0x3134F, "Han"),
)
_SCRIPT_STARTS = [start for start, _, _ in _SCRIPT_RANGES]
# a question that asks for another language wants an answer in another script
_ASKS_FOR_LANGUAGE = re.compile(
    r"\btranslat|\b(?:in|into|to)\s+(?:chinese|mandarin|cantonese|japanese|korean|russian|ukrainian|greek|arabic|"
    r"hebrew|hindi|bengali|thai|georgian|armenian|persian|farsi|urdu|bulgarian|serbian|english|french|german|spanish|"
    r"italian|portuguese|dutch|latin|pinyin|romaji)\b",
    re.IGNORECASE,
)
_QUESTION_SCRIPT_SHARE = 0.05  # a script is the question's when at least this share of its letters
_MIN_SCRIPT_LETTERS = 10  # fewer letters than this in the answer say nothing about its language


def script_of(ch: str) -> str:
    """The script of one letter, by Unicode block ("other" outside the blocks listed)."""
    cp = ord(ch)
    i = bisect.bisect_right(_SCRIPT_STARTS, cp) - 1
    if i >= 0:
        start, end, name = _SCRIPT_RANGES[i]
        if start <= cp <= end:
            return name
    return "other"


def script_counts(text: str) -> Counter[str]:
    return Counter(script_of(ch) for ch in text if ch.isalpha())


@dataclass(frozen=True)
class Loop:
    """A stretch of tokens where a unit of ``period`` tokens repeats verbatim, back to back."""

    period: int
    start: int  # token index where the stretch begins
    tokens: int  # the stretch's length in tokens
    unit: str

    @property
    def copies(self) -> float:
        return self.tokens / self.period

    @property
    def repeated(self) -> int:
        """Tokens that repeat what came just before them (all but the first copy)."""
        return self.tokens - self.period


def find_loops(tokens: list[str], max_period: int, min_copies: float) -> tuple[Loop | None, Loop | None]:
    """Two stretches of ``tokens`` where a unit (up to ``max_period`` tokens, with a word in it)
    repeats back to back: the one with the most repeated tokens among those of at least
    ``min_copies`` copies (a short loop), and the one with the most repeated tokens of all (a
    paragraph written twice). Either is None when there is none."""
    ids: dict[str, int] = {}
    seq = [ids.setdefault(t, len(ids)) for t in tokens]
    n = len(seq)
    looping: Loop | None = None
    longest: Loop | None = None
    for p in range(1, min(max_period, n // 2) + 1):
        run = 0
        for i in range(n - p + 1):
            if i < n - p and seq[i] == seq[i + p]:
                run += 1
                continue
            # a run of r matches at distance p is a stretch of r + p tokens: (r + p) / p copies
            if run and (run > (longest.repeated if longest else 0) or run + p >= min_copies * p):
                unit = tokens[i - run : i - run + p]
                if any(_HAS_LETTER.search(t) for t in unit):  # not "0, 0, 0" or "| --- | --- |"
                    loop = Loop(p, i - run, run + p, " ".join(unit))
                    if longest is None or run > longest.repeated:
                        longest = loop
                    if loop.copies >= min_copies and (looping is None or run > looping.repeated):
                        looping = loop
            run = 0
    return looping, longest


def most_repeated_line(text: str, min_words: int) -> tuple[str, int]:
    """The line or sentence (of at least ``min_words`` words, list numbering ignored) written
    most often, and how often; ("", 0) when none is that long."""
    counts: Counter[str] = Counter()
    for segment in _SEGMENT_SPLIT.split(text):
        norm = " ".join(_LIST_MARKER.sub("", segment).lower().split())
        if len(_TOKEN.findall(norm)) >= min_words and _HAS_LETTER.search(norm):
            counts[norm] += 1
    if not counts:
        return "", 0
    line, count = counts.most_common(1)[0]
    return line, count


def question_text(request: GenerationRequest) -> str:
    if request.messages is not None:
        return "\n".join(m.content for m in request.messages if m.role == "user")
    return request.prompt or ""


@dataclass(frozen=True)
class DegenerationVerifier:
    """Task-agnostic signs of a bad answer; see the module docstring. Each sign's penalty (0 turns
    that check off) multiplies the score by (1 - penalty)."""

    penalties: dict[str, float] = field(default_factory=dict)
    loop_min_copies: float = 3.0  # a unit repeated this many times in a row ...
    loop_min_tokens: int = 24  # ... over at least this many tokens is a loop
    loop_long_tokens: int = 80  # and so is this many tokens written again right after themselves
    loop_max_period: int = 256  # the longest unit tried, in tokens (a paragraph)
    line_max_repeats: int = 3  # the same line or sentence more often than this is a loop
    line_min_words: int = 5  # shorter lines ("\\]", "return False") repeat in good answers
    script_min_share: float = 0.5  # the share of the answer's letters in a script the question lacks
    max_chars: int = 8_000  # only the last this many characters are searched for loops (about 2,000 tokens)
    name: str = "degeneration"
    _penalty: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.penalties, dict):
            raise TypeError("penalties must be a table of sign = penalty")
        unknown = set(self.penalties) - set(SIGNS)
        if unknown:
            raise TypeError(f"penalties: unknown sign(s) {sorted(unknown)}; known: {', '.join(SIGNS)}")
        merged = {**DEFAULT_PENALTIES, **self.penalties}
        for sign, value in merged.items():
            _check_fraction(f"penalties.{sign}", value)
        object.__setattr__(self, "_penalty", merged)
        _check_number("loop_min_copies", self.loop_min_copies, minimum=2.0)
        integers = (
            ("loop_min_tokens", 2),
            ("loop_long_tokens", 2),
            ("loop_max_period", 1),
            ("line_max_repeats", 1),
            ("line_min_words", 1),
            ("max_chars", 100),
        )
        for key, minimum in integers:
            require_integers(self, key)
            if getattr(self, key) < minimum:
                raise ValueError(f"{key} must be at least {minimum}")
        _check_fraction("script_min_share", self.script_min_share)
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        found, details = self.inspect(question_text(request), candidate.text, candidate.finish_reason)
        details["signs"] = list(found)
        value = 1.0
        for sign in found:
            value *= 1.0 - self._penalty[sign]
        if not found:
            return Score(1.0, "no sign of degeneration", details)
        return Score(max(0.0, min(1.0, value)), "; ".join(found.values()), details)

    def inspect(self, question: str, text: str, finish_reason: str) -> tuple[dict[str, str], dict[str, Any]]:
        """The signs found in ``text`` (sign -> what was seen) and every measurement taken."""
        on = {sign for sign, penalty in self._penalty.items() if penalty > 0}
        found: dict[str, str] = {}
        details: dict[str, Any] = {"chars": len(text), "finish_reason": finish_reason}

        alnum = sum(ch.isalnum() for ch in text[: self.max_chars])
        details["alnum_chars"] = alnum
        if "empty" in on and alnum == 0:
            found["empty"] = "empty answer"
            return found, details  # nothing else to look at

        if "truncated" in on and finish_reason == "length":
            found["truncated"] = "cut off at the token limit"

        if "refusal" in on:
            m = _REFUSAL.search(text.lstrip()[:_REFUSAL_WINDOW])
            if m is not None:
                details["refusal"] = m.group(0).strip()
                found["refusal"] = f"a refusal ({details['refusal'][:40]!r})"

        window = text[-self.max_chars :]
        if "loop" in on:
            tokens = _TOKEN.findall(window)
            details["tokens"] = len(tokens)
            looping, longest = find_loops(tokens, self.loop_max_period, self.loop_min_copies)
            for key, loop in (("loop", looping), ("longest_repeat", longest)):
                if loop is not None:
                    details[key] = {
                        "period": loop.period,
                        "copies": round(loop.copies, 2),
                        "tokens": loop.tokens,
                        "at_end": loop.start + loop.tokens == len(tokens),
                        "unit": loop.unit[:120],
                    }
            if looping is not None and looping.tokens >= self.loop_min_tokens:
                found["loop"] = f"a loop: {looping.unit[:40]!r} x{looping.copies:.1f}"
            elif longest is not None and longest.repeated >= self.loop_long_tokens:
                found["loop"] = f"{longest.repeated} tokens written twice: {longest.unit[:40]!r}"

        if "repeated_line" in on:
            line, count = most_repeated_line(window, self.line_min_words)
            details["line_repeats"] = count
            if count > self.line_max_repeats:
                details["repeated_line"] = line[:120]
                found["repeated_line"] = f"a line written {count} times: {line[:40]!r}"

        if "script" in on and _ASKS_FOR_LANGUAGE.search(question[-self.max_chars :]) is None:
            asked, said = script_counts(question[-self.max_chars :]), script_counts(text[: self.max_chars])
            asked_total, said_total = sum(asked.values()), sum(said.values())
            if asked_total and said_total >= _MIN_SCRIPT_LETTERS:
                own = {s for s, c in asked.items() if c >= _QUESTION_SCRIPT_SHARE * asked_total}
                foreign = sum(c for s, c in said.items() if s not in own)
                share = foreign / said_total
                details["scripts"] = {"question": sorted(own), "answer": dict(said.most_common(3))}
                details["foreign_script_share"] = round(share, 3)
                if share >= self.script_min_share and share > 0:
                    top = max((s for s in said if s not in own), key=lambda s: said[s])
                    found["script"] = f"{share:.0%} of the answer in {top}, not the question's {'/'.join(sorted(own))}"
        return found, details


def _check_fraction(key: str, value: Any) -> None:
    _check_number(key, value, minimum=0.0)
    if value > 1.0:
        raise ValueError(f"{key} must be in [0, 1]")


def _check_number(key: str, value: Any, *, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{key} must be a number")
    if not value >= minimum:  # also refuses NaN
        raise ValueError(f"{key} must be at least {minimum}")


def make_degeneration(params: dict[str, Any], ctx: VerifierContext) -> DegenerationVerifier:
    return DegenerationVerifier(**params)
