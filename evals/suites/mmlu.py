"""MMLU test: four-option questions over 57 subjects, sampled evenly across subjects."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from evals.data import MMLU_TEST, fetch, read_jsonl
from evals.grading import CHOICE_LETTERS, Grade, grade_choice
from evals.suites.base import AnswerKey, Item, Suite, stratified
from router.generation import Message

PROMPT = (
    "The following is a multiple choice question about {topic}. Reply with the letter of the "
    "correct option (A, B, C or D) only.\n\n{question}\nA. {a}\nB. {b}\nC. {c}\nD. {d}"
)
# Two worked exchanges, written for this suite (not MMLU items), show the reply format: small chat
# models asked for "the letter only" otherwise start reasoning and run out of tokens first.
SHOTS = (
    (
        dict(
            topic="astronomy",
            question="Which planet is closest to the Sun?",
            a="Venus",
            b="Mercury",
            c="Earth",
            d="Mars",
        ),
        "B",
    ),
    (dict(topic="elementary mathematics", question="What is 7 multiplied by 8?", a="54", b="48", c="64", d="56"), "D"),
)


def messages_for(**fields: str) -> tuple[Message, ...]:
    shots: list[Message] = []
    for example, letter in SHOTS:
        shots += [Message("user", PROMPT.format(**example)), Message("assistant", letter)]
    return (*shots, Message("user", PROMPT.format(**fields)))


class MMLU(Suite):
    name = "mmlu"
    task = "choice"
    max_tokens = 32
    top_logprobs = 5  # the `choice` verifier reads the option letters' alternatives
    version = "2"
    source = f"MMLU test, 14,042 items in 57 subjects: {MMLU_TEST.describe()}"

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        items = []
        for i, row in enumerate(read_jsonl(fetch(MMLU_TEST, cache_dir))):
            if row.get("correct_answer") not in tuple(CHOICE_LETTERS):
                continue  # the file carries two stray header rows
            messages = messages_for(
                topic=row["topic"],
                question=row["question"].strip(),
                a=row["answer_a"],
                b=row["answer_b"],
                c=row["answer_c"],
                d=row["answer_d"],
            )
            items.append(
                Item(
                    id=f"mmlu/{i}",  # the row number in the pinned file: stable
                    messages=messages,
                    answer_key=AnswerKey(reference=row["correct_answer"]),
                    group=row["topic"],
                )
            )
        return items

    def select(self, items: Sequence[Item], limit: int | None, seed: int) -> list[Item]:
        return stratified(items, limit, seed, salt=self.name)

    async def grade(self, item: Item, text: str) -> Grade:
        return grade_choice(text, item.answer_key.reference)
