"""Mixed traffic: the suites' items interleaved with open-ended prompts, as a service receives them.

Why a suite (`tierroute eval run mixed`) and not an `--mixed` option: a suite is what `eval run`
already takes, lists and documents, and a mixed workload is one more workload, not a mode of the
others. What makes it unlike the other suites (its items come from several suites, each judged by
the task the service would detect) is handled by `evals.mixed`, which the command hands it to.

Each suite item keeps everything of its own suite: its messages, max_tokens, alternatives per token
and grader. That is what lets a mixed run reuse the origin runs' stored work key for key, and what
keeps its grades the suite's own. Open-ended prompts (`evals/data/open_ended_prompts.jsonl`, written
for the project) have no reference answer: they are generated and verified like any request, so
they count in cost and escalation, and they are never graded.

The interleaving is a shuffle by seed of the drawn items: every suite's draw is the suite's own
(`Suite.select`, prefix-stable), so a mixed run at seed s holds the items of the suites' runs at
seed s, and the same seed gives the same order.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from evals.grading import Grade
from evals.suites.base import AnswerKey, Item, Suite
from router.errors import ConfigError
from router.generation import Message

OPEN_ENDED_PROMPTS = Path(__file__).resolve().parents[1] / "data" / "open_ended_prompts.jsonl"
ORIGINS = ("gsm8k", "humaneval", "mmlu")
OPEN_ENDED_MAX_TOKENS = 128  # a chat answer's opening is what the verifiers judge; longer costs time only
UNGRADED = "ungraded: no reference answer"


class OpenEnded(Suite):
    """The project's open-ended prompts: generated and verified, never graded."""

    name = "open_ended"
    task = "text"
    version = "1"
    graded = False

    def __init__(self, path: Path = OPEN_ENDED_PROMPTS, max_tokens: int = OPEN_ENDED_MAX_TOKENS) -> None:
        if max_tokens < 1:
            raise ConfigError("open-ended max_tokens must be at least 1")
        self.path = Path(path)
        self.max_tokens = max_tokens
        self.source = f"open-ended prompts written for the project ({self.path.name})"

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        items = []
        with open(self.path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                row = json.loads(line)
                if row.get("task") != "open_ended":
                    continue
                items.append(
                    Item(
                        id=f"open_ended/{i}",  # the line number in the file: stable
                        messages=(Message("user", str(row["text"])),),
                        answer_key=AnswerKey(),
                        group=str(row.get("source", "")),
                    )
                )
        return items

    async def grade(self, item: Item, text: str) -> Grade:
        return Grade(correct=False, detail=UNGRADED)


def is_graded(suite: Suite) -> bool:
    return bool(getattr(suite, "graded", True))


class Mixed(Suite):
    """Items of `origins` and of `open_ended`, interleaved by seed. `draw` says which suite each
    item is from; `grade` hands an item to that suite's grader."""

    name = "mixed"
    task = "text"
    version = "1"

    def __init__(self, origins: Sequence[Suite] | None = None, open_ended: Suite | None = None) -> None:
        if origins is None:  # the built-in suites themselves (not by name: the registry lists this one)
            from evals.suites.gsm8k import GSM8K
            from evals.suites.humaneval import HumanEval
            from evals.suites.mmlu import MMLU

            origins = [GSM8K(), HumanEval(), MMLU()]
            assert [o.name for o in origins] == list(ORIGINS)
        self.origins = list(origins)
        self.open_ended = open_ended if open_ended is not None else OpenEnded()
        self.source = "interleaved: " + ", ".join(s.name for s in [*self.origins, self.open_ended])
        self._by_id: dict[str, tuple[Suite, Item]] = {}

    def draw(
        self, limit: int | None, open_limit: int | None, seed: int, cache_dir: Path | None = None
    ) -> list[tuple[Suite, Item]]:
        """`limit` items of each origin suite (its own draw at `seed`) and `open_limit` open-ended
        prompts, shuffled together by `seed`."""
        if (limit is not None and limit < 0) or (open_limit is not None and open_limit < 0):
            raise ConfigError("mixed: item counts must not be negative")
        drawn: list[tuple[Suite, Item]] = []
        for suite in [*self.origins, self.open_ended]:
            n = open_limit if suite is self.open_ended else limit
            if n == 0:
                continue
            drawn += [(suite, item) for item in suite.select(suite.load(cache_dir), n, seed)]
        ids = [item.id for _, item in drawn]
        if len(set(ids)) != len(ids):
            raise ConfigError("mixed: two suites share item ids")
        random.Random(f"{self.name}:{seed}").shuffle(drawn)
        self._by_id.update({item.id: (suite, item) for suite, item in drawn})
        return drawn

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        return [item for _, item in self.draw(None, None, 0, cache_dir)]

    def origin_of(self, item: Item) -> Suite:
        try:
            return self._by_id[item.id][0]
        except KeyError:
            raise ConfigError(f"mixed: item {item.id} was not drawn") from None

    async def grade(self, item: Item, text: str) -> Grade:
        return await self.origin_of(item).grade(item, text)

    async def grade_answer(self, item: Item, text: str, *, cut_off: bool) -> Grade:
        return await self.origin_of(item).grade_answer(item, text, cut_off=cut_off)
