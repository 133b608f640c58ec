"""The checks of IFEval's 25 instruction kinds: whether an answer follows one stated constraint.

One function per kind, ``check(text, args) -> bool``, keyed by IFEval's instruction id
(``"punctuation:no_comma"``) in `KINDS`. These are the *strict* definitions of Zhou et al. (2023),
"Instruction-Following Evaluation for Large Language Models": the answer is checked as it is, with
no stripping of a markdown wrapper or a first line (the paper's *loose* variants). Two users read
them: the IFEval grader (`evals.ifeval_checks`, arguments from the benchmark's answer key) and the
`instructions` verifier (arguments read from the prompt's own words, `verifiers.instructions.parse`).

Where the published grader's code and the instruction's plain meaning part, the plain meaning is
kept, and the difference is measured against the grader's published verdicts on GPT-4's answers
(tests/evals/test_ifeval_checks.py; docs/evaluating.md lists each):

* a bullet is a line that starts with ``*``, ``-`` or ``+`` and a space (a ``---`` rule is none);
* a keyword must appear as a word, not inside another ("cat" is not in "category");
* the first word of the n-th paragraph is read after markup ("**Summary**" starts with "summary"),
  counting non-empty paragraphs only;
* an empty answer follows no instruction about the answer's language;
* "repeat the request, then answer" needs something after the repetition.

Arguments are validated (`InstructionError` names the kind and the argument); every check is
linear in the text, and a JSON check survives input nested past Python's recursion limit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from verifiers.instructions import text as units
from verifiers.instructions.language import is_language

Args = Mapping[str, Any]
RELATIONS = ("less than", "at least")


class InstructionError(ValueError):
    """An instruction id this module does not know, or arguments its check cannot use."""


@dataclass(frozen=True)
class Kind:
    """One instruction kind: its IFEval id, the arguments its check reads, the check."""

    id: str
    params: tuple[str, ...]
    check: Callable[[str, Args], bool]


def _int(args: Args, key: str, kind: str) -> int:
    value = args.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InstructionError(f"{kind}: {key} must be a non-negative integer, not {value!r}")
    return value


def _str(args: Args, key: str, kind: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InstructionError(f"{kind}: {key} must be a non-empty string, not {value!r}")
    return value


def _words(args: Args, key: str, kind: str) -> list[str]:
    value = args.get(key)
    if not isinstance(value, list | tuple) or not all(isinstance(w, str) and w.strip() for w in value):
        raise InstructionError(f"{kind}: {key} must be a list of non-empty strings, not {value!r}")
    return [w.strip() for w in value]


def _relation(args: Args, key: str, kind: str) -> str:
    value = args.get(key)
    if value not in RELATIONS:
        raise InstructionError(f"{kind}: {key} must be one of {RELATIONS}, not {value!r}")
    return str(value)


def _compare(count: int, relation: str, threshold: int) -> bool:
    return count < threshold if relation == "less than" else count >= threshold


# the endings a keyword may take and still be the keyword: "riddles", "wars", "disgustingly"
_INFLECTION = r"(?:s|es|'s|’s|ed|d|ing|ly)?"


def _word_pattern(word: str, inflected: bool = True) -> re.Pattern[str]:
    """A word or phrase as a whole word, any case, not inside a longer word; `inflected`: with
    one of the common English endings allowed after it."""
    ending = _INFLECTION if inflected else ""
    return re.compile(r"(?<!\w)" + re.escape(word) + ending + r"(?!\w)", re.IGNORECASE)


# --- punctuation, case, language ---------------------------------------------------------------

_COMMAS = frozenset(",，،、﹐")


def no_comma(text: str, args: Args) -> bool:
    """No comma at all: the ASCII one, nor the fullwidth, Arabic or ideographic ones."""
    return not any(ch in _COMMAS for ch in text)


def english_lowercase(text: str, args: Args) -> bool:
    """In English, and every cased letter lowercase (at least one letter)."""
    return text.islower() and is_language(text, "en")


def english_capital(text: str, args: Args) -> bool:
    """In English, and every cased letter uppercase (at least one letter)."""
    return text.isupper() and is_language(text, "en")


def capital_word_frequency(text: str, args: Args) -> bool:
    """Words written entirely in capitals: fewer than, or at least, `capital_frequency`."""
    kind = "change_case:capital_word_frequency"
    n = _int(args, "capital_frequency", kind)
    return _compare(units.capital_words(text), _relation(args, "capital_relation", kind), n)


def response_language(text: str, args: Args) -> bool:
    """The whole answer in `language` (ISO 639-1), by `verifiers.instructions.language`."""
    return is_language(text, _str(args, "language", "language:response_language"))


# --- length ------------------------------------------------------------------------------------


def number_words(text: str, args: Args) -> bool:
    kind = "length_constraints:number_words"
    return _compare(units.words(text), _relation(args, "relation", kind), _int(args, "num_words", kind))


def number_sentences(text: str, args: Args) -> bool:
    kind = "length_constraints:number_sentences"
    n = _int(args, "num_sentences", kind)
    return _compare(len(units.sentences(text)), _relation(args, "relation", kind), n)


_DIVIDER = re.compile(r"\s?\*\*\*\s?")


def number_paragraphs(text: str, args: Args) -> bool:
    """Exactly `num_paragraphs` paragraphs between markdown dividers ``***``; an empty paragraph
    between two dividers fails, a divider opening or closing the answer is allowed."""
    want = _int(args, "num_paragraphs", "length_constraints:number_paragraphs")
    parts = _DIVIDER.split(text)
    inner = parts[1:-1]
    if any(not p.strip() for p in inner):
        return False
    return sum(1 for p in parts if p.strip()) == want


def _blank_line_paragraphs(text: str) -> list[str]:
    return [p for p in text.split("\n\n") if p.strip()]


def nth_paragraph_first_word(text: str, args: Args) -> bool:
    """Exactly `num_paragraphs` paragraphs separated by blank lines, the `nth_paragraph`-th (from
    1) starting with `first_word` (any case, after quotes and markup)."""
    kind = "length_constraints:nth_paragraph_first_word"
    want = _int(args, "num_paragraphs", kind)
    nth = _int(args, "nth_paragraph", kind)
    word = _str(args, "first_word", kind).strip().lower()
    paragraphs = _blank_line_paragraphs(text)
    if len(paragraphs) != want or not 1 <= nth <= len(paragraphs):
        return False
    return units.first_word(paragraphs[nth - 1].strip()) == word


# --- content -----------------------------------------------------------------------------------


def number_placeholders(text: str, args: Args) -> bool:
    """At least `num_placeholders` spans in square brackets on one line, such as ``[address]``."""
    want = _int(args, "num_placeholders", "detectable_content:number_placeholders")
    found = 0
    pos = 0
    while found < want:
        opening = text.find("[", pos)
        if opening < 0:
            break
        closing = text.find("]", opening + 1)
        newline = text.find("\n", opening + 1)
        if closing < 0:
            break
        if 0 <= newline < closing:  # no bracket on this line closes: go to the next line
            pos = newline + 1
            continue
        found += 1
        pos = closing + 1
    return found >= want


def postscript(text: str, args: Args) -> bool:
    """A line that starts with the postscript marker (``P.S.``, ``P.P.S``: any case, a space
    allowed after each period)."""
    marker = _str(args, "postscript_marker", "detectable_content:postscript").strip()
    letters = [re.escape(ch) for ch in marker.rstrip(".") if ch != "."] if "." in marker else None
    if letters:
        body = r"\.\s?".join(letters) + (r"\." if marker.endswith(".") else "")
    else:
        body = re.escape(marker)
    return re.search(r"^\s*" + body, text, flags=re.IGNORECASE | re.MULTILINE) is not None


def keywords_existence(text: str, args: Args) -> bool:
    """Every one of `keywords`, as a whole word or phrase, any case."""
    words = _words(args, "keywords", "keywords:existence")
    return all(_word_pattern(w).search(text) for w in words)


def keyword_frequency(text: str, args: Args) -> bool:
    """`keyword` (as a whole word, any case): fewer than, or at least, `frequency` times."""
    kind = "keywords:frequency"
    word = _str(args, "keyword", kind).strip()
    count = sum(1 for _ in _word_pattern(word).finditer(text))
    return _compare(count, _relation(args, "relation", kind), _int(args, "frequency", kind))


def forbidden_words(text: str, args: Args) -> bool:
    """None of `forbidden_words`, as whole words, in any case."""
    words = _words(args, "forbidden_words", "keywords:forbidden_words")
    return not any(_word_pattern(w).search(text) for w in words)


def letter_frequency(text: str, args: Args) -> bool:
    """The character `letter` (any case): fewer than, or at least, `let_frequency` times."""
    kind = "keywords:letter_frequency"
    letter = _str(args, "letter", kind).strip().lower()
    if len(letter) != 1:
        raise InstructionError(f"{kind}: letter must be one character, not {letter!r}")
    count = text.lower().count(letter)
    return _compare(count, _relation(args, "let_relation", kind), _int(args, "let_frequency", kind))


# --- format ------------------------------------------------------------------------------------

_BULLET = re.compile(r"^[ \t]*[*+-][ \t]+\S", re.MULTILINE)


def number_bullet_lists(text: str, args: Args) -> bool:
    """Exactly `num_bullets` markdown bullet points: lines starting with ``*``, ``-`` or ``+`` and
    a space (nested ones count too)."""
    want = _int(args, "num_bullets", "detectable_format:number_bullet_lists")
    return sum(1 for _ in _BULLET.finditer(text)) == want


_HIGHLIGHT = re.compile(r"\*\*([^\n*]+)\*\*|\*([^\n*]+)\*")


def number_highlighted_sections(text: str, args: Args) -> bool:
    """At least `num_highlights` spans highlighted with markdown on one line: ``*italic*`` or
    ``**bold**``, with some text inside."""
    want = _int(args, "num_highlights", "detectable_format:number_highlighted_sections")
    found = sum(1 for m in _HIGHLIGHT.finditer(text) if (m.group(1) or m.group(2)).strip())
    return found >= want


def multiple_sections(text: str, args: Args) -> bool:
    """At least `num_sections` section marks: `section_spliter` (as written, its case too)
    followed by a number, such as ``SECTION 1``."""
    kind = "detectable_format:multiple_sections"
    splitter = _str(args, "section_spliter", kind).strip()
    want = _int(args, "num_sections", kind)
    marks = re.findall(r"(?<!\w)" + re.escape(splitter) + r"\s?\d+", text)
    return len(marks) >= want


_FENCE_OPEN = re.compile(r"^```(?:json)?", re.IGNORECASE)


def json_format(text: str, args: Args) -> bool:
    """The whole answer is one JSON value, optionally inside a ```json fence."""
    body = text.strip()
    opened = _FENCE_OPEN.match(body)
    if opened:
        body = body[opened.end() :]
    body = body.removesuffix("```").strip()
    try:
        json.loads(body)
    except (ValueError, RecursionError):  # nested past the recursion limit is no answer either
        return False
    return True


