"""An exact check for plain arithmetic: recompute what the question asks, compare the final number.

"What is 17 * 3?" has one right answer, and computing it costs microseconds; a token probability
can only guess at it (the small tier's right "The product of 17 and 3 is 51." scores 0.878 mean
confidence, under the maths threshold). So when the request's last user message is nothing but
an arithmetic expression (after a short lead such as "what is" or "calculate", and a trailing
"?" or "="), this verifier evaluates it and scores the answer's final number: 1 when it is the
value, 0 when it is another, 0 when the answer states no number. Anything else, a word problem
included, it abstains on, and the other verifiers of the policy decide.

The prompt is untrusted input, so the evaluator is not Python's: no `eval`, no `ast`, nothing a
prompt could make run. It is a small parser of numbers (digits, an optional decimal part, thousands
commas), `+ - * / ^` (also `**`, `×`, `÷`, `·`, `x`, the Unicode minus) and parentheses, evaluated
in exact fractions, with every size bounded before the work that could grow with it: the message's
length, the number of tokens, the digits of a literal, the nesting depth, the size of every
intermediate value, and a power's exponent and result, which is estimated before it is computed.
Past any bound it abstains; it never hangs on, or is crashed by, what a prompt writes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from router.generation import Generation, GenerationRequest
from verifiers.base import Score, VerifierContext
from verifiers.math_answer import extract_answer, parse_number

MAX_CHARS = 400  # a longer message is not a plain arithmetic question; read no further
MAX_TOKENS = 80
MAX_LITERAL_DIGITS = 40
MAX_DEPTH = 24  # nested parentheses, signs and exponents together
MAX_BITS = 4096  # of any intermediate numerator or denominator: about 1,233 decimal digits
MAX_EXPONENT = 4096
MAX_ANSWER_DIGITS = 1300  # a stated number read exactly (longer: as a float; Python's int() refuses past 4,300)

_LEAD = re.compile(
    r"^(?:(?:please|now|ok(?:ay)?|hey|hi)[,!]?\s+)?(?:(?:can|could)\s+you\s+(?:please\s+)?(?:tell\s+me\s+)?)?"
    r"(?:whats|what(?:'s|’s|\s+is|\s+are|\s+does)?|compute|calculate|evaluate|work\s+out|how\s+much\s+is|solve|find)"
    r"\s*(?:the\s+(?:value|result|answer)\s+of\s*)?[:,]?\s*",
    re.IGNORECASE,
)
_TAIL = re.compile(r"\s*(?:=\s*)?(?:\?+|\.|!)?\s*(?:equal|equals|make|come\s+to)?\s*\??\s*$", re.IGNORECASE)
_TOKEN = re.compile(
    r"\s*(?:(?P<num>[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?|[0-9]+(?:\.[0-9]+)?|\.[0-9]+)"
    r"|(?P<op>\*\*|[-+*/^()×÷·xX−]))"
)
_OPS = {"×": "*", "·": "*", "x": "*", "X": "*", "÷": "/", "−": "-", "**": "^"}
# the number the answer states, as written, to compare exactly (a float loses digits past 2**53)
_LITERAL = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?|[0-9]+(?:\.[0-9]+)?")


class Unsupported(Exception):
    """The text is not plain arithmetic this evaluator computes within its bounds."""


def expression_of(text: str) -> str | None:
    """The arithmetic expression a message asks for, or None when it asks for anything else."""
    if len(text) > MAX_CHARS:
        return None
    body = " ".join(text.split())
    body = _LEAD.sub("", body, count=1)
    body = _TAIL.sub("", body, count=1).strip()
    if not body or not any(c.isdigit() for c in body):
        return None
    return body


def tokens_of(expression: str) -> list[str]:
    """Numbers and operators, or Unsupported for anything else (a letter, a second line, a unit)."""
    out: list[str] = []
    at = 0
    expression = expression.rstrip()
    while at < len(expression):
        m = _TOKEN.match(expression, at)
        if m is None:
            raise Unsupported(f"not arithmetic at {expression[at : at + 12]!r}")
        if m.group("num") is not None:
            number = m.group("num").replace(",", "")
            if len(number) > MAX_LITERAL_DIGITS:
                raise Unsupported("a number longer than the evaluator reads")
            out.append(number)
        else:
            out.append(_OPS.get(m.group("op"), m.group("op")))
        at = m.end()
        if len(out) > MAX_TOKENS:
            raise Unsupported("too long an expression")
    return out


def _fits(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > MAX_BITS or value.denominator.bit_length() > MAX_BITS:
        raise Unsupported("a value larger than the evaluator computes")
    return value


class _Parser:
    """Precedence climbing over the tokens: `+ -` < `* /` < unary sign < `^` (right-associative,
    so -2^2 = -4 and 2^3^2 = 2^9, as written in mathematics)."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.at = 0
        self.depth = 0
        self.operators = 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise Unsupported("the expression ends early")
        self.at += 1
        return token

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Unsupported("nested too deeply")

    def parse(self) -> Fraction:
        value = self.sum()
        if self.peek() is not None:
            raise Unsupported(f"unexpected {self.peek()!r}")
        if self.operators == 0:
            raise Unsupported("a number alone, nothing to compute")
        return value

    def sum(self) -> Fraction:
        value = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            self.operators += 1
            right = self.product()
            value = _fits(value + right if op == "+" else value - right)
        return value

    def product(self) -> Fraction:
        value = self.signed()
        while self.peek() in ("*", "/"):
            op = self.take()
            self.operators += 1
            right = self.signed()
            if op == "*":
                value = _fits(value * right)
            elif right == 0:
                raise Unsupported("division by zero")
            else:
                value = _fits(value / right)
        return value

    def signed(self) -> Fraction:
        if self.peek() in ("+", "-"):
            op = self.take()
            self.enter()
            value = self.signed()
            self.depth -= 1
            return -value if op == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek() != "^":
            return base
        self.take()
        self.operators += 1
        self.enter()
        exponent = self.signed()
        self.depth -= 1
        return _power(base, exponent)

    def atom(self) -> Fraction:
        token = self.take()
        if token == "(":
            self.enter()
            value = self.sum()
            if self.take() != ")":
                raise Unsupported("unbalanced parentheses")
            self.depth -= 1
            return value
        if token[0].isdigit() or token[0] == ".":
            return Fraction(token)
        raise Unsupported(f"unexpected {token!r}")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise Unsupported("a fractional exponent (a root) is not exact")
    n = exponent.numerator
    if abs(n) > MAX_EXPONENT:
        raise Unsupported("too large an exponent")
    if base == 0 and n <= 0:
        raise Unsupported("zero to a power that is not positive")
    size = max(base.numerator.bit_length(), base.denominator.bit_length())
    if base not in (1, -1) and (size - 1) * abs(n) > MAX_BITS:  # estimated before it is computed
        raise Unsupported("a power larger than the evaluator computes")
    return _fits(base**n)


