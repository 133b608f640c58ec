"""The published per-item results of frontier models, as committed under `evals/data/routellm/`,
and the price sheet they are charged at.

Why a committed subset: CI and fresh machines cannot reach GitHub, and a report must regenerate
from the repository alone. `scripts/routellm_subset.py` made it from a RouteLLM checkout (its
PROVENANCE.md says which commit and what was kept): each published row matched to this project's
suite item by its normalized text (`normalize`), with the tokens of what the cascade would send
the tier (the suite's prompt) and of what the tier answered, counted once by a stated tokenizer,
so reading the subset needs neither a model nor a tokenizer.

Lines are checked as they are read (types, known tiers, ids in the suite's form): the file is
data from elsewhere, and a malformed line is refused naming it rather than priced as zero.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.config import PriceSettings
from router.errors import ConfigError

DATA_DIR = Path("evals/data/routellm")
MIXTRAL = "mixtral-8x7b"
GPT4 = "gpt-4-1106"
TIERS = (MIXTRAL, GPT4)  # cheapest first
MODELS = {MIXTRAL: "mistralai/Mixtral-8x7B-Instruct-v0.1", GPT4: "gpt-4-1106-preview"}


@dataclass(frozen=True)
class ListPrice:
    """A model's published list price, with who lists it and when it was read."""

    input_per_1m: float
    output_per_1m: float
    provider: str
    as_of: str

    def settings(self, model: str) -> PriceSettings:
        return PriceSettings(
            usd_per_1m_input_tokens=self.input_per_1m,
            usd_per_1m_output_tokens=self.output_per_1m,
            stands_for=f"{model}, {self.provider} list price ({self.as_of})",
        )


# The frontier tiers' own prices. Dates are when the provider listed the price; this project cannot
# reach the web to re-check them, so a report states them beside every figure.
PRICES: dict[str, ListPrice] = {
    GPT4: ListPrice(10.0, 30.0, "OpenAI", "as listed from November 2023"),
    MIXTRAL: ListPrice(0.6, 0.6, "Together AI serverless", "as listed in 2024"),
}

# Named price points for the top tier: the same GPT-4-1106 answers, charged as another model would
# be, so the savings can be read at the price ratio of a pair the reader actually pays for.
TOP_PRICE_POINTS: dict[str, ListPrice] = {
    "gpt-4-1106-preview": PRICES[GPT4],
    "claude-3.5-sonnet": ListPrice(3.0, 15.0, "Anthropic", "as listed from June 2024"),
    "gpt-4o-2024-08-06": ListPrice(2.5, 10.0, "OpenAI", "as listed from August 2024"),
    "gpt-4o-mini": ListPrice(0.15, 0.6, "OpenAI", "as listed from July 2024"),
}


def normalize(text: str) -> str:
    """Text as compared between two copies of a benchmark: Unicode NFKC, case-folded, curly quotes
    straightened, whitespace collapsed. Two items match when their normalized texts are equal."""
    text = unicodedata.normalize("NFKC", text)
    text = text.translate(_QUOTES).casefold()
    return " ".join(text.split())


_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


@dataclass(frozen=True)
class PublishedAnswer:
    text: str | None  # None: only the answer's correctness was published (MMLU)
    tokens: int  # the answer's tokens (1 where only a letter is known)
    published_correct: bool  # the publisher's own label


@dataclass(frozen=True)
class PublishedItem:
    id: str  # this project's suite item id
    row: str  # where it is in the published data: a row number, or subject/row
    prompt_tokens: int  # what the cascade sends the tier: the suite's own prompt
    answers: Mapping[str, PublishedAnswer]  # tier -> answer, every tier of TIERS


@dataclass(frozen=True)
class Published:
    suite: str
    items: list[PublishedItem]
    meta: dict[str, Any]  # meta.json: source, tokenizer, match counts

    @property
    def matched(self) -> dict[str, Any]:
        m: dict[str, Any] = self.meta["matched"][self.suite]
        return m


_ID = {"gsm8k": re.compile(r"^gsm8k/\d+$"), "mmlu": re.compile(r"^mmlu/\d+$")}


def load(suite: str, data_dir: Path = DATA_DIR) -> Published:
    """The committed subset of one suite (`gsm8k` or `mmlu`), checked line by line."""
    if suite not in _ID:
        raise ConfigError(f"no published frontier results for suite {suite!r}; have: {', '.join(_ID)}")
    meta_path = data_dir / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {meta_path}: {exc}") from None
    items: list[PublishedItem] = []
    path = data_dir / f"{suite}.jsonl"
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = _item(json.loads(line), suite)
            except (json.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
                raise ConfigError(f"{path} line {n}: {exc}") from None
            if item.id in seen:
                raise ConfigError(f"{path} line {n}: item {item.id} twice")
            seen.add(item.id)
            items.append(item)
    return Published(suite, items, meta)


def _count(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1_000_000:
        raise ValueError(f"{what} must be a token count")
    return v


def _item(obj: dict[str, Any], suite: str) -> PublishedItem:
    item_id = obj["id"]
    if not isinstance(item_id, str) or not _ID[suite].match(item_id):
        raise ValueError(f"id {item_id!r} is not a {suite} item id")
    raw = obj["answers"]
    if not isinstance(raw, dict) or set(raw) != set(TIERS):
        raise ValueError(f"answers must name exactly {', '.join(TIERS)}")
    answers = {}
    for tier in TIERS:
        a = raw[tier]
        text = a.get("text")
        if text is not None and not isinstance(text, str):
            raise ValueError(f"answers.{tier}.text must be a string")
        if not isinstance(a["correct"], bool):
            raise ValueError(f"answers.{tier}.correct must be true or false")
        answers[tier] = PublishedAnswer(text, _count(a["tokens"], f"answers.{tier}.tokens"), a["correct"])
    return PublishedItem(item_id, str(obj["row"]), _count(obj["prompt_tokens"], "prompt_tokens"), answers)