def title(text: str, args: Args) -> bool:
    """A title in double angular brackets, on one line, with text inside: ``<<poem of joy>>``.
    (Scanned line by line, from a line's first ``<<`` to its last ``>>``: a regex would retry every
    ``<<`` of a long line.)"""
    for line in text.split("\n"):
        opening = line.find("<<")
        closing = line.rfind(">>")
        if 0 <= opening and opening + 2 <= closing and line[opening + 2 : closing].strip("<> \t"):
            return True
    return False


_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


def constrained_response(text: str, args: Args) -> bool:
    """One of the options IFEval offers ("My answer is yes." / "no." / "maybe.")."""
    options = args.get("options") or _OPTIONS
    return any(option in text for option in options)


def two_responses(text: str, args: Args) -> bool:
    """Two different answers separated by six asterisks ``******``, and nothing else between."""
    parts = text.split("******")
    if any(not p.strip() for p in parts[1:-1]):
        return False
    answers = [p.strip() for p in parts if p.strip()]
    return len(answers) == 2 and answers[0] != answers[1]


def repeat_prompt(text: str, args: Args) -> bool:
    """The answer opens with `prompt_to_repeat` word for word (any case), and goes on to answer."""
    request = _str(args, "prompt_to_repeat", "combination:repeat_prompt").strip().lower()
    answer = text.strip().lower()
    return answer.startswith(request) and bool(answer[len(request) :].strip())


