"""The text a detector reads: the request's own, with what hides data from a pattern taken away.

A sender who wants data past a pattern can hide it in ways a reader (or a model) never notices:
invisible characters inside it (zero-width spaces and joiners, soft hyphens, bidi controls, word
joiners: Unicode's format characters), letters and digits that only look like the ASCII ones
(fullwidth `ｊｏｈｎ＠ｅｘａｍｐｌｅ．ｃｏｍ`, Cyrillic `а` for Latin `a`, Arabic-Indic digits), or
an encoding (base64). `scan` runs a detector over a view with all three undone, and maps what it
finds back to the spans of the text as sent, so a redaction replaces exactly what was sent:

- format characters (category Cf) and variation selectors are dropped;
- each character is NFKC-normalised (fullwidth and mathematical letters and digits, ligatures,
  the small and fullwidth `@`), any decimal digit read as its ASCII digit, and the Cyrillic and
  Greek letters that look like Latin ones folded to those (`CONFUSABLES`: a short list, not
  Unicode's whole confusables table);
- a run of 16 or more base64 characters that decodes to printable UTF-8 text is scanned as that
  text too, and a finding inside it is the whole run.

What it does not undo (spacing a value out letter by letter, spelling `at` and `dot`, splitting a
value over two places of a request that are not scanned together): docs/guardrails.md lists them.
ASCII text takes a fast path: its view is itself.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from collections.abc import Callable

from router.guards.findings import Finding

# look-alikes of Latin letters that NFKC leaves alone (Cyrillic, Greek), folded for detection only
CONFUSABLES = str.maketrans(
    "авсеһіјкӏмноррѕтухуԁԛԝАВСЕНІЈКМНОРЅТХУΑΒΕΖΗΙΚΜΝΟΡΤΥΧαοικνρτυχ",
    "abcehijklmhoppstyxydqwABCEHIJKMHOPSTXYABEZHIKMNOPTYXaoiknptux",
)
_VARIATION = range(0xFE00, 0xFE10)
_B64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_MAX_B64_RUNS = 16  # per text: a text of nothing but base64 does not cost a decode per run forever
_MAX_B64_CHARS = 65_536


class View:
    """A text as detectors read it, and where each of its characters came from in the original."""

    def __init__(self, original: str) -> None:
        self.original = original
        if original.isascii():
            self.text = original
            self.origin: list[int] | None = None  # identity
            return
        out: list[str] = []
        origin: list[int] = []
        for i, c in enumerate(original):
            if unicodedata.category(c) == "Cf" or ord(c) in _VARIATION:
                continue
            folded = unicodedata.normalize("NFKC", c) if not c.isascii() else c
            for d in folded:
                if not d.isascii():
                    if unicodedata.category(d) == "Nd":
                        d = str(unicodedata.digit(d))
                    else:
                        d = d.translate(CONFUSABLES)
                out.append(d)
                origin.append(i)
        self.text = "".join(out)
        self.origin = origin

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original span of view[start:end]."""
        if self.origin is None:
            return start, end
        if start >= end or not self.origin:
            return self.origin[start] if start < len(self.origin) else len(self.original), self.origin[-1] + 1
        return self.origin[start], self.origin[end - 1] + 1


def decoded(run: str) -> str | None:
    """The text a base64 run stands for, when it is printable UTF-8 text; else None."""
    if len(run) > _MAX_B64_CHARS:
        return None
    bare = run.rstrip("=")
    padded = bare + "=" * (-len(bare) % 4)
    for alt in (None, b"-_"):
        try:
            raw = base64.b64decode(padded, altchars=alt, validate=True)
        except (binascii.Error, ValueError):
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text and sum(ch.isprintable() or ch in "\n\t\r" for ch in text) >= 0.95 * len(text):
            return text
    return None


def scan(text: str, detect: Callable[[str], list[Finding]]) -> list[Finding]:
    """Every finding of `detect` in `text`, through the view, in the original text's spans."""
    view = View(text)
    found = []
    for f in detect(view.text):
        start, end = view.span(f.start, f.end)
        found.append(Finding(f.kind, start, end, f.score))
    runs = 0
    for m in _B64_RUN.finditer(view.text):
        if runs >= _MAX_B64_RUNS:
            break
        plain = decoded(m.group())
        if plain is None:
            continue
        runs += 1
        start, end = view.span(m.start(), m.end())
        found.extend(Finding(f.kind, start, end, f.score) for f in scan_plain(plain, detect))
    return found


def scan_plain(text: str, detect: Callable[[str], list[Finding]]) -> list[Finding]:
    """`scan` of a decoded text, one level deep (base64 inside base64 is not opened again)."""
    return detect(View(text).text)
