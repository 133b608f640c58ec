"""The `instructions` verifier: does the answer do what the request's own words asked of its form?

Instruction-following traffic ("answer in lowercase", "at least 300 words", "wrap the answer in
double quotes", "exactly 3 bullet points", "end with the phrase ...", "respond in Hindi") states
checks a program can run, and a small model misses them often; the default config otherwise has
no way to tell such an answer from a good one. This verifier reads the constraints from the
request itself (`parse`, `read_words`; never from an eval's answer key or the request's
metadata), checks the answer against each with IFEval's strict checks (`checks`, with `text` for
words and sentences and `language` for languages), and scores the fraction it follows
(``stat = "fraction"``, the default) or 1 only when it follows all (``stat = "all"``). It abstains
when the request states no constraint it can read. An answer that restates the request instead
of answering it (80% of the request's six-word runs, outside a repetition the request asked for)
scores 0, since quoting "include the keyword X" contains X.

Params: ``stat``, ``max_chars`` (200,000: a longer answer scores 0 unread), ``name``.
"""

from verifiers.instructions.verifier import InstructionsVerifier, make_instructions

__all__ = ["InstructionsVerifier", "make_instructions"]