def end_checker(text: str, args: Args) -> bool:
    """The answer ends with `end_phrase` (any case), nothing after it but a closing quote."""
    phrase = _str(args, "end_phrase", "startend:end_checker").strip().lower()
    return text.strip().strip('"').lower().endswith(phrase)


def quotation(text: str, args: Args) -> bool:
    """The whole answer is wrapped in double quotation marks."""
    body = text.strip()
    return len(body) > 1 and body[0] == '"' and body[-1] == '"'


def _kinds(*rows: tuple[str, tuple[str, ...], Callable[[str, Args], bool]]) -> dict[str, Kind]:
    return {row[0]: Kind(*row) for row in rows}


KINDS: dict[str, Kind] = _kinds(
    ("change_case:capital_word_frequency", ("capital_frequency", "capital_relation"), capital_word_frequency),
    ("change_case:english_capital", (), english_capital),
    ("change_case:english_lowercase", (), english_lowercase),
    ("combination:repeat_prompt", ("prompt_to_repeat",), repeat_prompt),
    ("combination:two_responses", (), two_responses),
    ("detectable_content:number_placeholders", ("num_placeholders",), number_placeholders),
    ("detectable_content:postscript", ("postscript_marker",), postscript),
    ("detectable_format:constrained_response", (), constrained_response),
    ("detectable_format:json_format", (), json_format),
    ("detectable_format:multiple_sections", ("section_spliter", "num_sections"), multiple_sections),
    ("detectable_format:number_bullet_lists", ("num_bullets",), number_bullet_lists),
    ("detectable_format:number_highlighted_sections", ("num_highlights",), number_highlighted_sections),
    ("detectable_format:title", (), title),
    ("keywords:existence", ("keywords",), keywords_existence),
    ("keywords:forbidden_words", ("forbidden_words",), forbidden_words),
    ("keywords:frequency", ("keyword", "frequency", "relation"), keyword_frequency),
    ("keywords:letter_frequency", ("letter", "let_frequency", "let_relation"), letter_frequency),
    ("language:response_language", ("language",), response_language),
    (
        "length_constraints:nth_paragraph_first_word",
        ("num_paragraphs", "nth_paragraph", "first_word"),
        nth_paragraph_first_word,
    ),
    ("length_constraints:number_paragraphs", ("num_paragraphs",), number_paragraphs),
    ("length_constraints:number_sentences", ("num_sentences", "relation"), number_sentences),
    ("length_constraints:number_words", ("num_words", "relation"), number_words),
    ("punctuation:no_comma", (), no_comma),
    ("startend:end_checker", ("end_phrase",), end_checker),
    ("startend:quotation", (), quotation),
)


