"""The suite protocol: items, how to ask for them, and how to grade the answers.

A suite owns its prompt format, answer extraction and grader. An `Item` keeps apart what a
caller would send (`messages`) and what only the grader may see (`answer_key`): the runner builds
the request a model and every verifier get from `messages` alone, so a verifier can never read
the reference answer or a benchmark's hidden tests.
"""

from __future__ import annotations

import abc
import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.grading import Grade
from router.generation import GenerationRequest, Message, ToolSpec


@dataclass(frozen=True)
class AnswerKey:
    """Grader-only: the reference answer and, for code, the hidden tests."""

    reference: Any = None
    tests: str | None = None
    entry_point: str | None = None
    prompt: str = ""  # the code stub the answer completes (already public, kept to rebuild the program)


@dataclass(frozen=True)
class Item:
    id: str
    messages: tuple[Message, ...]
    answer_key: AnswerKey = field(repr=False)
    group: str = ""  # a subject or category, for stratified sampling and per-group results
    tools: tuple[ToolSpec, ...] = ()  # the functions a caller offers with the messages (`Suite.request` sends them)

    @property
    def prompt_sha(self) -> str:
        """Identity of what the model is asked, the messages and the tools offered with them: part of
        every cache key, so two items that ask one question with other tools (BFCL's `multiple`
        category repeats `simple` questions among more functions) never share a generation. An item
        that offers no tools keeps the identity of its messages alone, as every stored run has it."""
        asked: list[Any] = [[m.role, m.content] for m in self.messages]
        if self.tools:
            asked.append([[t.name, t.description, t.parameters_json, t.strict] for t in self.tools])
        payload = json.dumps(asked, ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()


class Suite(abc.ABC):
    """A benchmark. Subclasses set the class attributes and implement `load` and `grade`."""

    name: str
    task: str = "text"  # what kind of answer: math, code, choice or text (sent as a request hint)
    max_tokens: int = 512
    top_logprobs: int = 0  # alternatives per token stored with each generation, for verifiers that read them
    version: str = "1"  # bump when the prompt format or the grader changes
    source: str = ""  # where the data comes from, for reports

    @abc.abstractmethod
    def load(self, cache_dir: Path | None = None) -> list[Item]:
        """Every item, in a fixed order."""

    @abc.abstractmethod
    async def grade(self, item: Item, text: str) -> Grade:
        """Whether `text` answers `item` correctly."""

    async def grade_answer(self, item: Item, text: str, *, cut_off: bool) -> Grade:
        """How the runner grades a stored answer: `grade`, told whether the answer was cut off at
        its token limit. A suite whose grader would read a cut-off answer too kindly (the last
        number of a loop taken for a final answer) overrides this; the others need not."""
        return await self.grade(item, text)

    def request(self, item: Item, request: GenerationRequest) -> GenerationRequest:
        """The request for `item` with what a caller sends besides the messages (a structured-output
        suite's `response_format`). Public fields only: never anything from the answer key."""
        return request

    def select(self, items: Sequence[Item], limit: int | None, seed: int) -> list[Item]:
        """`limit` items drawn by `seed`. Prefix-stable: a larger limit keeps the smaller one's items,
        so growing a run only adds items."""
        order = list(items)
        random.Random(f"{self.name}:{seed}").shuffle(order)
        return order if limit is None else order[:limit]

    @property
    def fingerprint(self) -> str:
        return f"{self.name}@{self.version}"


def stratified(items: Sequence[Item], limit: int | None, seed: int, salt: str) -> list[Item]:
    """Round-robin over groups, each group shuffled by seed: every group is represented and the
    sample keeps the groups balanced at any limit. Prefix-stable like `Suite.select`."""
    rng = random.Random(f"{salt}:{seed}")
    groups: dict[str, list[Item]] = {}
    for item in items:
        groups.setdefault(item.group, []).append(item)
    names = sorted(groups)
    rng.shuffle(names)
    for name in names:
        rng.shuffle(groups[name])
    order: list[Item] = []
    depth = 0
    while len(order) < len(items):
        for name in names:
            if depth < len(groups[name]):
                order.append(groups[name][depth])
        depth += 1
    return order if limit is None else order[:limit]
