"""Find the final answer of a worked maths solution, and read it as a number.

`extract_answer` and `parse_number` are pure functions the GSM8K suite also grades with; the
`math_answer` verifier only asks whether a numeric final answer is there at all.

Which marker wins when an answer has several, strongest first:

1. ``\\boxed{...}``: the last one (reasoning may box intermediate results before the final one);
2. ``#### N``, the GSM8K convention: the first one (it closes the solution; whatever follows
   is a small model running on into an invented next question);
3. ``Answer: ...`` / ``Final answer: ...``: the last one;
4. ``the answer is ...``: the last one;
5. only when asked (``fallback_last_number=True``): the last number in the text, which is how
   lenient GSM8K graders read answers without a marker.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from router.generation import Generation, GenerationRequest
from verifiers.base import Score, VerifierContext

_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_LABEL = re.compile(
    r"(?:^|[^\w])(?:final\s+answer|answer)\s*(?:\*\*|__)?\s*[:：]\s*(?:\*\*|__)?[ \t]*([^\n]*)", re.IGNORECASE
)
_ANSWER_IS = re.compile(r"\banswer\s+is\s*[:：]?[ \t]*([^\n]*)", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?=\s|$)|\s+(?:because|since|which|so|and\s+that)\b", re.IGNORECASE)
_LAST_NUMBER = re.compile(r"-?[$€£]?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"[{}]")

_NUMBER = re.compile(
    r"""^(?P<sign>[-+])?\s*(?P<cur>[$€£¥])?\s*(?P<sign2>[-+])?\s*
    (?:
        (?P<whole>\d+)\s+(?P<mnum>\d+)\s*/\s*(?P<mden>\d+)                 # mixed number: 1 3/4
      | (?P<num>\d+(?:\.\d+)?)\s*/\s*(?P<den>\d+(?:\.\d+)?)               # fraction: 3/4
      | (?P<dec>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?     # 1,234.5  12  1.5e3
              |\.\d+(?:[eE][-+]?\d+)?)                                    # .5
    )
    \s*(?:%|percent\b)?
    (?P<unit>(?:\s*[^\W\d_][^\s\d]*){0,4})                               # up to four unit words
    \s*[.;,]?$""",
    re.VERBOSE,
)
# one number standing alone in a sentence: not glued to a letter, another digit, or a sign or
# hyphen that would make it part of a word or an expression ("5th", "x-5", "a 5-year-old")
_SENTENCE_NUMBER = re.compile(
    r"(?<![\w.,/\-])[-+]?[$€£¥]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?%?(?![\w/\-]|[.,]\d)"
)
# what may surround it: words and the punctuation of prose, nothing that makes it an expression
_SENTENCE_REST = re.compile(r"[^\W\d_]|[\s.,;:!?'\"’‘“”()–—&]")
_WORD_HYPHEN = re.compile(r"(?<=[^\W\d_])-(?=[^\W\d_])")  # "well-known"; any other hyphen is a minus
_SENTENCE_MAX_WORDS = 25
_LEADING_WORDS = re.compile(r"^(?:approximately|approx\.?|about|around|roughly|≈|~)\s*")
_LATEX_FRAC = re.compile(r"(-?)\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")


def extract_answer(text: str, *, fallback_last_number: bool = False) -> str | None:
    """The final answer a solution states, as a cleaned string, or None when it states none."""
    found = _find_answer(text or "", fallback_last_number)
    return found[0] if found else None


def parse_number(s: str | None) -> float | None:
    """Read an answer string as a number, or None when it is not one.

    Accepts thousands commas (1,234.5), currency signs ($12, -$5, $-5), percentages (25% reads
    as 25, the way GSM8K states them), fractions (3/4, mixed 1 3/4, LaTeX \\frac{3}{4}), signs,
    decimals (.5, 2.), scientific notation, the last side of an equation ("x = 5", "10 + 8 = 18"),
    a leading "about", LaTeX wrappers and math
    delimiters, markdown emphasis, and up to four trailing unit words ("18 eggs", "5 km/h").
    Failing all that, a short sentence with exactly one number in it reads as that number
    ("Each child got 5 books.": a final answer stated in words around it).
    Rejects anything with a second number in it ("3 apples and 4 pears"), words for numbers,
    numbers inside words or expressions ("5th", "x + 5"), and ambiguous separators ("1,23").
    """
    if s is None:
        return None
    t = _normalise(s)
    m = _NUMBER.match(t)
    if m is None:
        sentence = _sentence_number(t)
        m = None if sentence is None else _NUMBER.match(sentence)
        if m is None:
            return None
    if m.group("sign") and m.group("sign2"):
        return None
    negative = "-" in ((m.group("sign") or "") + (m.group("sign2") or ""))
    try:
        if m.group("whole") is not None:
            den = int(m.group("mden"))
            value = int(m.group("whole")) + int(m.group("mnum")) / den
        elif m.group("num") is not None:
            value = float(m.group("num")) / float(m.group("den"))
        else:
            value = float(m.group("dec").replace(",", ""))
    except (ZeroDivisionError, ValueError, OverflowError):
        return None
    if not math.isfinite(value):
        return None
    return -value if negative else value


def _sentence_number(t: str) -> str | None:
    """The one number of a short sentence ("Each child got 5 books"), or None when the sentence
    has no number, several, or symbols that make it an expression rather than prose."""
    if len(t.split()) > _SENTENCE_MAX_WORDS:
        return None
    found = list(_SENTENCE_NUMBER.finditer(t))
    if len(found) != 1:
        return None
    m = found[0]
    rest = _WORD_HYPHEN.sub("", t[: m.start()] + " " + t[m.end() :])
    if any(_SENTENCE_REST.fullmatch(ch) is None for ch in rest):
        return None  # a digit left over (a second number) or a symbol of maths or markup
    return m.group(0)


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (as a string `parse_number` reads), or None: how a
    lenient grader reads an answer without a marker, and how the `execution` verifier reads what
    a program printed."""
    numbers = _LAST_NUMBER.findall(text or "")
    return _clean(numbers[-1]) if numbers else None


