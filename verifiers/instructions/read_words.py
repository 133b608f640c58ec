"""Reading the words a prompt names: words to include, to avoid, to use so many times, letters
to count.

The hardest part of a prompt to read, because the words are the prompt's own: "include the
keywords 'a' and 'b'", "do not use the words reschedule or free", "the word war at least 8
times", "the letter q appears less than 5 times". A list is read as quoted items, a bracketed
list, or plain words joined by commas, "and", "or"; plain words count only where a noun ("the
keyword") or a verb of saying ("mention", "include") names them and the list ends where a
sentence or a phrase such as "in your response" does, so "do not say anything before" and
"without change" are not lists of words.
"""

from __future__ import annotations

import re

from verifiers.instructions.constraint import CAPITAL_WORDS, Found, emit, sentences
from verifiers.instructions.constraint import IGNORE as _I
from verifiers.instructions.quantities import QUANTITY, match_bounds, number, times_bounds

_QUOTED = re.compile(r"[\"“”'‘’`]([^\"“”‘’`\n]{1,60}?)[\"“”'‘’`](?!\w)")
_LIST_SEP = re.compile(r"\s*(?:,|;|and\b|or\b|&|nor\b|as well as\b)?\s*(?:,\s*)?(?:and\b|or\b)?\s*", _I)
_BARE_WORD = re.compile(r"[A-Za-z][\w-]*")
_BARE_STOP = frozenset(
    "in on at to from for throughout anywhere each every should must will the a an your any this that "
    "when while somewhere into within with all or and but so as is are be".split()
)


def word_list(text: str) -> list[str]:
    """The words or phrases a list at the start of `text` names: quoted items, a bracketed list,
    or plain words joined by commas, "and", "or"."""
    return _word_list_at(text)[0]


def _word_list_at(text: str) -> tuple[list[str], int, bool]:
    """`word_list` of `text`, where in `text` the list ends, and whether its items were quoted."""
    offset = len(text) - len(text.lstrip(" :\t"))
    rest = text[offset:]
    if rest.startswith("["):
        end = rest.find("]")
        inner = rest[1:end] if end >= 0 else rest[1:]
        items = [q.strip() for q in _QUOTED.findall(inner) if q.strip()]
        return items, offset + (end + 1 if end >= 0 else len(rest)), True
    quoted = []
    pos = 0
    while True:
        sep = _LIST_SEP.match(rest, pos)
        start = sep.end() if sep else pos
        m = _QUOTED.match(rest, start)
        if not m:
            break
        quoted.append(m.group(1).strip())
        pos = m.end()
    if quoted:
        return [q for q in quoted if q], offset + pos, True
    words: list[str] = []
    pos = 0
    while True:
        sep = _LIST_SEP.match(rest, pos) if words else None
        start = sep.end() if sep else pos
        m = _BARE_WORD.match(rest, start)
        if not m or m.group(0).lower() in _BARE_STOP:
            break
        if words and sep is not None and not rest[sep.start() : sep.end()].strip():
            break  # two words in a row: the list has ended ("X in your response")
        words.append(m.group(0))
        pos = m.end()
    return words, offset + pos, False


_NEGATIVE = r"(?:do\s+not|don['’]t|does\s+not|doesn['’]t|not|never|without|avoid|exclude|refrain\s+from|no)"
_NOT_NEGATIVE = re.compile(r"\b(?:do\s+not|don['’]t)\s+forget\b", _I)
_WORD_NOUN = r"(?:(?:key\s*)?words?|keywords?|terms?|phrases?|items?|line|names?)"
_FORBIDDEN = re.compile(
    rf"\b{_NEGATIVE}\b(?:\s+(?:(?P<verb>include|includ\w+|us\w+|say\w*|mention\w*|contain\w*|have)|the|any|of|to|"
    rf"following|negative|these|this|use\s+of)){{0,5}}\s+(?:(?P<noun>{_WORD_NOUN})\s*)?(?:such\s+as\s+|like\s+)?:?\s*"
    rf"(?=[\"“'‘\[A-Za-z])",
    _I,
)
_FORBIDDEN_AFTER = re.compile(
    rf"\b(?:the\s+)?{_WORD_NOUN}\s+(?P<list>[^.!?\n]{{1,120}}?)\s+(?:should|must|can|will|may)\s*(?:not|n['’]t)\s+(?:appear|be)|"
    rf"\b(?:the\s+)?word\s+(?P<one>\S+)\s+(?:doesn['’]t|does\s+not|should\s+not|must\s+not)\s+appear",
    _I,
)
_LIST_END = re.compile(r"\s*(?:in\s+(?:the|your|this|my)\b|throughout|anywhere|whatsoever|at all|[.!?,;]|$)", _I)
_INCLUDE = re.compile(
    rf"\b(?:include|includes|including|contain|contains|containing|use|using|mention|mentions|have|has|"
    rf"with\s+(?=these|the\s+following))\b\s*"
    rf"(?:the\s+|these\s+|following\s+|all\s+)?(?:{_WORD_NOUN})\b\s*:?\s*",
    _I,
)
# at most this many "word X ..." heads read per sentence: a prompt of "word word word ..." made each
# a count of times searched (0.8 s of the event loop for 20,000 characters); a real one has a few
_MAX_HEADS = 64
_FREQ_HEAD = re.compile(
    r"\b(?:the\s+)?(?:key)?(?:word|name)\s+(?P<w>[\"“'‘][^\"”'’]+[\"”'’]|[A-Za-z][\w-]*)\s+(?P<tail>[^.!?\n]{0,80})",
    _I,
)


