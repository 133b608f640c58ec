"""HumanEval: write a Python function from its signature and docstring; graded by its hidden tests.

The model and every verifier see only the prompt (signature, docstring and the examples in it).
The `test` field runs only in the grader, in the sandbox.
"""

from __future__ import annotations

from pathlib import Path

from evals.data import HUMANEVAL, fetch, read_jsonl
from evals.grading import Grade, grade_code_tests
from evals.suites.base import AnswerKey, Item, Suite
from router.generation import Message

PROMPT = (
    "Complete the following Python function. Reply with the whole function, including its "
    "signature and the imports it needs, in one ```python code block.\n\n```python\n{prompt}```"
)


class HumanEval(Suite):
    name = "humaneval"
    task = "code"
    max_tokens = 512
    version = "2"  # 2: code cut off after a complete function keeps its parsing prefix
    source = f"HumanEval, 164 items: {HUMANEVAL.describe()}"
    timeout_s = 20.0

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        rows = read_jsonl(fetch(HUMANEVAL, cache_dir))
        return [
            Item(
                id=row["task_id"],
                messages=(Message("user", PROMPT.format(prompt=row["prompt"])),),
                answer_key=AnswerKey(tests=row["test"], entry_point=row["entry_point"], prompt=row["prompt"]),
            )
            for row in rows
        ]

    async def grade(self, item: Item, text: str) -> Grade:
        key = item.answer_key
        assert key.tests is not None
        return await grade_code_tests(
            text, key.tests, prompt=key.prompt, entry_point=key.entry_point, timeout_s=self.timeout_s
        )
