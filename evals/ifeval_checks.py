"""IFEval's grader: whether an answer follows one instruction of the benchmark's answer key.

The suite (`evals.suites.ifeval`) calls `follows` once per instruction of an item, with the id
and arguments the benchmark lists for it, and counts the item right when every one is followed
(IFEval's *strict* prompt-level accuracy). The checks themselves are this project's, written from
the paper's definitions, and live in `verifiers.instructions.checks` because the `instructions`
verifier runs the same ones on constraints it reads from the prompt (a verifier may not import
`evals`); what is the grader's alone is here: the arguments come from the answer key, and an
answer that restates the prompt is graded wrong.

How the checks agree with the published grading of GPT-4's answers, per instruction kind, is a
test (tests/evals/test_ifeval_checks.py) and a table in docs/evaluating.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verifiers.instructions.checks import KINDS, InstructionError, restates
from verifiers.instructions.checks import follows as _follows
from verifiers.instructions.parse import request_to_repeat

__all__ = ["KINDS", "InstructionError", "follows"]


def follows(instruction_id: str, kwargs: Mapping[str, Any] | None, text: str, prompt: str | None = None) -> bool:
    """Whether `text` follows the instruction `instruction_id` with the answer key's `kwargs`
    (None values, which the benchmark's file pads every row with, are dropped).

    `prompt` is the item's prompt. With it, an answer that restates the prompt instead of
    answering it follows none of its instructions (`checks.restates`: IFEval's own checks would
    pass a quoted "include the keyword X"), and a repetition the key does not spell out is read
    from the prompt."""
    args = {k: v for k, v in (kwargs or {}).items() if v is not None}
    repeated = request_to_repeat(prompt) if prompt else None
    if instruction_id == "combination:repeat_prompt" and "prompt_to_repeat" not in args and prompt:
        args["prompt_to_repeat"] = repeated or prompt
    followed = _follows(instruction_id, args, text)
    if followed and prompt and restates(text, prompt, args.get("prompt_to_repeat") or repeated):
        return False
    return followed