def _negative(text: str) -> bool:
    return bool(re.search(rf"\b{_NEGATIVE}\b", _NOT_NEGATIVE.sub(" ", text), _I))


def keywords(prompt: str, out: Found) -> None:
    for s in sentences(prompt):
        if CAPITAL_WORDS.search(s):
            continue
        # frequency: "the word X should appear at least N times", "use the word X twice"
        counted: list[str] = []
        pos, heads = 0, 0
        while heads < _MAX_HEADS and (m := _FREQ_HEAD.search(s, pos)) is not None:
            pos, heads = m.start() + 1, heads + 1
            word = m.group("w").strip("\"“”'‘’")
            tail = m.group("tail")
            head = s[max(0, m.start() - 40) : m.start()]
            found, tm = times_bounds(tail)
            if tm is None or tm.start() > 60 or re.search(r"\bletter\b", head, _I):
                continue
            between = tail[: tm.start()]
            if _negative(between) or _negative(head) or re.search(r"\bword\b", between, _I):
                continue
            counted.append(word.lower())
            for rel, n in found:
                emit(out, "keywords:frequency", s, keyword=word, relation=rel, frequency=n)
        # forbidden: "do not include the keywords 'a', 'b'", "the words a and b cannot be in ..."
        forbidden: list[str] = []
        for m in _FORBIDDEN.finditer(s):
            if _NOT_NEGATIVE.match(s, m.start()):
                continue
            rest = s[m.end() :]
            if re.match(r"(?:any\s+)?(?:commas?|capital|lower|other language|letter)", rest, _I):
                continue
            words, end, quoted = _word_list_at(rest)
            named = m.group("noun") or re.match(r"(?:mention|say|includ|contain)", m.group("verb") or "", _I)
            if words and (quoted or (named and _LIST_END.match(rest, end))):
                forbidden += words
        for m in _FORBIDDEN_AFTER.finditer(s):
            words = [m.group("one").strip("\"“”'‘’")] if m.group("one") else word_list(m.group("list"))
            forbidden += words
        forbidden = [w for w in forbidden if w.lower() not in counted]
        if forbidden:
            emit(out, "keywords:forbidden_words", s, forbidden_words=_unique(forbidden))
            continue
        # existence: "include the keywords 'a' and 'b'", "mention 'X'"
        found_words: list[str] = []
        for m in _INCLUDE.finditer(s):
            before = s[max(0, m.start() - 25) : m.start()]
            if _negative(before) or re.search(r"\b(?:start|begin)s?\s*$", before, _I):
                continue
            found_words += word_list(s[m.end() :])
        mention = re.search(r"\bmention\s+(?P<q>[\"“'‘][^\"”'’]+[\"”'’])", s, _I)
        if mention:
            found_words += word_list(mention.group("q"))
        skip = {"exact", "following", "word", "words", *counted}
        found_words = [w for w in found_words if w.lower() not in skip]
        if found_words:
            emit(out, "keywords:existence", s, keywords=_unique(found_words))


def _unique(words: list[str]) -> list[str]:
    seen: list[str] = []
    for w in words:
        if w.lower() not in (x.lower() for x in seen):
            seen.append(w)
    return seen


_LETTER = re.compile(r"\bletter\s+[\"“'‘]?(?P<l>[A-Za-z])[\"”'’]?(?![\w])(?P<tail>[^.!?\n]{0,80})", _I)
_SYMBOLS = re.compile(rf"(?P<q>{QUANTITY})\s+(?P<what>exclamation marks?|hashtags?|question marks?)", _I)
_SYMBOL_CHAR = {"exclamation": "!", "hashtag": "#", "question": "?"}


def letters(prompt: str, out: Found) -> None:
    for s in sentences(prompt):
        for m in _LETTER.finditer(s):
            letter = m.group("l").lower()
            head = s[max(0, m.start() - 50) : m.start()]
            found, tm = times_bounds(m.group("tail"))
            negative = re.search(r"\b(?:without|avoid\w*|not|never|no)\b|n['’]t\b", head, _I)
            if tm is not None and negative and re.search(r"more than", tm.group(0), _I):
                found = [("less than", number(tm.group("n")) + 1 if tm.group("n") else 3)]
            elif tm is None and negative:
                found = [("less than", 1)]
            for rel, n in found:
                emit(out, "keywords:letter_frequency", s, letter=letter, let_relation=rel, let_frequency=n)
        for m in _SYMBOLS.finditer(s):
            char = _SYMBOL_CHAR[m.group("what").split()[0].lower().rstrip("s")]
            for rel, n in match_bounds(m):
                emit(out, "keywords:letter_frequency", s, letter=char, let_relation=rel, let_frequency=n)
