"""A user's own suite: a JSON Lines file, one item per line.

Each line is an object with:

- ``prompt`` (a string, sent as one user message) or ``messages`` (a list of
  ``{"role", "content"}``), and optionally ``system`` (prepended as a system message);
- ``reference``: what the grader compares with (grader-only; never sent to the model or a verifier);
- ``grader``: one of ``exact``, ``numeric``, ``regex``, ``choice``, ``code_tests``;
- optional ``id`` (default: the file's stem and line number), ``group`` (a category, reported
  separately), ``letters`` (options for ``choice``, default ``ABCD``) and ``entry_point`` (for
  ``code_tests``: the tests define ``check(candidate)`` and the grader calls
  ``check(<entry_point>)``).

For ``code_tests`` the ``reference`` is Python test code, run after the answer's code in the
sandbox; the item is right when it exits 0.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from evals.data import read_jsonl
from evals.grading import (
    CHOICE_LETTERS,
    Grade,
    grade_choice,
    grade_code_tests,
    grade_exact,
    grade_numeric,
    grade_regex,
)
from evals.suites.base import AnswerKey, Item, Suite
from router.errors import ConfigError
from router.generation import Message

GRADERS = ("exact", "numeric", "regex", "choice", "code_tests")
_ROLES = {"system", "user", "assistant", "developer"}


class JsonlSuite(Suite):
    task = "text"
    max_tokens = 512

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"suite file not found: {self.path}")
        self.name = self.path.stem
        digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        self.version = digest[:16]  # a changed file is a new suite version
        self.source = f"{self.path} (sha256 {digest[:12]}…)"

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        items: list[Item] = []
        seen: set[str] = set()
        try:
            rows = list(read_jsonl(self.path))
        except Exception as exc:
            raise ConfigError(f"suite {self.path}: {exc}") from None
        for lineno, row in enumerate(rows, 1):
            item = self._item(row, lineno)
            if item.id in seen:
                raise ConfigError(f"{self.path} item {lineno}: duplicate id {item.id!r}")
            seen.add(item.id)
            items.append(item)
        if not items:
            raise ConfigError(f"suite {self.path} has no items")
        return items

    def _item(self, row: Any, n: int) -> Item:
        where = f"{self.path} item {n}"
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: expected a JSON object")
        grader = row.get("grader")
        if grader not in GRADERS:
            raise ConfigError(f"{where}: grader must be one of {', '.join(GRADERS)} (got {grader!r})")
        if "reference" not in row:
            raise ConfigError(f"{where}: missing 'reference'")
        ref = row["reference"]
        messages: list[Message] = []
        if row.get("system"):
            messages.append(Message("system", str(row["system"])))
        if "messages" in row:
            for m in row["messages"]:
                if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
                    raise ConfigError(f"{where}: each message needs a role ({', '.join(sorted(_ROLES))}) and content")
                messages.append(Message(m["role"], m["content"]))
        elif isinstance(row.get("prompt"), str):
            messages.append(Message("user", row["prompt"]))
        else:
            raise ConfigError(f"{where}: needs 'prompt' (a string) or 'messages'")
        letters = str(row.get("letters", CHOICE_LETTERS))
        self._check_reference(where, grader, ref, letters)
        key = AnswerKey(
            reference={"grader": grader, "value": ref, "letters": letters},
            tests=ref if grader == "code_tests" else None,
            entry_point=row.get("entry_point"),
        )
        return Item(
            id=str(row.get("id", f"{self.name}/{n}")),
            messages=tuple(messages),
            answer_key=key,
            group=str(row.get("group", "")),
        )

    @staticmethod
    def _check_reference(where: str, grader: str, ref: Any, letters: str) -> None:
        if grader == "numeric":
            from verifiers.math_answer import parse_number

            if not isinstance(ref, int | float) and parse_number(str(ref)) is None:
                raise ConfigError(f"{where}: numeric reference {ref!r} is not a number")
        elif grader == "regex":
            try:
                re.compile(str(ref))
            except re.error as exc:
                raise ConfigError(f"{where}: bad regex {ref!r}: {exc}") from None
        elif grader == "choice":
            if not isinstance(ref, str) or ref.strip().upper() not in letters:
                raise ConfigError(f"{where}: choice reference must be one of the letters {letters}")
        elif grader == "exact":
            if not (isinstance(ref, str) or (isinstance(ref, list) and all(isinstance(r, str) for r in ref))):
                raise ConfigError(f"{where}: exact reference must be a string or a list of strings")
        elif not isinstance(ref, str):
            raise ConfigError(f"{where}: code_tests reference must be Python test code")

    async def grade(self, item: Item, text: str) -> Grade:
        key = item.answer_key
        grader, ref, letters = key.reference["grader"], key.reference["value"], key.reference["letters"]
        if grader == "exact":
            return grade_exact(text, ref)
        if grader == "numeric":
            return grade_numeric(text, ref)
        if grader == "regex":
            return grade_regex(text, ref)
        if grader == "choice":
            return grade_choice(text, ref, letters)
        return await grade_code_tests(text, ref, entry_point=key.entry_point)
