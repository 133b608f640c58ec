"""How sure the model was of the option it picked, read from the alternatives at the answer.

A multiple-choice reply's confidence is not the sampled letter's probability alone: a model that
gives "A" 0.30 and "B" 0.29 has not chosen, while one that gives "A" 0.30 and every other letter
0.01 has (the rest of its mass went to spellings such as " A" or "(A", or to other words). So this
verifier finds the answer position, the first generated token that is an option letter (a
leading space or parenthesis and a trailing ")", "." or ":" allowed), and reads the top-k
alternatives the backend returned there. Each option letter's probability is the sum over its
spellings among the alternatives; a letter absent from the top k counts 0 (its true mass is at
most the k-th alternative's, and spreading the unread mass over absent letters would credit
letters the model may never have considered). Then:

- ``prob`` (default): the chosen letter's share of the mass of the option letters;
- ``margin``: that share minus the runner-up letter's share, floored at 0 (0 when the sampled
  letter was not the likeliest).

It abstains when no generated token is an option letter or the backend gave no alternatives. It
needs them asked for: it declares ``top_logprobs`` (the `router.verification.wanted_top_logprobs`
convention), which the cascade adds to the tier's requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from router.generation import MAX_TOP_LOGPROBS, Generation, GenerationRequest, TokenLogprob
from verifiers.base import Score, VerifierContext

STATS = ("prob", "margin")


def option_letter(piece: str, letters: str) -> str | None:
    """The option letter a token spells ("B", " B", "(B", "B)", "B."), or None."""
    core = piece.strip()
    if core.startswith("("):
        core = core[1:]
    if core[-1:] in (")", ".", ":"):
        core = core[:-1]
    return core if len(core) == 1 and core in letters else None


@dataclass(frozen=True)
class ChoiceVerifier:
    stat: str = "prob"
    letters: str = "ABCD"
    top_logprobs: int = 5  # the alternatives asked of the backend per token
    name: str = "choice"

    def __post_init__(self) -> None:
        if self.stat not in STATS:
            raise ValueError(f"stat must be one of {', '.join(STATS)}, not {self.stat!r}")
        if not isinstance(self.letters, str) or not 2 <= len(self.letters) <= 26:
            raise TypeError("letters must be a string of 2 to 26 option letters")
        if not self.letters.isalpha() or not self.letters.isupper() or len(set(self.letters)) != len(self.letters):
            raise ValueError(f"letters must be distinct upper-case letters, not {self.letters!r}")
        if isinstance(self.top_logprobs, bool) or not isinstance(self.top_logprobs, int):
            raise TypeError("top_logprobs must be an integer")
        if not 2 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in 2..{MAX_TOP_LOGPROBS}")
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")

    def answer_position(self, tokens: tuple[TokenLogprob, ...]) -> tuple[int, str] | None:
        for i, token in enumerate(tokens):
            letter = option_letter(token.token, self.letters)
            if letter is not None:
                return i, letter
        return None

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        tokens = candidate.top_logprobs
        if not tokens:
            return Score.abstain("no top-k logprobs: the backend did not return them")
        found = self.answer_position(tokens)
        if found is None:
            return Score.abstain(f"no generated token is an option letter ({self.letters})")
        position, chosen = found
        at = tokens[position]
        if not at.top:
            return Score.abstain("no alternatives at the answer position")
        mass = dict.fromkeys(self.letters, 0.0)
        alternatives = list(at.top)
        if (at.token, at.logprob) not in alternatives:  # sampled from below the top k
            alternatives.append((at.token, at.logprob))
        for piece, logprob in alternatives:
            letter = option_letter(piece, self.letters)
            if letter is not None and math.isfinite(logprob):
                mass[letter] += math.exp(min(0.0, logprob))
        total = math.fsum(mass.values())
        if total <= 0.0:
            return Score.abstain("the option letters carry no probability at the answer position")
        share = {letter: m / total for letter, m in mass.items()}
        runner_up = max((v for letter, v in share.items() if letter != chosen), default=0.0)
        details: dict[str, Any] = {
            "position": position,
            "letter": chosen,
            "letters_mass": total,  # how much of the model's mass went to option letters at all
            "shares": {letter: round(v, 6) for letter, v in share.items() if v > 0.0},
            "margin": share[chosen] - runner_up,
        }
        if self.stat == "prob":
            value, what = share[chosen], "share of the option letters' probability"
        else:
            value, what = max(0.0, share[chosen] - runner_up), "margin over the runner-up letter"
        value = min(1.0, max(0.0, value))
        return Score(value, f"{chosen}: {what} {value:.3f} at token {position}", details)


def make_choice(params: dict[str, Any], ctx: VerifierContext) -> ChoiceVerifier:
    return ChoiceVerifier(**params)
