"""How numbers and tables are written in every eval report, the console's and the files': one place,
so a figure reads the same in the Markdown, the HTML, the estimators' report and `eval sweep`.

A missing number is "–", never "None" or "nan": a table cell says there is no figure.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence


def pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}%"


def num(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def usd(x: float | None) -> str:
    if x is None:
        return "–"
    return f"${x:.4f}" if x < 1 else f"${x:,.2f}"


def sec(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f} s"


def th(x: float | None) -> str:
    """A threshold: an infinite one (never accept) is ∞."""
    return "–" if x is None else ("∞" if math.isinf(x) else f"{x:.4g}")


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return out


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def inline(text: str) -> str:
    """The little Markdown the tables use (**bold**, *italic*, `code`) as HTML."""
    t = html.escape(str(text))
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    t = re.sub(r"\*(.+?)\*", r"<i>\1</i>", t)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", t)
