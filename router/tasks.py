"""What kind of request this is: structured output, multiple choice, code, maths or open-ended.

The verifiers and threshold that tell a right answer from a wrong one differ by task: a mean token
probability calibrated on arithmetic throws away nearly every answer to a chat request, because
open-ended text is less probable token by token whatever its quality. So each request is given a
task before the first tier runs, and each tier may have a policy per task (`tiers[].tasks` in the
config, chosen in `router.cascade`).

Detection is rules first, because rules are cheap (microseconds on a bounded slice of the text)
and say why: the request's own fields (`response_format`, `tools`), an option list, a code stub or
fence, a word problem with numbers and a question. Only what no rule claims is put to a learned
classifier, when one is given, and its label is used only when it is confident; otherwise the
request is open-ended, the task whose policy asks least of the answer's form. The label comes
with a short reason a person can check ("option list A-D", "classifier 0.97"), shown in the
response's `tierroute` object, the ledger and `/metrics`.

The classifier is any object with `predict(text) -> (label, probability)`; this module knows no
implementation of it (the composition root loads one, or none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from router.generation import GenerationRequest

Task = Literal["structured", "choice", "code", "maths", "open_ended"]
TASKS: tuple[Task, ...] = get_args(Task)

# An eval suite's `task` attribute, named as requests are: what the offline replay uses for an item
SUITE_TASKS: dict[str, Task] = {
    "math": "maths",
    "code": "code",
    "choice": "choice",
    "text": "open_ended",
    "structured": "structured",
}

# A classifier's label is taken only at or above this probability; below it the request is open-ended.
CLASSIFIER_MIN_PROBABILITY = 0.8
# Rules read at most this many characters of the question, its head and its tail (where option
# lists, stubs and the question itself sit), so a megabyte of pasted text costs no more than this.
_HEAD_CHARS = 6_000
_TAIL_CHARS = 6_000


@dataclass(frozen=True)
class TaskLabel:
    task: Task
    why: str  # a short reason a person can check


class TaskClassifier(Protocol):
    """A learned fallback for what the rules leave open (e.g. `router.learned.task_model.TaskClassifier`)."""

    def predict(self, text: str) -> tuple[str, float]: ...


def task_of_suite(kind: str) -> Task:
    """The task of an eval suite's items (`Suite.task`: math, code, choice, text)."""
    return SUITE_TASKS.get(kind, "open_ended")


def _bounded(text: str) -> str:
    if len(text) <= _HEAD_CHARS + _TAIL_CHARS:
        return text
    return text[:_HEAD_CHARS] + "\n" + text[-_TAIL_CHARS:]


# "A. Paris", "(b) 42", "C) red", "D: none": a letter option opening a line
_OPTION = re.compile(r"^[ \t]*[(\[]?([A-Ja-j])[.):\]][ \t]+\S", re.MULTILINE)
_ASKS_LETTER = re.compile(
    r"\b(?:(?:reply|respond|answer)\s+with\s+(?:only\s+)?(?:the|a|one|a\s+single)\s+(?:\w+\s+)?letter"
    r"|which\s+letter|the\s+letter\s+of\s+the\s+(?:correct|right|best)\s+(?:option|answer|choice))\b",
    re.IGNORECASE,
)
_FENCE = re.compile(r"^[ \t]*(```|~~~)", re.MULTILINE)
_STUB = re.compile(
    r"^[ \t]*(?:async[ \t]+)?def[ \t]+\w+[ \t]*\(|^[ \t]*class[ \t]+\w+[ \t]*[(:]|^[ \t]*#include[ \t]*<"
    r"|\bfunction[ \t]+\w+[ \t]*\(|^[ \t]*(?:public|private|static)[ \t]+[\w<>\[\]]+[ \t]+\w+[ \t]*\(",
    re.MULTILINE,
)
_ASKS_CODE = re.compile(
    r"\b(?:write|implement|create|complete|fix|refactor|rewrite|debug)\b[^.?!\n]{0,60}?"
    r"\b(?:function|program|script|class|method|query|one-liner|regex|regular\s+expression|code|snippet)\b"
    r"|\b(?:python|javascript|typescript|java|rust|golang|c\+\+|sql|bash|shell)\s+(?:function|program|script|"
    r"query|code|one-liner)\b",
    re.IGNORECASE,
)
_NUMBER = re.compile(
    r"(?<![\w])\$?\.?\d[\d,]*(?:\.\d+)?%?|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
    r"twenty|thirty|forty|fifty|hundred|thousand|half|twice|thrice|third|quarter|dozen|double|triple)\b",
    re.IGNORECASE,
)
# lines of source code pasted without a fence: a statement that opens a block or calls a method
_CODE_LINE = re.compile(
    r"^[ \t]*(?:(?:for|while|if|elif|with|try|except)\b[^\n]*:|else:|return\b[^\n]*|import[ \t]+\w[^\n]*"
    r"|[\w.\[\]]+[ \t]*=[ \t]*[^\n=]+|[\w.]+\.\w+\([^\n]*\);?|[{}];?)[ \t]*$",
    re.MULTILINE,
)
_MATHS_NAMED = re.compile(r"\b(?:math(?:s|ematics)?|arithmetic|algebra|geometry)\s+(?:problem|question|exercise)", re.I)
_ARITHMETIC = re.compile(r"\d[\d.]*\s*[-+*/×÷^]\s*\(?\d")
_ASKS_QUANTITY = re.compile(
    r"\b(?:how\s+(?:many|much|long|far|old|fast|often)|what\s+(?:is|was|will\s+be|are)\s+(?:the\s+)?"
    r"(?:total|sum|difference|product|average|mean|cost|price|speed|area|perimeter|volume|percentage|ratio|"
    r"remainder|value|number|amount)|calculate|compute|solve|evaluate|simplify|find\s+the\s+(?:value|sum|"
    r"total|number|area))\b",
    re.IGNORECASE,
)


