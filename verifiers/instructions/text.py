"""Counting what instructions count: words, sentences, words in capitals, the first word of a paragraph.

IFEval's constraints are stated in these units ("at least 300 words", "fewer than 5 sentences",
"at least 3 words in all capital letters"), and a checker is only as good as its idea of a word or a
sentence. The definitions here are the ones IFEval's published grading uses, written down so a
reader can predict a count by hand:

* **A word** is a maximal run of Unicode word characters (letters, digits, underscore): "don't" is
  two words, "state-of-the-art" four, "3.5" two. Vowel signs of Indic scripts are not word
  characters, so such text counts more, shorter words; the thresholds IFEval sets are English ones.
* **A sentence** (`sentences`) ends where a run of ``.``, ``?`` or ``!`` (and any closing quotes,
  brackets or asterisks after it) is followed by white space or the end of the text, except:

  - after a known abbreviation ("Dr.", "e.g.", "U.S.", "etc.", "a.m."), unless the next word is a
    capitalised word that usually starts a sentence ("etc. The" ends one, "Dr. Smith" does not);
  - after a single-letter initial followed by a capitalised word ("J. Smith");
  - after a number with a period ("3.") followed by a lowercase word;
  - after an ellipsis, unless a capitalised word other than "I" follows.

  A line break alone does not end a sentence: a heading or a list item without final punctuation
  runs into the next sentence, and "1." before a capitalised list item ends one. This is the
  behaviour of the Punkt tokenizer trained on English that IFEval's grader calls (NLTK's
  ``english.pickle``), approximated without its learned tables: the abbreviation list and the
  sentence starters below stand in for them.
* **A word in capitals** (`capital_words`) is a token of the text, split as a word tokenizer splits
  English (white space and the punctuation around words; hyphens, slashes and periods inside a
  word keep it whole; "N'T", "'S", "'M", "'LL", "'RE", "'VE" and "'D" are tokens of their own)
  that has a cased letter and no lowercase one: "NASA", "I", "A", "COVID-19", "DON'T" (two).

Every function is linear in the text's length.
"""

from __future__ import annotations

import re

# Runs of word characters; `re`'s \w is Unicode-aware, as in the published grader.
_WORD = re.compile(r"\w+")

# A candidate sentence end: a run of end punctuation (from its start: a run is tried once, so a
# long run that ends inside a word costs its length, not its square), closers, then white space.
_END = re.compile(r"(?<![.?!…])[.?!…]+[\"'”’)\]}*_]*(?=\s|$)")
_NEXT_WORD = re.compile(r"\s+[\"'“‘(\[*_]*(\S+)")
_NUMBER = re.compile(r"^[-+]?[\d,.]*\d$")
_INITIAL = re.compile(r"^[^\W\d_]$")

# Abbreviations after which a period does not end a sentence by itself, lowercase, without the
# final period. Punkt learns its list from a corpus; these are the ones that occur in answers,
# less those that are also English words ending many a sentence ("no", "sun", "sat", "wed").
ABBREVIATIONS = frozenset(
    """
    mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e eg ie cf al approx dept est inc ltd co corp
    jan feb apr jun jul aug sep sept oct nov dec tues thur thurs
    u.s u.k u.s.a u.n e.u d.c n.y l.a a.m p.m ph.d b.a m.a b.s m.s m.d vol vols fig figs
    gen gov sen rep col capt lt sgt cmdr adm maj rev hon pres messrs mme mlle ave blvd rd
    """.split()
)

# Capitalised words that start sentences far more often than they sit inside one: after an
# abbreviation or an ellipsis, one of these means a new sentence (Punkt's orthographic heuristic).
SENTENCE_STARTERS = frozenset(
    """
    the a an this that these those it its he she they we you i'm there here his her their our my
    your in on at for from with by as if when while after before but and or so yet however also
    then thus therefore still now today many most some all each every no not one two what why
    how who where which
    """.split()
)


def words(text: str) -> int:
    """How many words: maximal runs of Unicode word characters."""
    return sum(1 for _ in _WORD.finditer(text))


