"""Banking77: intent classification of customer-service messages into 77 labels.

Classification is the routing workload a small model is meant to carry: a short text in, one label
out. Banking77 (Casanueva et al., 2020; PolyAI, CC-BY-4.0) holds 3,080 test messages, 40 per label,
read from ``evals/data/banking77`` (PROVENANCE.md beside it).

Each item is a chat request whose system message lists the 77 labels (the same text for every
item, so a tier's prefix cache holds it) and whose user message is the customer's text; the answer
must be the label alone. Grading: the answer, trimmed of whitespace, quotes, backticks (a Markdown
code span) and full stops at either end, equals the reference label, both lower-cased (one of the
dataset's own labels is capitalised, `Refund_not_showing_up`). Items are drawn stratified by
label, so any `--limit` keeps the labels balanced.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

from evals.grading import Grade
from evals.suites.base import AnswerKey, Item, Suite, stratified
from router.generation import Message

DATA = Path(__file__).resolve().parents[1] / "data" / "banking77"

SYSTEM = (
    "You classify customer messages to a bank by intent. Reply with exactly one label from this "
    "list and nothing else:\n{labels}"
)


_WRAPPING = " \t\r\n`\"'."


def normalise_label(text: str) -> str:
    """The answer without its wrapping, in any order (`"card_arrival".`, `` `'card_arrival'` ``),
    lower-cased: whitespace, backticks, quotes and full stops off both ends (no label begins or ends
    with one), in one pass whatever the answer holds."""
    return text.strip(_WRAPPING).lower()


class Banking77(Suite):
    name = "banking77"
    task = "text"
    max_tokens = 24
    # 2: quotes, backticks and a full stop trimmed in any nesting; 3: labels compared lower-cased on both
    # sides (2 could never grade Refund_not_showing_up right), the wrapping trimmed in one pass (2's loop,
    # one layer at a time, took quadratic time over an answer of alternating quotes and full stops)
    version = "3"
    source = (
        "Banking77 test (PolyAI, Casanueva et al. 2020), 3,080 items, CC-BY-4.0 (evals/data/banking77/PROVENANCE.md)"
    )

    def __init__(self, root: Path = DATA) -> None:
        self.root = root
        self._known: frozenset[str] | None = None

    def labels(self) -> list[str]:
        return list(json.loads((self.root / "categories.json").read_text()))

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        system = Message("system", SYSTEM.format(labels="\n".join(self.labels())))
        with (self.root / "test.csv").open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        return [
            Item(
                id=f"banking77/{n}",
                messages=(system, Message("user", row["text"].strip())),
                answer_key=AnswerKey(reference=row["category"]),
                group=row["category"],
            )
            for n, row in enumerate(rows)
        ]

    def select(self, items: Sequence[Item], limit: int | None, seed: int) -> list[Item]:
        return stratified(items, limit, seed, self.name)

    async def grade(self, item: Item, text: str) -> Grade:
        if self._known is None:
            self._known = frozenset(normalise_label(label) for label in self.labels())
        got = normalise_label(text)
        right = got == normalise_label(item.answer_key.reference)
        return Grade(right, got[:80], "" if got in self._known else "not a label")
