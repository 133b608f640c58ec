"""Numbers and bounds as prompts state them: "at least 300", "fewer than five", "6 or 7", "twice".

IFEval's checks compare a count with a threshold in one of two ways, ``at least N`` or
``less than N``; everything a person writes is brought to those: "more than 4" is at least 5, "at
most 10" and "10 or less" are less than 11, "5 to 10" and "5 or 6" are two bounds, "exactly 3" is
at least 3 and less than 4. A bare number ("a 500-word story") states no bound and reads as none.
"""

from __future__ import annotations

import re

NUMBER_WORDS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
    "hundred": 100,
    "a hundred": 100,
    "a single": 1,
}
ORDINALS = {
    "first": 1,
    "second": 2,
    "third": 3,
    "fourth": 4,
    "fifth": 5,
    "sixth": 6,
    "seventh": 7,
    "eighth": 8,
    "ninth": 9,
    "tenth": 10,
}
TIMES_WORDS = {"once": 1, "twice": 2, "thrice": 3}

NUM = r"(?:\d{1,7}|" + "|".join(sorted(NUMBER_WORDS, key=len, reverse=True)) + r")"

_AT_LEAST = (
    "at least",
    "no less than",
    "not less than",
    "no fewer than",
    "not fewer than",
    "a minimum of",
    "minimum of",
    "minimum",
    "min",
)
_MORE = ("more than", "over", "greater than", "above", "in excess of")
_LESS = ("less than a total of", "less than", "fewer than", "under", "below", "shorter than")
_AT_MOST = (
    "at most",
    "no more than",
    "not more than",
    "a maximum of",
    "maximum of",
    "maximum",
    "up to",
    "no longer than",
    "longer than",
    "max",
)
_EXACT = ("exactly", "precisely", "just", "only", "a total of")
RELATION = r"(?:" + "|".join(sorted((*_AT_LEAST, *_MORE, *_LESS, *_AT_MOST, *_EXACT), key=len, reverse=True)) + r")"
_SUFFIX_AT_LEAST = ("or more", "or above", "and above", "and more", "at least", "minimum", "+")
_SUFFIX_AT_MOST = ("or less", "or fewer", "or below", "at most", "maximum")
SUFFIX = r"(?:or more|or above|and above|and more|or less|or fewer|or below|at least|at most|minimum|maximum)"

# a quantity, its unit left to the caller: "at least 3", "between 5 and 10", "6 or more", "300+"
QUANTITY = (
    rf"(?:(?P<rel>{RELATION})\s+)?(?:(?P<between>between)\s+)?(?P<n>{NUM})"
    rf"(?:\s*(?:to|-|–|or|and)\s*(?P<m>{NUM}))?(?P<plus>\s*\+)?(?:\s+(?P<suf1>{SUFFIX}))?"
)

Bound = tuple[str, int]


def number(text: str) -> int:
    """A number written in digits or words ("12", "twelve", "a hundred")."""
    text = text.strip().lower()
    if text.isdigit():
        return int(text)
    return NUMBER_WORDS[text]


def bounds(rel: str | None, n: int, m: int | None = None, suffix: str | None = None) -> list[Bound]:
    """The IFEval bounds (``("at least", N)`` / ``("less than", N)``) of a stated quantity."""
    rel = (rel or "").lower().strip()
    suffix = (suffix or "").lower().strip()
    if m is not None and m >= n:
        return [("at least", n), ("less than", m + 1)]
    if rel in _AT_LEAST or suffix in _SUFFIX_AT_LEAST:
        return [("at least", n)]
    if rel in _MORE:
        return [("at least", n + 1)]
    if rel in _LESS:
        return [("less than", n)]
    if rel in _AT_MOST or suffix in _SUFFIX_AT_MOST:
        return [("less than", n + 1)]
    if rel in _EXACT:
        return [("at least", n), ("less than", n + 1)]
    return []


def match_bounds(m: re.Match[str]) -> list[Bound]:
    """The bounds of a match of a pattern built on `QUANTITY` (with an optional group ``suf2``,
    a suffix after the unit)."""
    n = number(m.group("n"))
    upper = m.group("m")
    if upper is not None and not m.group("between") and m.group(0).lower().find(" and ") >= 0:
        upper = None  # "3 and 4" outside "between" is two numbers, not a range
    suffix = m.group("suf1") or (m.groupdict().get("suf2") or "")
    if m.group("plus"):
        suffix = "+"
    return bounds(m.group("rel"), n, number(upper) if upper is not None else None, suffix)


_TIMES = re.compile(
    rf"(?:(?P<rel>{RELATION})\s+)?(?:(?P<n>{NUM})(?:\s*(?:to|-|–|or)\s*(?P<m>{NUM}))?(?:\s+(?P<suf0>{SUFFIX}))?\s+times?"
    rf"|(?P<word>once|twice|thrice))(?:\s+(?P<suf>{SUFFIX}))?",
    re.IGNORECASE,
)


def times_bounds(text: str) -> tuple[list[Bound], re.Match[str] | None]:
    """The bounds of the first count of times in `text` ("at least 3 times", "twice", "once or
    less", "6 or 7 times", "more than 2 times"), and its match."""
    for m in _TIMES.finditer(text):
        if m.group("word"):
            n = TIMES_WORDS[m.group("word").lower()]
            found = bounds(m.group("rel"), n, None, m.group("suf"))
            if not found and not m.group("rel"):
                found = [("at least", n), ("less than", n + 1)]
        else:
            upper = m.group("m")
            suffix = m.group("suf0") or m.group("suf")
            found = bounds(m.group("rel"), number(m.group("n")), number(upper) if upper else None, suffix)
            if not found:
                found = [("at least", number(m.group("n")))]
        if found:
            return found, m
    return [], None
