"""Reading the checkable constraints of a request from its own words.

The `instructions` verifier has only what a caller sends: the prompt. This module turns the
prompt's sentences into constraints of IFEval's 25 kinds, with the arguments the checks in
`verifiers.instructions.checks` take: "Do not use any commas" is ``punctuation:no_comma``, "at
least 300 words" is ``length_constraints:number_words`` with ``relation = "at least"`` and
``num_words = 300``, "wrap your entire response with double quotation marks" is
``startend:quotation``, "respond only in Hindi" is ``language:response_language`` with ``language =
"hi"``, and so on. It is a reader of patterns, one small reader per kind, each looking for the
phrases people use for it in the sentence that states it; what it does not recognise it leaves
out (the verifier then abstains or checks less), so a constraint it reads is one it is fairly sure
of. How often it reads what IFEval's answer key lists, kind by kind, is measured on IFEval's 541
prompts by tests/verifiers/test_instructions.py (the measurement reads the key; this module never
does).

Bounds follow `verifiers.instructions.quantities`; words to include or avoid are read as quoted
strings, a bracketed list, or a plain list ("the keywords waste, material and meal"); a phrase to
end with is read from quotes, or from the rest of its sentence.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from verifiers.instructions.constraint import CAPITAL_WORDS, Constraint, Found, emit, sentences
from verifiers.instructions.constraint import IGNORE as _I
from verifiers.instructions.quantities import (
    NUM,
    ORDINALS,
    QUANTITY,
    RELATION,
    SUFFIX,
    Bound,
    bounds,
    match_bounds,
    number,
)
from verifiers.instructions.read_words import keywords, letters

MAX_PROMPT_CHARS = 20_000  # a longer prompt is read on its first and last halves of this


_NO_COMMA = re.compile(
    r"(?:(?:\b(?:no|not|never|without|avoid\w*|refrain\w*|exclude|free of|zero|cannot)\b|n['’]t\b)"
    r"[^.!?\n]{0,60}\bcommas?\b"
    r"|\bcommas?\b[^.!?\n]{0,30}\b(?:not|never|forbidden|prohibited)\b)",
    _I,
)


def _no_comma(prompt: str, out: Found) -> None:
    m = _NO_COMMA.search(prompt)
    if m:
        emit(out, "punctuation:no_comma", m.group(0))


_ALL_CAPS = re.compile(
    r"\b(?:in|use|using|with|only|be|entirely in|written in)\s+(?:only\s+)?(?:all\s+)?(?:capital letters|caps|"
    r"uppercase|upper case|capitals)\b|\bcapitali[sz]e (?:every|each|all) (?:of )?(?:the |your )?(?:letters?|words?)\b|"
    r"\ball (?:the )?letters\b[^.!?\n]{0,50}\b(?:capitali[sz]ed|capital|uppercase)\b|"
    r"\bnot a single (?:word|letter)\b[^.!?\n]{0,60}\blower ?case\b|\bno lower ?case letters\b|"
    r"\ball (?:capital letters|caps)\b",
    _I,
)
_LOWER = re.compile(
    r"\b(?:in|all|only|use|using|with|be)\s+(?:\w+\s+)?lower[ -]?case(?:d|s)?\b|"
    r"\blower[ -]?case\s+(?:letters|english|only)\b|\bletters\s+(?:are|be|in)\s+lower[ -]?case\b|"
    r"\ball letters lowercased\b|\bno capitali[sz]ations?\b|"
    r"\b(?:no |without (?:using )?(?:any )?|not contain any |not use any )capital letters\b|"
    r"\bnot a single letter\b[^.!?\n]{0,60}\bcapitali[sz]ed\b",
    _I,
)
_NO_CAPITALS = re.compile(r"\b(?:no|without (?:using )?(?:any )?|not (?:contain|use|have) any )capital letters\b", _I)
_CAPITAL_COUNT = re.compile(
    rf"{QUANTITY}\s+(?:(?:such|of the|stress)\s+)?(?:\w+\s+){{0,2}}?(?P<unit>times|words?\b)|"
    rf"(?P<rel2>{RELATION})\s+(?P<n2>{NUM})(?=\s*(?:[.,;!?)]|$))",
    _I,
)
_CAPITAL_BACKREF = re.compile(r"\b(?:those|these|such|the)\s+(?:stress\s+|capitali[sz]ed\s+)?words\b", _I)
_VAGUE = re.compile(r"\b(?:a few|some|several|use words|include words|add stress words|capitali[sz]e)\b", _I)


def _case(prompt: str, out: Found) -> None:
    capital_bounds: list[Bound] = []
    vague = ""
    previous = False
    for s in sentences(prompt):
        if CAPITAL_WORDS.search(s) or (previous and _CAPITAL_BACKREF.search(s)):
            previous = True
            found = [b for m in _CAPITAL_COUNT.finditer(s) for b in _capital_bounds(m)]
            capital_bounds += [(r, n) for r, n in found if (r, n) not in capital_bounds]
            if _VAGUE.search(s):
                vague = vague or s
            continue
        previous = False
        if _NO_CAPITALS.search(s):
            emit(out, "change_case:english_lowercase", s)
        elif _ALL_CAPS.search(s):
            emit(out, "change_case:english_capital", s)
        elif _LOWER.search(s):
            emit(out, "change_case:english_lowercase", s)
    if vague and not any(r == "at least" for r, _ in capital_bounds):
        capital_bounds.append(("at least", 1))
    for rel, n in capital_bounds:
        emit(out, "change_case:capital_word_frequency", vague or prompt, capital_relation=rel, capital_frequency=n)


def _capital_bounds(m: re.Match[str]) -> list[Bound]:
    if m.group("n2"):
        return bounds(m.group("rel2"), number(m.group("n2")))
    return match_bounds(m)


_LANGUAGES = {
    "arabic": "ar",
    "bengali": "bn",
    "bangla": "bn",
    "bulgarian": "bg",
    "chinese": "zh",
    "mandarin": "zh",
    "dutch": "nl",
    "finnish": "fi",
    "french": "fr",
    "german": "de",
    "greek": "el",
    "gujarati": "gu",
    "hebrew": "he",
    "hindi": "hi",
    "indonesian": "id",
    "italian": "it",
    "japanese": "ja",
    "kannada": "kn",
    "korean": "ko",
    "malayalam": "ml",
    "marathi": "mr",
    "nepali": "ne",
    "persian": "fa",
    "farsi": "fa",
    "polish": "pl",
    "portuguese": "pt",
    "punjabi": "pa",
    "russian": "ru",
    "spanish": "es",
    "swahili": "sw",
    "tamil": "ta",
    "telugu": "te",
    "thai": "th",
    "turkish": "tr",
    "ukrainian": "uk",
    "urdu": "ur",
    "vietnamese": "vi",
}
_LANG = r"(?P<lang>" + "|".join(_LANGUAGES) + r")"
_RESPOND_IN = re.compile(
    rf"\b(?:only|entirely|completely|wholly|solely|exclusively|in|using|use|outside of)\s+(?:in\s+)?(?:the\s+)?{_LANG}"
    rf"(?:\s+language)?\b(?!\s+(?:translation|word|name|version|of\b))",
    _I,
)
_TRANSLATE = re.compile(r"\btranslat\w*\b", _I)


def _language(prompt: str, out: Found) -> None:
    for s in sentences(prompt):
        for m in _RESPOND_IN.finditer(s):
            before = s[: m.start()].lower()
            if _TRANSLATE.search(s) and "no other language" not in s.lower():
                continue
            if m.group(0).lower().startswith("in ") and not re.search(
                r"\b(?:respon\w*|answer\w*|repl\w*|write|writ\w+|rewrite|explain|output|entire|essay|poem|riddle|"
                r"haiku|joke|story|song|no other language|conversation|be)\b",
                before + " " + s[m.end() :].lower(),
            ):
                continue
            emit(out, "language:response_language", s, language=_LANGUAGES[m.group("lang").lower()])


def _length_unit(unit: str, skip: re.Pattern[str] | None = None) -> re.Pattern[str]:
    return re.compile(
        rf"{QUANTITY}[\s-]*(?:(?:very|short|long|total|more|separate|distinct)\s+)?(?P<unit>{unit})"
        rf"(?:\s+(?P<suf2>{SUFFIX}))?",
        _I,
    )


_WORDS = _length_unit(r"words?\b")
_SENTENCES = _length_unit(r"sentences?\b")
# "the total number of words in your response should be 250 or more", "... in the range of 40 to 60"
_NUMBER_OF = re.compile(
    rf"\bnumber of (?P<unit>words|sentences)\b[^.!?\n]{{0,50}}?\b(?:be|is|of|to)\s+"
    rf"(?:in\s+the\s+range\s+of\s+)?{QUANTITY}",
    _I,
)
_NOT_WORD_COUNT_AFTER = re.compile(r"[^.!?\n]{0,50}\b(?:capital|caps|upper ?case|italic|highlight|bold)", _I)
_NOT_WORD_COUNT_BEFORE = re.compile(r"\b(?:highlight\w*|italic\w*|bold\w*|capitali[sz]\w*)\b[^.!?\n]{0,30}$", _I)
_PARENTHESES = re.compile(r"\([^()]*\)")
# how far before a word count "highlighted ... 300 words" is looked for (a word and 30 characters):
# searched from the sentence's start, each count in a long sentence rescanned all before it
_BEFORE_REACH = 120


def _lengths(prompt: str, out: Found) -> None:
    for s in sentences(prompt):
        lower = s.lower()
        outside = _PARENTHESES.sub(" ", s)
        for unit, pattern in (("words", _WORDS), ("sentences", _SENTENCES)):
            if unit[:-1] not in lower:  # a sentence without the unit's word cannot state it (and a
                continue  # search of it is a number tried at every position: 0.2 s on 20,000 digits)
            text = outside if pattern.search(outside) else s  # "(just 1 or 2 sentences)" restates the bound
            matches = list(pattern.finditer(text))
            for m in matches:
                if unit == "words" and (
                    _NOT_WORD_COUNT_AFTER.match(text, m.end())
                    or _NOT_WORD_COUNT_BEFORE.search(text, max(0, m.start() - _BEFORE_REACH), m.start())
                ):
                    continue
                _emit_length(out, unit, m.group(0), match_bounds(m))
        for m in _NUMBER_OF.finditer(s):
            if _NOT_WORD_COUNT_AFTER.match(m.group(0)):
                continue
            _emit_length(out, m.group("unit").lower(), m.group(0), match_bounds(m))


def _emit_length(out: Found, unit: str, where: str, found: list[Bound]) -> None:
    for rel, n in found:
        if unit == "words":
            emit(out, "length_constraints:number_words", where, relation=rel, num_words=n)
        else:
            emit(out, "length_constraints:number_sentences", where, relation=rel, num_sentences=n)


_PLACEHOLDER = re.compile(rf"(?:{QUANTITY}\s+)?(?:\w+\s+)?placeholders?\b", _I)


_PLACEHOLDER_WORD = re.compile(r"placeholders?\b", _I)
_PLACEHOLDER_REACH = 80  # how far before the word its quantity and one word may start


def _placeholder_matches(prompt: str) -> Iterator[re.Match[str]]:
    """`_PLACEHOLDER`'s matches, each searched in a window that ends at an occurrence of the word:
    searched over the whole prompt, its optional quantity and word made a prompt of 20,000 digits
    take 15 s of the event loop (every start position tried to the end)."""
    last = 0
    for w in _PLACEHOLDER_WORD.finditer(prompt):
        start = max(last, w.start() - _PLACEHOLDER_REACH)
        m = _PLACEHOLDER.search(prompt, start, w.end())
        if m is not None:
            last = m.end()
            yield m


def _placeholders(prompt: str, out: Found) -> None:
    best: int | None = None
    where = ""
    for m in _placeholder_matches(prompt):
        if m.group("n"):
            found = match_bounds(m)
            n = next((n for r, n in found if r == "at least"), number(m.group("n")))
            if best is None or n > best:
                best, where = n, m.group(0)
        elif best is None and re.search(r"square brackets|\[", prompt):
            where = m.group(0)
    if best is not None or where:
        emit(out, "detectable_content:number_placeholders", where, num_placeholders=best or 1)


def _postscript(prompt: str, out: Found) -> None:
    if re.search(r"\bP\.\s?P\.\s?S\b", prompt):
        emit(out, "detectable_content:postscript", "P.P.S", postscript_marker="P.P.S")
    elif re.search(r"\bP\.\s?S\.", prompt):
        emit(out, "detectable_content:postscript", "P.S.", postscript_marker="P.S.")


def _constrained(prompt: str, out: Found) -> None:
    if re.search(r"My answer is yes\.", prompt) and re.search(r"My answer is no\.", prompt):
        emit(out, "detectable_format:constrained_response", "My answer is yes. / no. / maybe.")


_JSON = re.compile(
    r"\b(?:in|as|into|using)\s+(?:a\s+|valid\s+)?JSON\b(?!\s+schema)|\bJSON\s+(?:format|block|object|output)\b|"
    r"\bwrap\w*\b[^.!?\n]{0,40}\bJSON\b|\bformat\b[^.!?\n]{0,30}\bin JSON\b",
    _I,
)


def _json(prompt: str, out: Found) -> None:
    m = _JSON.search(prompt)
    if m:
        emit(out, "detectable_format:json_format", m.group(0))


_SPLITTER_X = re.compile(r"['\"]?\b(?P<sp>[A-Z][A-Za-z]*) X\b")
_SPLITTER_ENUM = re.compile(r"['\"]?\b(?P<sp>[A-Z][A-Za-z]*) 1\b['\"]?[^\n]{0,40}?\b(?P=sp) 2\b")


def _parts(units: str) -> re.Pattern[str]:
    return re.compile(rf"{QUANTITY}[ \t-]+(?:(?!(?:and|or|to)\b)\w+ )?(?:{units})\b", _I)


# the units a count of parts is stated in, the likeliest first
_PARAGRAPH_UNITS = (_parts("paragraphs?"), _parts("parts?|stanzas?|steps?|chapters?|versions?"), _parts("sections?"))


def _count_near(prompt: str, pos: int, patterns: tuple[re.Pattern[str], ...]) -> int | None:
    """The count of parts stated nearest `pos` ("4 sections", "a 2 paragraph critique"), in the
    first of `patterns` that states one."""
    for pattern in patterns:
        best: tuple[int, int] | None = None
        for m in pattern.finditer(prompt):
            b = match_bounds(m)
            n = next((n for r, n in b if r == "at least"), number(m.group("n")))
            d = abs(m.start() - pos)
            if best is None or d < best[0]:
                best = (d, n)
        if best is not None:
            return best[1]
    return None


def _sections(prompt: str, out: Found) -> None:
    for pattern in (_SPLITTER_X, _SPLITTER_ENUM):
        for m in pattern.finditer(prompt):
            sp = m.group("sp")
            if sp in ("I", "A", "The", "Paragraph") and pattern is _SPLITTER_ENUM:
                continue
            units = (_parts(re.escape(sp.lower()) + "s?"), _parts("sections?|paragraphs?|parts?"))
            n = _count_near(prompt, m.start(), units)
            if n is None and pattern is _SPLITTER_ENUM:
                n = max(int(d) for d in re.findall(rf"\b{re.escape(sp)} (\d+)\b", prompt))
            if n is not None:
                emit(out, "detectable_format:multiple_sections", m.group(0), section_spliter=sp, num_sections=n)
                return


_BULLETS = re.compile(rf"{QUANTITY}\s+(?:\w+\s+){{0,2}}?bullet(?:ed)?\s*(?:points?|lists?|items?|s\b)", _I)


def _bullets(prompt: str, out: Found) -> None:
    for s in sentences(prompt):
        for m in _BULLETS.finditer(s):
            n = number(m.group("n"))
            emit(out, "detectable_format:number_bullet_lists", m.group(0), num_bullets=n)
            return
    for s in sentences(prompt):
        if re.search(r"\bbullet", s, _I):
            m2 = re.search(rf"\bexactly\s+(?P<n>{NUM})\b", s, _I)
            if m2:
                emit(out, "detectable_format:number_bullet_lists", s, num_bullets=number(m2.group("n")))
                return


_HIGHLIGHT_WORD = re.compile(r"\b(?:highlight\w*|italic\w*|bold\w*)\b", _I)
_HIGHLIGHT_COUNT = re.compile(
    rf"{QUANTITY}\s+(?:of\s+)?(?:\w+\s+){{0,3}}?(?:sections?|parts?|phrases?|words?|keywords?|spans?|names?|texts?|points?)\b|"
    rf"\b(?P<twice>twice)\b",
    _I,
)


def _highlights(prompt: str, out: Found) -> None:
    for s in sentences(prompt):
        if not _HIGHLIGHT_WORD.search(s) or not re.search(r"markdown|\*|asterisk|italic", s, _I):
            continue
        if re.search(r"\bbullet", s, _I) and not re.search(r"highlight|italic", s, _I):
            continue
        n = 1
        for m in _HIGHLIGHT_COUNT.finditer(s):
            if m.group("twice"):
                n = 2
            else:
                found = match_bounds(m)
                n = next((k for r, k in found if r == "at least"), number(m.group("n")))
            break
        emit(out, "detectable_format:number_highlighted_sections", s, num_highlights=n)
        return


def _title(prompt: str, out: Found) -> None:
    m = re.search(r"double angular brackets|<<[^<>\n]{1,60}>>", prompt, _I)
    if m:
        emit(out, "detectable_format:title", m.group(0))


_DIVIDER = re.compile(r"(?<!\*)\*\*\*(?!\*)|markdown divider|\b(?:3|three) asterisks?\b", _I)


def _paragraphs(prompt: str, out: Found) -> None:
    m = _DIVIDER.search(prompt)
    if m:
        n = _count_near(prompt, m.start(), _PARAGRAPH_UNITS)
        if n is None:
            lines = sum(1 for line in prompt.splitlines() if line.strip() == "***")
            n = lines + 1 if lines else None
        if n is not None:
            emit(out, "length_constraints:number_paragraphs", m.group(0), num_paragraphs=n)
    _nth_paragraph(prompt, out)


_ORD = r"(?P<ord>" + "|".join(ORDINALS) + r"|last|final|very first|\d+(?:st|nd|rd|th))"
_STARTS = r"(?:must|should|will|has to|needs to)?\s*(?:start|begin)s?\s+with\s+(?:the\s+)?(?:word\s+)?"
_NTH = re.compile(
    rf"\b{_ORD}\s+paragraph\s+{_STARTS}(?P<w>[\"“'‘]?[\w'-]+)|"
    rf"\bparagraph\s+(?P<num>{NUM})\s+{_STARTS}(?P<w2>[\"“'‘]?[\w'-]+)|"
    rf"\b(?:start|begin)\s+(?:the\s+)?(?:{_ORD.replace('?P<ord>', '?P<ord2>')}\s+paragraph|paragraph\s+(?P<num2>{NUM}))"
    rf"\s+with\s+(?:the\s+)?(?:word\s+)?(?P<w3>[\"“'‘]?[\w'-]+)",
    _I,
)
_PARAGRAPH_COUNT = re.compile(rf"{QUANTITY}[\s-]+paragraphs?\b", _I)


def _nth_paragraph(prompt: str, out: Found) -> None:
    m = _NTH.search(prompt)
    if not m:
        return
    count = _PARAGRAPH_COUNT.search(prompt)
    if not count:
        return
    total = number(count.group("n"))
    ordinal = (m.group("ord") or m.group("ord2") or "").lower().replace("very ", "")
    if ordinal in ("last", "final"):
        nth = total
    elif ordinal:
        nth = ORDINALS.get(ordinal) or int(re.sub(r"\D", "", ordinal))
    else:
        nth = number(m.group("num") or m.group("num2"))
    word = (m.group("w") or m.group("w2") or m.group("w3")).strip("\"“”'‘’").lower()
    emit(
        out,
        "length_constraints:nth_paragraph_first_word",
        m.group(0),
        num_paragraphs=total,
        nth_paragraph=nth,
        first_word=word,
    )


def _two_responses(prompt: str, out: Found) -> None:
    m = re.search(r"\*{6}|\b(?:six|6) asterisks?\b", prompt, _I)
    if m:
        emit(out, "combination:two_responses", m.group(0))


_END = re.compile(
    r"\b(?:end|finish|conclude|close)\w*\s+(?:(?:your|the|it|this|my)\b[^.!?\n\"“]{0,50}?)?"
    r"(?:with|by)\b\s*(?:the\s+|this\s+)?(?:exact\s+|exactly\s+)?(?:following\s+)?(?:phrase|question|sentence|words?|line)?"
    r"\s*(?:of\s+)?(?::|,)?\s*|"
    r"\b(?:last|final) sentence of your (?:entire )?(?:response|answer)\s+should\s+be\s*:?\s*|"
    r"\bvery end of your (?:entire )?(?:response|answer|reply)\s+should\s+read\s+(?:exactly\s*)?(?:like\s*)?:?\s*",
    _I,
)


def _end_phrase(prompt: str, out: Found) -> None:
    for m in _END.finditer(prompt):
        rest = prompt[m.end() :]
        q = re.match(r"\s*[\"“]([^\"”\n]{1,200})[\"”]", rest)
        if q:
            phrase = q.group(1)
        else:
            line = rest.lstrip("\n ").split("\n", 1)[0]
            stop = re.search(r"(?<=[.!?])\s", line + " ")
            phrase = line[: stop.start()] if stop else line
        phrase = phrase.strip()
        if re.search(r"\bstart\w*\s+and\s+$", prompt[max(0, m.start() - 20) : m.start()], _I):
            continue  # "starting and ending with *": a highlight, not a last phrase
        if re.search(r"\w", phrase) and not phrase.lower().startswith(("a ", "an ", "postscript", "p.s", "p.p.s")):
            emit(out, "startend:end_checker", m.group(0) + phrase, end_phrase=phrase)
            return


def _quotation(prompt: str, out: Found) -> None:
    for s in sentences(prompt):
        if re.search(r"double\s+quot\w*(?:\s+marks?)?|quotation marks", s, _I) and re.search(
            r"\b(?:wrap\w*|around|entire|whole|inside)\b", s, _I
        ):
            emit(out, "startend:quotation", s)
            return


_REPEAT = re.compile(r"\brepe?l?at\b[^.\n]{0,60}?\b(?:request|sentence|prompt|question|text|first line|line|it)\b", _I)


def request_to_repeat(prompt: str) -> str | None:
    """The request a prompt asks to be repeated word for word before the answer, or None when it
    asks for none: the prompt without the lines that ask for the repetition (those come before the
    request, up to a blank line, or after it, to the end)."""
    m = _REPEAT.search(prompt)
    if not m:
        return None
    line_start = prompt.rfind("\n", 0, m.start()) + 1
    if line_start == 0 or not prompt[:line_start].strip():
        gap = prompt.find("\n\n", m.end())
        if gap < 0:
            gap = prompt.find("\n", m.end())
        request = prompt[gap:] if gap >= 0 else ""
    else:
        request = prompt[:line_start]
    request = request.strip()
    quoted = re.search(r"repeat\s+[\"“]([^\"”]{10,})[\"”]", prompt[m.start() :], _I)
    if not request and quoted:
        request = quoted.group(1)
    return request or None


def _repeat(prompt: str, out: Found) -> None:
    request = request_to_repeat(prompt)
    if request:
        emit(out, "combination:repeat_prompt", "repeat the request", prompt_to_repeat=request)


READERS: tuple[Callable[[str, Found], None], ...] = (
    _no_comma,
    _case,
    _language,
    _lengths,
    _placeholders,
    _postscript,
    _constrained,
    _json,
    _sections,
    _bullets,
    _highlights,
    _title,
    keywords,
    letters,
    _paragraphs,
    _two_responses,
    _end_phrase,
    _quotation,
    _repeat,
)


def _bounded(prompt: str) -> str:
    if len(prompt) <= MAX_PROMPT_CHARS:
        return prompt
    half = MAX_PROMPT_CHARS // 2
    return prompt[:half] + "\n\n" + prompt[-half:]


def read_constraints(prompt: str) -> list[Constraint]:
    """The constraints `prompt` states, in the order of `READERS` (see the module docstring)."""
    text = _bounded(prompt)
    out: Found = []
    for reader in READERS:
        reader(text, out)
    return out


def kinds(constraints: list[Constraint]) -> Iterator[str]:
    return (c.kind for c in constraints)
