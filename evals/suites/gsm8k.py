"""GSM8K test: grade-school maths word problems, graded on the final number."""

from __future__ import annotations

from pathlib import Path

from evals.data import GSM8K_TEST, fetch, read_jsonl
from evals.grading import Grade, grade_numeric
from evals.suites.base import AnswerKey, Item, Suite
from router.generation import Message

PROMPT = (
    "Solve the following math problem. Reason step by step, then give the final answer as a "
    "number in \\boxed{{}}.\n\n{question}"
)


def reference_of(answer: str) -> str:
    """GSM8K's solutions end with '#### N'; N may carry thousands commas."""
    _, sep, tail = answer.rpartition("####")
    if not sep:
        raise ValueError("GSM8K answer without '####'")
    return tail.strip().replace(",", "")


class GSM8K(Suite):
    name = "gsm8k"
    task = "math"
    max_tokens = 512
    # 2: a final answer stated in a sentence with one number is read
    # 3: an answer cut off at its token limit is read by its stated markers only, never by its
    #    last number (gsm8k/656: a loop repeating the question's "10 pages/day", graded right at 2)
    version = "3"
    source = f"GSM8K test, 1,319 items: {GSM8K_TEST.describe()}"

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        rows = read_jsonl(fetch(GSM8K_TEST, cache_dir))
        return [
            Item(
                id=f"gsm8k/{i}",
                messages=(Message("user", PROMPT.format(question=row["question"].strip())),),
                answer_key=AnswerKey(reference=reference_of(row["answer"])),
            )
            for i, row in enumerate(rows)
        ]

    async def grade(self, item: Item, text: str) -> Grade:
        return grade_numeric(text, item.answer_key.reference)

    async def grade_answer(self, item: Item, text: str, *, cut_off: bool) -> Grade:
        return grade_numeric(text, item.answer_key.reference, cut_off=cut_off)
