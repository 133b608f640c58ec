"""Each constrained sequence's share of the engine thread, bounded per request.

Grammar work runs in C calls on the engine thread (checking a token, accepting it), and every
other sequence in the batch waits for them. `router.structured.grammar_bound` keeps one token's work small by
construction; this is the second line, for what that estimate gets wrong and for the rare scan of
the whole vocabulary: the engine sums the grammar time each constrained sequence spends (parse
state attached, checks and accepts, measured on the engine thread between tokens), and a sequence
whose sum passes its budget is ended alone with `GrammarBudgetError` (400, the request's format is
what costs). Its neighbours carry on; the engine is never at risk.

The budget grows with the answer: `base_s` for the whole of it (room for a few vocabulary scans,
tens of ms each on 50k-150k tokens) and `per_token_s` per token taken. Measured, a schema within
the bound costs well under 1 ms per token (`scripts/grammar_cost.py`), so a correct request never
meets it; one at 5 ms per token is ended after about 330 tokens, one at 100 ms after about ten.
A single C call cannot be cut short, so what the budget cannot do is end a step already running:
that is the static bound's job.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.errors import RequestError

GRAMMAR_BUDGET_S = 1.0
GRAMMAR_S_PER_TOKEN = 0.002


class GrammarBudgetError(RequestError):
    """A constrained sequence spent more of the engine's time on its grammar than it may."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="grammar_budget_exceeded")


@dataclass(frozen=True)
class GrammarBudget:
    base_s: float = GRAMMAR_BUDGET_S
    per_token_s: float = GRAMMAR_S_PER_TOKEN

    def allows(self, spent_s: float, tokens: int) -> bool:
        return spent_s <= self.base_s + self.per_token_s * tokens

    def error(self, spent_s: float, tokens: int) -> GrammarBudgetError:
        return GrammarBudgetError(
            f"constrained decoding (response_format or a forced tool call) spent {spent_s:.2f} s of the "
            f"engine's time on its grammar over {tokens} tokens; at most {self.base_s:g} s + "
            f"{self.per_token_s * 1e3:g} ms per token. Simplify the schema (fewer alike anyOf branches, "
            "patterns without nested or optional repetitions)"
        )
