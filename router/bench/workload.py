"""What a bench run sends and to whom: the fixed prompts, the workload, the servers, the levels.

The prompts are fixed so that every server and every level sees the same sequence of requests:
request k asks `PROMPTS[k % 16]` (or the k-th line of `--prompts FILE`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from router.errors import TierrouteError

# Fixed and varied: code, arithmetic, facts, writing, short and long answers. Request k of every
# level asks PROMPTS[k % 16], so every server and every level sees the same sequence.


PROMPTS: tuple[str, ...] = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain the difference between a process and a thread in three sentences.",
    "What is 17 * 23? Show your working.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Write a SQL query that returns the ten most recent rows of a table named orders.",
    "List five common uses of a hash map.",
    "Translate 'Where is the train station?' into French and German.",
    "Write a haiku about autumn rain.",
    "How does binary search work? Give its time complexity.",
    "Write a bash one-liner that counts the lines of every .py file under the current directory.",
    "What causes the seasons on Earth?",
    "Rewrite with a list comprehension:\nresult = []\nfor x in range(10):\n    if x % 2 == 0:\n"
    "        result.append(x * x)",
    "Give three tips for writing clear commit messages.",
    "A train travels 120 km in 1.5 hours. What is its average speed in km/h?",
    "Write a JavaScript function that debounces another function.",
    "Explain what a REST API is to a beginner.",
)


class BenchError(TierrouteError):
    """The benchmark cannot run as asked (bad options, a server that will not start)."""


@dataclass(frozen=True)
class Workload:
    api: str = "chat"  # or "completions"
    max_tokens: int = 128
    timeout_s: float = 600.0
    prompts: tuple[str, ...] = PROMPTS
    # sent with every request when set (`--response-format FILE`): constrained decoding's cost is
    # measured on the same prompts as free decoding
    response_format: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    def prompt(self, index: int) -> str:
        return self.prompts[index % len(self.prompts)]

    def describe(self) -> dict[str, Any]:
        digest = hashlib.sha256("\x00".join(self.prompts).encode()).hexdigest()[:16]
        return {
            "api": self.api,
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "timeout_s": self.timeout_s,
            "prompts": len(self.prompts),
            "prompts_sha256": digest,
            "prompt_set": "builtin" if self.prompts == PROMPTS else "file",
            "response_format": self.response_format,
        }


@dataclass(frozen=True)
class Target:
    url: str
    label: str
    model: str = "auto"
    pid: int | None = None
    launch: str | None = None
    api_key: str = "not-needed"  # the SDK insists on a key; servers without auth ignore it

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "url": self.url, "model": self.model, "pid": self.pid, "launch": self.launch}


@dataclass(frozen=True)
class Level:
    kind: str  # "concurrency" or "rate"
    value: float

    @property
    def name(self) -> str:
        return f"c={self.value:g}" if self.kind == "concurrency" else f"{self.value:g} req/s"
