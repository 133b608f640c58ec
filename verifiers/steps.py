"""Re-check the arithmetic of a worked solution: every step it writes as `expression = value`.

A maths answer shows its work as equations ("She has 16 - 3 = 13 eggs left", "9 * $2 = $18"),
and GSM8K-style answers also carry calculator annotations ("<<9*2=18>>"). Most wrong answers
reason wrongly rather than compute wrongly, but an answer whose own step is false (on RouteLLM's
published Mixtral-8x7B GSM8K answers, one in eighteen) is almost never right (8%), and an answer
that stops before its steps are done states none of its conclusion. Computing a step costs
microseconds and reads nothing but the answer, so it can judge any tier's text, a hosted model's
included.

What counts as a step: an `=` with plain arithmetic on its left (numbers, `+ - * / ^ x × ÷`,
parentheses; currency signs and thousands commas allowed) that has at least one operator, and a
number or another such expression on its right; in a chain `a = b = c` each `=` is its own step.
The left side is the longest run of arithmetic before the `=` that parses ("3 sprints * 60 = 180"
has none: its operands carry units, so it is not read). Each step is evaluated exactly by
`verifiers.arithmetic` (no `eval`: a parser with every size bounded) and compared with the value
written after the `=`, which may be rounded to the decimals it writes (at least two: 33.33 for
100/3, not 33). A calculator annotation `<<e=v>>` is a step of its own and is then read as the
value it stands for.

Score: the share of the steps read that hold (1 when every one does); abstains when the answer
writes no step it can read. Bounded work: at most ``max_steps`` steps on the first
``max_chars`` characters, each side of a step at most `MAX_SIDE` characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from router.generation import Generation, GenerationRequest
from verifiers.arithmetic import Unsupported, agrees, evaluate, stated_value
from verifiers.base import Score, VerifierContext, require_integers

MAX_SIDE = 160  # characters of one side of a step read: a step's expression is short
_ANNOTATION = re.compile(r"<<([^<>=\n]{1,200})=([^<>\n]{1,60})>>")
_ARITH = set("0123456789.,+-*/^()×÷·−xX $ ")  # what an arithmetic side may hold (currency signs dropped)
_OPERATOR = re.compile(r"[-+*/^×÷·−]|(?<=[\d)\s])[xX](?=[\s\d(])")
_BOUNDARY = re.compile(r"(?<=[\s(,$])|^")
_VALUE = re.compile(r"\s*[$€£]?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


@dataclass(frozen=True)
class Step:
    expression: str
    written: str
    holds: bool


def _clean(side: str) -> str:
    return side.replace("$", "").replace("€", "").replace("£", "").strip(" ,")


def _parse(side: str) -> Fraction | None:
    text = _clean(side)
    if not text or not _OPERATOR.search(text):
        return None
    try:
        return evaluate(text)
    except Unsupported:
        return None


def _left_side(text: str, end: int) -> tuple[str, Fraction] | None:
    """The longest run of arithmetic just before `end` that parses, with its value."""
    start = end
    while start > 0 and end - start < MAX_SIDE and text[start - 1] in _ARITH:
        start -= 1
    span = text[start:end]
    # try the longest suffix first, starting at each word boundary, until one parses
    for m in _BOUNDARY.finditer(span):
        candidate = span[m.start() :]
        if not candidate.strip():
            continue
        value = _parse(candidate)
        if value is not None:
            return candidate.strip(), value
    return None


def _right_side(text: str, start: int) -> tuple[str, Fraction, int] | None:
    """What is written after an `=` at `start`: an expression that parses, else one number; with
    its value and the decimals it writes (0 for an expression)."""
    end = start
    while end < len(text) and end - start < MAX_SIDE and text[end] in _ARITH:
        end += 1
    span = text[start:end].rstrip(" ,.")
    value = _parse(span)
    if value is not None:
        return span.strip(), value, 0
    m = _VALUE.match(text, start)
    if m is None:
        return None
    literal = m.group(1).rstrip(",")
    number = stated_value(literal)
    if number is None:
        return None
    return literal, number, len(literal.partition(".")[2])


def _holds(value: Fraction, written: Fraction, decimals: int) -> bool:
    return agrees(written, value, max(decimals, 2)) if decimals else written == value


def read_steps(text: str, max_steps: int = 64) -> list[Step]:
    """Every step of `text` that can be read, each checked, in order."""
    steps: list[Step] = []

    def annotation(m: re.Match[str]) -> str:
        value, written = _parse(m.group(1)), _VALUE.match(m.group(2))
        if value is not None and written is not None and len(steps) < max_steps:
            literal = written.group(1).rstrip(",")
            number = stated_value(literal)
            if number is not None:
                decimals = len(literal.partition(".")[2])
                steps.append(Step(m.group(1).strip(), literal, _holds(value, number, decimals)))
        return " "  # an annotation stands for the value written after it

    prose = _ANNOTATION.sub(annotation, text)
    for m in re.finditer("=", prose):
        if len(steps) >= max_steps:
            break
        left = _left_side(prose, m.start())
        right = _right_side(prose, m.end())
        if left is None or right is None:
            continue
        expression, value = left
        written, number, decimals = right
        steps.append(Step(expression, written, _holds(value, number, decimals)))
    return steps


@dataclass(frozen=True)
class StepsVerifier:
    """The share of an answer's worked arithmetic steps that hold; abstains when it writes none."""

    max_chars: int = 20_000
    max_steps: int = 64
    name: str = "steps"

    def __post_init__(self) -> None:
        require_integers(self, "max_chars", "max_steps")
        if self.max_chars < 1 or self.max_steps < 1:
            raise ValueError("max_chars and max_steps must be positive")
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        steps = read_steps(candidate.text[: self.max_chars], self.max_steps)
        if not steps:
            return Score.abstain("no arithmetic step to re-check")
        wrong = [s for s in steps if not s.holds]
        details: dict[str, Any] = {"steps": len(steps), "wrong": len(wrong)}
        if wrong:
            details["first_wrong"] = f"{wrong[0].expression[:60]} = {wrong[0].written[:20]}"
            reason = f"{len(wrong)} of {len(steps)} steps do not hold: {details['first_wrong']}"
        else:
            reason = f"all {len(steps)} arithmetic steps hold"
        return Score(1.0 - len(wrong) / len(steps), reason, details)


def make_steps(params: dict[str, Any], ctx: VerifierContext) -> StepsVerifier:
    return StepsVerifier(**params)
