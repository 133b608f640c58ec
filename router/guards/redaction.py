"""Typed placeholders for found data, and the way back.

`<EMAIL_ADDRESS_1>` stands for the first e-mail address of a request, `<EMAIL_ADDRESS_2>` for
the second; the same value found twice (or once in a message and once in a tool call's arguments)
is the same placeholder, so the model still sees which mentions are the same person or card. The
placeholder names its kind, so an answer can still make sense ("I will write to
<EMAIL_ADDRESS_1>"), and `restore` can put the value back where the answer repeats it: its exact
form, and the forms a model writes it in when it drops or swaps the brackets
(`EMAIL_ADDRESS_1`, `[EMAIL_ADDRESS_1]`).

Output redaction (data the model produced, not the client's) uses `<KIND>` without a number,
since there is nothing to restore.
"""

from __future__ import annotations

import re
from collections import Counter


class Redaction:
    """The placeholders of one request, and what each stands for."""

    def __init__(self) -> None:
        self._by_value: dict[tuple[str, str], str] = {}
        self._counts: Counter[str] = Counter()
        self.originals: dict[str, str] = {}  # placeholder name (EMAIL_ADDRESS_1) -> value

    def placeholder(self, kind: str, value: str) -> str:
        key = (kind, value)
        name = self._by_value.get(key)
        if name is None:
            self._counts[kind] += 1
            name = f"{kind}_{self._counts[kind]}"
            self._by_value[key] = name
            self.originals[name] = value
        return f"<{name}>"

    def restore(self, text: str) -> tuple[str, Counter[str]]:
        """`text` with every placeholder it repeats replaced by its value, and how many of each
        kind were restored."""
        restored: Counter[str] = Counter()
        if not self.originals or not text:
            return text, restored
        names = sorted(self.originals, key=len, reverse=True)  # EMAIL_ADDRESS_12 before EMAIL_ADDRESS_1
        pattern = re.compile(r"[<\[]?\b(" + "|".join(re.escape(n) for n in names) + r")\b[>\]]?")

        def put(m: re.Match[str]) -> str:
            name = m.group(1)
            restored[name.rsplit("_", 1)[0]] += 1
            return self.originals[name]

        return pattern.sub(put, text), restored


def replaced(text: str, spans: list[tuple[int, int, str]]) -> str:
    """`text` with each (start, end, replacement) applied; spans do not overlap."""
    out, at = [], 0
    for start, end, new in sorted(spans):
        out.append(text[at:start])
        out.append(new)
        at = end
    out.append(text[at:])
    return "".join(out)