def numbers_equal(a: float | None, b: float | None, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Whether two parsed answers are the same number (None equals nothing)."""
    if a is None or b is None:
        return False
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)


def answers_agree(a: str | None, b: str | None) -> bool:
    """Whether two extracted answers say the same thing: as numbers when both read as numbers,
    otherwise as text with case, spacing and surrounding punctuation ignored."""
    if a is None or b is None:
        return False
    x, y = parse_number(a), parse_number(b)
    if x is not None and y is not None:
        return numbers_equal(x, y)
    if (x is None) != (y is None):
        return False
    return _fold(a) == _fold(b)


def _find_answer(text: str, fallback_last_number: bool) -> tuple[str, str] | None:
    boxed = _last_boxed(text)
    if boxed is not None:
        cleaned = _clean(boxed)
        if cleaned:
            return cleaned, "boxed"
    m = _HASHES.search(text)
    if m is not None:
        cleaned = _clean(m.group(1))
        if cleaned:
            return cleaned, "####"
    for marker, pattern in (("answer:", _ANSWER_LABEL), ("answer is", _ANSWER_IS)):
        for m in reversed(list(pattern.finditer(text))):
            cleaned = _clean(_first_clause(m.group(1)))
            if cleaned:
                return cleaned, marker
    if fallback_last_number:
        number = last_number(text)
        if number is not None:
            return number, "last number"
    return None


def _last_boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}``, braces balanced; None if there is none.

    Every brace is paired in one pass, so an answer that opens thousands of boxes it never closes
    (a loop) costs a pass over its text, not one per box."""
    opened = [m.end() - 1 for m in _BOXED.finditer(text)]  # the position of each box's "{"
    if not opened:
        return None
    closing: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE.finditer(text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            closing[stack.pop()] = m.start()
    for brace in reversed(opened):
        end = closing.get(brace)
        if end is not None:
            return text[brace + 1 : end]
    return None


def _first_clause(s: str) -> str:
    # "The answer is 42 because ..." -> "42"; "the answer is 3.5." -> "3.5"; the inner
    # "answer is" of "Final Answer: The final answer is $18$. I hope it is correct." -> "$18$"
    inner = _ANSWER_IS.search(s)
    if inner is not None:
        s = inner.group(1)
    m = _SENTENCE_END.search(s)
    return s[: m.start()] if m else s


def _clean(s: str) -> str:
    s = s.strip()
    boxed = _last_boxed(s)
    if boxed is not None:
        s = boxed
    for _ in range(3):
        before = s
        s = s.strip().strip("*_`").strip()
        for left, right in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
                s = s[len(left) : len(s) - len(right)]
        s = s.rstrip(".,;:!").strip()
        if s == before:
            break
    return s


def _normalise(s: str) -> str:
    t = _clean(s)
    t = t.replace("\u2212", "-").replace("\u2013", "-")
    t = t.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", " ").replace("{,}", ",")
    t = t.replace("\\%", "%").replace("\\$", "$").replace("\\left", "").replace("\\right", "")
    for _ in range(2):
        t = _LATEX_WRAPPERS.sub(r" \1", t)
    t = _LATEX_FRAC.sub(r"\1\2/\3", t)
    t = t.rsplit("=", 1)[-1]  # "x = 5", "10 + 8 = 18": the value is what comes last
    t = _clean(t)  # delimiters exposed by the substitutions above
    return _LEADING_WORDS.sub("", t).strip()


def _fold(s: str) -> str:
    return " ".join(_normalise(s).lower().split()).strip(".,;:!\"'")


@dataclass(frozen=True)
class MathAnswerVerifier:
    """1 when the candidate states a numeric final answer, ``non_numeric`` when it states one
    that is not a number, 0 when it states none. It cannot know whether the answer is right."""

    non_numeric: float = 0.3
    fallback_last_number: bool = False
    name: str = "math_answer"

    def __post_init__(self) -> None:
        if isinstance(self.non_numeric, bool) or not isinstance(self.non_numeric, int | float):
            raise TypeError("non_numeric must be a number")
        if not 0.0 <= self.non_numeric <= 1.0:
            raise ValueError("non_numeric must be in [0, 1]")
        if not isinstance(self.fallback_last_number, bool):
            raise TypeError("fallback_last_number must be true or false")

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        found = _find_answer(candidate.text, self.fallback_last_number)
        if found is None:
            return Score(0.0, "no final answer found (\\boxed{}, ####, 'Answer:', 'the answer is')")
        answer, marker = found
        number = parse_number(answer)
        details: dict[str, Any] = {"answer": answer, "marker": marker, "number": number}
        if number is None:
            return Score(float(self.non_numeric), f"final answer {answer[:60]!r} is not a number", details)
        return Score(1.0, f"numeric final answer {answer[:60]!r} (after {marker!r})", details)


def make_math_answer(params: dict[str, Any], ctx: VerifierContext) -> MathAnswerVerifier:
    return MathAnswerVerifier(**params)