def _ends_sentence(token: str, marks: str, following: str | None) -> bool:
    """Whether `token` (the text before the end punctuation `marks`) ends a sentence, given the
    next word (None at the end of the text)."""
    if following is None:
        return True
    starts_upper = following[:1].isupper()
    if "?" in marks or "!" in marks:
        return True
    if ".." in marks or "…" in marks:
        return starts_upper and following != "I" and not following.startswith(("I'", "I’"))
    core = token.lower().lstrip("\"'“‘([{*_")
    if _NUMBER.match(core):
        return not following[:1].islower()
    if _INITIAL.match(core):
        return not starts_upper
    if core in ABBREVIATIONS or core.rsplit("-", 1)[-1] in ABBREVIATIONS:
        return starts_upper and following.lower().strip("\"'.,;:!?") in SENTENCE_STARTERS
    return True


_LONGEST_TOKEN = 200  # how far back a sentence end's token is looked for


def _token_before(text: str, start: int, end: int) -> str:
    """The white-space-delimited piece of `text` that ends at `end`, looked for from `start`."""
    i = end
    while i > start and not text[i - 1].isspace():
        i -= 1
    return text[i:end]


def sentences(text: str) -> list[str]:
    """The text's sentences, as defined in the module docstring (stripped, none empty)."""
    out: list[str] = []
    start = 0
    for m in _END.finditer(text):
        token = _token_before(text, max(start, m.start() - _LONGEST_TOKEN), m.start())
        after = _NEXT_WORD.match(text, m.end())
        following = after.group(1) if after else None
        if _ends_sentence(token, m.group(), following):
            piece = text[start : m.end()].strip()
            if piece:
                out.append(piece)
            start = m.end()
    rest = text[start:].strip()
    if rest:
        out.append(rest)
    return out


# A word tokenizer's split of English, enough to say which tokens are in capitals: the text is cut
# at white space, the punctuation around each piece is dropped, and clitics become tokens.
_EDGE_PUNCT = "\"'“”‘’`()[]{}<>*_,;:!?.#@$%&~|=+^"
_CLITIC_ENDINGS = ("n't", "'s", "'m", "'d", "'ll", "'re", "'ve", "n’t", "’s", "’m", "’d", "’ll", "’re", "’ve")


def word_tokens(text: str) -> list[str]:
    """The text's tokens as an English word tokenizer gives them (see the module docstring)."""
    tokens: list[str] = []
    for piece in text.split():
        core = piece.strip(_EDGE_PUNCT)
        if not core:
            continue
        low = core.lower()
        ending = next((e for e in _CLITIC_ENDINGS if low.endswith(e) and len(core) > len(e)), None)
        if ending:
            tokens.extend((core[: -len(ending)], core[-len(ending) :]))
        else:
            tokens.append(core)
    return tokens


def capital_words(text: str) -> int:
    """How many tokens have a cased letter and no lowercase letter ("NASA", "I", "DON'T" = 2)."""
    return sum(1 for t in word_tokens(text) if t.isupper())


_FIRST_WORD_STRIP = "\"'“”‘’*_#>([{"
_FIRST_WORD_STOP = frozenset(".,?!'\"")


def first_word(paragraph: str) -> str:
    """The first word of a paragraph, lowercase: its first white-space piece, leading quotes and
    markup dropped, cut at the first punctuation mark ("**Hello,**" is "hello")."""
    pieces = paragraph.split(maxsplit=1)
    if not pieces:
        return ""
    word = pieces[0].lstrip(_FIRST_WORD_STRIP)
    out = []
    for ch in word:
        if ch in _FIRST_WORD_STOP:
            break
        out.append(ch)
    return "".join(out).lower().rstrip("*_:;")


def echoed_share(answer: str, source: str, n: int = 6) -> float:
    """The share of `source`'s runs of `n` consecutive words (any case) that reappear in `answer`:
    1.0 when the answer restates the source whole, 0.0 when it shares no run (or the source has
    fewer than `n` words)."""

    def runs(text: str) -> set[tuple[str, ...]]:
        ws = [w.lower() for w in _WORD.findall(text)]
        return {tuple(ws[i : i + n]) for i in range(len(ws) - n + 1)}

    wanted = runs(source)
    if not wanted:
        return 0.0
    return len(wanted & runs(answer)) / len(wanted)