def _options(text: str) -> str | None:
    """'A-D' when the text lists at least two lettered options in order from A, else None."""
    letters = [m.group(1).upper() for m in _OPTION.finditer(text)]
    run = 0
    best = 0
    for letter in letters:  # the longest run A, B, C, ... (earlier runs may be worked examples)
        if letter == "A":
            run = 1
        elif run and ord(letter) == ord("A") + run:
            run += 1
        else:
            continue
        best = max(best, run)
    if best < 2:
        return None
    return f"A-{chr(ord('A') + best - 1)}"


def rule_task(request: GenerationRequest) -> TaskLabel | None:
    """The task the request's fields and text show plainly, or None when no rule applies."""
    meta = request.metadata
    if meta.get("response_format"):
        return TaskLabel("structured", f"response_format {meta['response_format']}")
    if meta.get("tools"):
        return TaskLabel("structured", f"{meta['tools']} tool(s)")
    text = _bounded(request.last_user_text())
    if (span := _options(text)) is not None:
        return TaskLabel("choice", f"option list {span}")
    if _ASKS_LETTER.search(text):
        return TaskLabel("choice", "asks for a letter")
    if _FENCE.search(text):
        return TaskLabel("code", "fenced code")
    if (stub := _STUB.search(text)) is not None:
        return TaskLabel("code", f"code stub {stub.group(0).strip()[:24]!r}")
    if (ask := _ASKS_CODE.search(text)) is not None:
        return TaskLabel("code", f"asks for code ({' '.join(ask.group(0).split())[:40]!r})")
    if (lines := len(_CODE_LINE.findall(text))) >= 2 and "\n" in text.strip():
        return TaskLabel("code", f"{lines} lines of code")
    if _MATHS_NAMED.search(text):
        return TaskLabel("maths", "names a maths problem")
    if _ARITHMETIC.search(text):
        return TaskLabel("maths", "arithmetic expression")
    numbers = len(_NUMBER.findall(text))
    asks = _ASKS_QUANTITY.search(text) is not None
    if (numbers >= 1 and asks) or (numbers >= 2 and text.rstrip().endswith("?")):
        return TaskLabel("maths", f"word problem ({numbers} numbers and a question)")
    return None


def detect_task(
    request: GenerationRequest,
    classifier: TaskClassifier | None = None,
    *,
    min_probability: float = CLASSIFIER_MIN_PROBABILITY,
) -> TaskLabel:
    """The request's task: a rule's when one applies, else a confident classifier's, else open-ended."""
    ruled = rule_task(request)
    if ruled is not None:
        return ruled
    if classifier is not None:
        label, probability = classifier.predict(_bounded(request.last_user_text()))
        if label in TASKS and probability >= min_probability:
            return TaskLabel(label, f"classifier {probability:.2f}")
        return TaskLabel("open_ended", f"no rule; classifier unsure ({label} {probability:.2f})")
    return TaskLabel("open_ended", "no rule applies")
