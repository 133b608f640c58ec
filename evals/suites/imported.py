"""The suite of an imported run: the prompts of another source's logged answers, and how to grade them.

`tierroute eval import` (see `evals.importer`) turns logged answers into an eval run. Its items are
not a benchmark's: they are written into the run directory as ``import-items.jsonl``, one item per
line, and this suite reads them back, so `eval train` can rebuild each request (and check it
against the hash the run recorded) exactly as it does for a benchmark.

Each item's answer key says how an answer to it is graded, in one of three ways:

- ``reference``: a reference answer and the grader of the item's task (numeric, choice, exact,
  regex, or hidden tests for code), as a benchmark is graded;
- ``per_tier``: the source said which tier's answer was right; an answer is graded by the label
  of the tier that gave it (the key holds each tier's answer to recognise it by);
- ``agreement``: no label at all. An answer is graded right when it agrees with the top tier's
  answer, read by the item's task (the same number, the same option letter, the same JSON value,
  else the same text once whitespace and case are folded). This is a proxy: it measures how often
  a cheaper tier says what the top tier says, not how often either is right, and the run's
  manifest says how many items were graded so.

Like every suite's, the answer key goes only to the grader: the request that verifiers see is
the item's messages and the run's task.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from evals.data import read_jsonl
from evals.grading import (
    CHOICE_LETTERS,
    Grade,
    extract_choice,
    grade_choice,
    grade_code_tests,
    grade_exact,
    grade_numeric,
    grade_regex,
)
from evals.suites.base import AnswerKey, Item, Suite
from router.errors import ConfigError
from router.generation import Message

ITEMS_FILE = "import-items.jsonl"
KINDS = ("math", "code", "choice", "text", "structured")
GRADERS = ("exact", "numeric", "regex", "choice", "code_tests")
# a reference answer is graded by its task's grader unless the label names one
DEFAULT_GRADER = {"math": "numeric", "choice": "choice", "text": "exact", "structured": "exact", "code": "code_tests"}


class ImportedSuite(Suite):
    """An imported run's items, read from its ``import-items.jsonl``."""

    max_tokens = 512

    def __init__(self, path: Path | str, *, name: str | None = None, task: str | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"imported items not found: {self.path}")
        self.name = name or self.path.parent.name
        data = self.path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        self.version = digest[:16]  # other items, another suite
        self.source = f"{self.path} (sha256 {digest[:12]}…)"
        kinds = {str(row.get("task", "text")) for row in read_jsonl(self.path)}
        self.task = task or (kinds.pop() if len(kinds) == 1 else "text")

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        items = []
        for n, row in enumerate(read_jsonl(self.path), 1):
            try:
                items.append(
                    Item(
                        id=str(row["id"]),
                        messages=tuple(Message(m["role"], m["content"]) for m in row["messages"]),
                        answer_key=AnswerKey(reference={"task": row.get("task", "text"), **row["key"]}),
                        group=str(row.get("group", "")),
                    )
                )
            except (KeyError, TypeError) as exc:
                raise ConfigError(f"{self.path} item {n}: not an imported item ({exc})") from None
        return items

    async def grade(self, item: Item, text: str) -> Grade:
        key: dict[str, Any] = item.answer_key.reference
        kind = key["kind"]
        if kind == "reference":
            return await grade_reference(text, key["grader"], key["value"], key.get("letters", CHOICE_LETTERS))
        if kind == "per_tier":
            labels = {key["correct"][tier] for tier, answer in key["answers"].items() if answer == text}
            if len(labels) != 1:  # the importer refuses both; a grader must not guess
                raise ValueError(f"item {item.id}: the answer is not one tier's, or two tiers' labels disagree")
            return Grade(labels.pop(), text.strip()[:200], "labelled per tier")
        if kind == "agreement":
            same, extracted = agrees(key["task"], text, key["text"])
            return Grade(same, extracted, f"agreement with {key['tier']} (proxy, no label)")
        raise ValueError(f"item {item.id}: unknown answer key kind {kind!r}")


async def grade_reference(text: str, grader: str, value: Any, letters: str = CHOICE_LETTERS) -> Grade:
    if grader == "exact":
        return grade_exact(text, value)
    if grader == "numeric":
        return grade_numeric(text, value)
    if grader == "regex":
        return grade_regex(text, value)
    if grader == "choice":
        return grade_choice(text, value, letters)
    if grader == "code_tests":
        return await grade_code_tests(text, value)
    raise ValueError(f"unknown grader {grader!r}")


def agrees(task: str, text: str, top: str) -> tuple[bool, str | None]:
    """Whether `text` says what `top` says, read as the task reads an answer; and what was read."""
    if task == "math":
        from verifiers.math_answer import extract_answer, numbers_equal, parse_number

        mine = parse_number(extract_answer(text, fallback_last_number=True))
        theirs = parse_number(extract_answer(top, fallback_last_number=True))
        if theirs is not None:
            return mine is not None and numbers_equal(mine, theirs), None if mine is None else str(mine)
    elif task == "choice":
        mine_letter, theirs_letter = extract_choice(text), extract_choice(top)
        if theirs_letter is not None:
            return mine_letter == theirs_letter, mine_letter
    elif task == "structured":
        mine_json, theirs_json = _json_value(text), _json_value(top)
        if theirs_json is not None:
            return mine_json is not None and mine_json == theirs_json, None
    folded = " ".join(text.split()).casefold()
    return folded == " ".join(top.split()).casefold(), folded[:200]


def _json_value(text: str) -> Any:
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[-1].rsplit("```", 1)[0]
    try:
        return json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