def evaluate(expression: str) -> Fraction:
    """The exact value of a plain arithmetic expression, or Unsupported."""
    return _Parser(tokens_of(expression)).parse()


def stated_value(answer: str) -> Fraction | None:
    """The number a final answer states, exactly where it is written as a plain decimal ("51",
    "1,234.5", "-3"), else as `parse_number` reads it ("3/4", "1 3/4", "\\frac{3}{4}"); None when
    it is not a number."""
    value = parse_number(answer)
    if value is None:
        return None
    literals = _LITERAL.findall(answer)
    if len(literals) == 1 and len(literals[0]) <= MAX_ANSWER_DIGITS:
        exact = Fraction(literals[0].replace(",", ""))
        if math.isclose(float(exact), abs(value), rel_tol=1e-9, abs_tol=1e-12):
            return -exact if value < 0 else exact
    return Fraction(value)


def agrees(stated: Fraction, exact: Fraction, decimals: int) -> bool:
    """The stated number is the value, or the value correctly rounded to the decimals the answer
    writes, at least two (1/3 as 0.33 or 0.333; not as 0.3 or 0)."""
    if stated == exact:
        return True
    if exact.denominator == 1 or decimals < 2:
        return False
    return abs(stated - exact) <= Fraction(1, 2 * 10**decimals)


@dataclass(frozen=True)
class ArithmeticVerifier:
    """1 when the answer's final number is the value of the arithmetic the request asks for, 0
    when it is another or none; abstains when the request is not plain arithmetic."""

    name: str = "arithmetic"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        expression = expression_of(request.last_user_text())
        if expression is None:
            return Score.abstain("not a plain arithmetic question")
        try:
            exact = evaluate(expression)
        except Unsupported as exc:
            return Score.abstain(f"not plain arithmetic it computes: {exc}")
        details: dict[str, Any] = {"expression": expression[:80], "value": _show(exact)}
        # an answer cut off at its token limit is read by what it states, not by where it stopped
        answer = extract_answer(candidate.text, fallback_last_number=candidate.finish_reason != "length")
        if answer is None:
            return Score(0.0, f"{expression[:40]} = {_show(exact)}; the answer states no number", details)
        stated = stated_value(answer)
        details["stated"] = answer[:60]
        if stated is None:
            return Score.abstain(f"cannot read the answer's final number {answer[:40]!r}", details=details)
        literal = _LITERAL.findall(answer)
        decimals = len(literal[-1].partition(".")[2]) if literal else 0
        if agrees(stated, exact, decimals):
            return Score(1.0, f"{expression[:40]} = {_show(exact)}, as the answer states", details)
        return Score(0.0, f"{expression[:40]} = {_show(exact)}, not {answer[:40]}", details)


def _show(value: Fraction) -> str:
    """The value for a reason or a detail: an integer or a short decimal as such, else the fraction
    (clipped: a value may have a thousand digits)."""
    if value.denominator == 1:
        text = str(value.numerator)
    elif 10**12 % value.denominator == 0:
        text = f"{value.numerator / value.denominator:.12g}" if abs(value) < 10**12 else str(value)
    else:
        text = f"{value.numerator}/{value.denominator}"
    return text if len(text) <= 40 else text[:37] + "..."


def make_arithmetic(params: dict[str, Any], ctx: VerifierContext) -> ArithmeticVerifier:
    return ArithmeticVerifier(**params)