# An answer that restates this share of its prompt (outside a repetition the prompt asked for) is
# the instructions quoted back, not an answer: GPT-4's IFEval answers restate at most 0.61.
RESTATED_SHARE = 0.8


def restates(text: str, prompt: str, repeated: str | None = None) -> bool:
    """Whether `text` restates `prompt` instead of answering it: `RESTATED_SHARE` or more of the
    prompt's six-word runs reappear in it, once a requested repetition of `repeated` (the request
    to repeat, when the prompt asks for one) is taken off its start; or, after that repetition,
    that share of what the prompt says besides the request (the instruction to repeat it)."""
    body = text.strip()
    if repeated and body.lower().startswith(repeated.strip().lower()):
        body = body[len(repeated.strip()) :]
        rest = prompt.replace(repeated.strip(), " ")  # what the prompt says besides the request
        if rest != prompt and units.echoed_share(body, rest) >= RESTATED_SHARE:
            return True
    return units.echoed_share(body, prompt) >= RESTATED_SHARE


def follows(kind: str, args: Args, text: str) -> bool:
    """Whether `text` follows the instruction `kind` with arguments `args`. An empty (or blank)
    answer follows none: it answers nothing, whatever a check of absence ("no commas", "fewer
    than 5 sentences") would say of it.

    Raises InstructionError for an unknown kind or arguments its check cannot use."""
    found = KINDS.get(kind)
    if found is None:
        raise InstructionError(f"unknown instruction kind {kind!r}")
    if not isinstance(text, str):
        raise InstructionError(f"the answer must be a string, not {type(text).__name__}")
    if not text.strip():
        found.check(text, args)  # the arguments are checked all the same
        return False
    return found.check(text, args)
