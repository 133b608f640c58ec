"""A constraint read from a prompt, and what every reader of one shares.

`verifiers.instructions.parse` and `verifiers.instructions.read_words` read constraints sentence by
sentence and add each to a list once; the type and those small helpers live here so neither
imports the other's internals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

IGNORE = re.IGNORECASE


@dataclass(frozen=True)
class Constraint:
    """One constraint read from a prompt: an IFEval kind, its check's arguments, and the words of
    the prompt it was read from."""

    kind: str
    args: dict[str, Any] = field(default_factory=dict, hash=False)
    where: str = field(default="", compare=False)


Found = list[Constraint]

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?;])\s+(?=[A-Z0-9\"'(*])|\n+")

# a sentence about words in capitals ("use words with all capital letters at least 3 times"),
# which is neither the whole answer in capitals nor a word to include
CAPITAL_WORDS = re.compile(
    r"\b(?:words?|phrases?|stress words)\b[^.!?\n]{0,30}?\b(?:all capital letters|all caps|all-caps|capital letters|"
    r"capitalized|capitalised|uppercase|upper case)\b|\bcapitali[sz]e (?:a few|some|several|key|important) words\b|"
    r"\b(?:capitalized|all-caps|all caps|capital) words\b",
    IGNORE,
)


def sentences(prompt: str) -> list[str]:
    """The prompt's sentences and lines, stripped, none empty."""
    return [s.strip() for s in _SENTENCE_SPLIT.split(prompt) if s.strip()]


def emit(out: Found, kind: str, where: str, **args: Any) -> None:
    """Add a constraint to `out` unless one of the same kind and arguments is there already."""
    c = Constraint(kind, args, where.strip()[:200])
    if all(not (o.kind == c.kind and o.args == c.args) for o in out):
        out.append(c)
