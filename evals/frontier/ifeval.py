"""GPT-4 as the top tier of the ifeval suite: the IFEval authors' published response of GPT-4 to
every one of the 541 prompts (`evals/data/ifeval/input_response_data_gpt4_20231107_145030.jsonl`),
imported as the eval run `ifeval-published` by `tierroute eval frontier-import ifeval`, graded by
this project's own IFEval grader on GPT-4's text, and put above the local small tier by
`tierroute eval workloads ... --top ifeval=ifeval-published`.

**Why this suite can be priced against a frontier model.** Unlike BFCL's leaderboard (correctness
only) or RouteLLM's MMLU (correctness only), the IFEval authors published GPT-4's full text. So the
top tier is graded here the way the small tier is, by `evals.suites.ifeval`'s strict grader
(`evals.ifeval_checks`), never by anyone else's verdicts: the third party's
`eval_results_strict.jsonl` is only the yardstick a test holds this grading to (they agree on 532
of their 540 prompts; every difference is explained in docs/evaluating.md).

**Matching.** The responses file names no key, only the prompt: each response is matched to the
suite's item whose prompt is the same text, and every item must be matched exactly once. One prompt
was edited by the authors after GPT-4 answered it (`EDITED`: key 2785 asked GPT-4 for "at least one
placeholder"; the published data, and so this suite, asks for "at least 3 placeholders"). It is
matched through that one stated edit and graded against the suite's key, which is what a cascade
would have sent up: GPT-4's answer has one placeholder, so it is graded wrong there.

**Which GPT-4.** The file is dated 2023-11-07 14:50:30, one day after gpt-4-1106-preview was
announced, and its name says only "gpt4". The answers' own knowledge says the older model: the
"latest Google Pixel phone" is the Pixel 6 Pro (October 2021), and Lionel Messi plays for
Paris Saint-Germain with 7 Ballons d'Or, 151 caps and 79 goals and no World Cup (all true in late
2021; gpt-4-1106-preview's training data runs to April 2023, past the 2022 World Cup). So it is
taken to be `gpt-4` (the 8K model, gpt-4-0613 or gpt-4-0314; the API's `gpt-4` named gpt-4-0613
then), priced at that model's list price, $30 / $60 per 1M input / output tokens (`PRICE`, OpenAI's
list from March 2023, not re-checked from this machine). That is inference from the text, not a
statement by the authors.

**Tokens.** Counted once by `scripts/ifeval_frontier_tokens.py` into `frontier_tokens.json`, in the
small tier's vocabulary (Qwen2.5-Coder-0.5B via llama.cpp `vocab_only`), as the RouteLLM subset and
BFCL are: the prompt is the suite's request messages plus OpenAI's chat overhead (3 tokens per
message, 3 for the reply); the answer is GPT-4's published text. OpenAI billed GPT-4 in its own
cl100k vocabulary, so the cost is an estimate of the bill (closest for English, further off for the
prompts that ask for Hindi, Bengali or other scripts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evals.frontier.published import ListPrice
from evals.frontier.runs import published_tier, replace_run
from evals.store import GenerationRecord, GradeRecord, RunStore, digest, generation_key, grade_key
from evals.suites.base import Item, Suite
from evals.suites.ifeval import IFEval
from router.errors import ConfigError
from router.generation import GenerationRequest

DATA_DIR = Path("evals/data/ifeval")
RESPONSES_FILE = "input_response_data_gpt4_20231107_145030.jsonl"
ITEMS_FILE = "input_data.jsonl"
TOKENS_FILE = "frontier_tokens.json"
RUN = "ifeval-published"
TIER = "gpt-4"
MODEL = "gpt-4, the IFEval authors' responses of 2023-11-07"
PRICE = ListPrice(30.0, 60.0, "OpenAI", "gpt-4 8K, as listed from March 2023")
# key -> (what GPT-4 was asked, what the published data asks): the authors' one edit after answering
EDITED: dict[int, tuple[str, str]] = {2785: ("at least one placeholder", "at least 3 placeholders")}
SOURCE = {
    "repository": "google-research/google-research",
    "path": "instruction_following_eval/data/",
    "read_from": "Podtech-AI/IFEval",
    "commit": "5bdf377eb9cc20f16d377dc5c38413cee22550a6",
    "file": RESPONSES_FILE,
    "sha256": "0cff1d1469b774e80296bee20ca696894df35f3c6d6539f2c886d67c07599dcb",
    "license": "Apache-2.0",
}
WHICH_GPT4 = (
    "taken to be gpt-4 (8K; gpt-4-0613 or -0314), not gpt-4-1106-preview: the answers know late 2021 and "
    "nothing after it (the latest Pixel is the 6 Pro; Messi at PSG, 7 Ballons d'Or, no World Cup)"
)
PER_MESSAGE, PER_REPLY = 3, 3
MAX_LINE_CHARS = 200_000  # a response is at most a few thousand words; a larger line is not this file


@dataclass(frozen=True)
class PublishedIFEval:
    answers: Mapping[str, str]  # item id -> GPT-4's published response, in the suite's item order
    tokens: Mapping[str, tuple[int, int]]  # item id -> (prompt, answer) tokens, estimated
    tokenizer: Mapping[str, Any]  # the tokens file's account of how they were counted
    edited: tuple[str, ...]  # item ids matched through `EDITED`

    @property
    def items(self) -> list[str]:
        return list(self.answers)


def prompt_texts(request: GenerationRequest) -> list[str]:
    """What a hosted tier is sent for an item (the suite's request): its message contents."""
    assert request.messages is not None
    return [m.content for m in request.messages]


def read_responses(path: Path) -> list[tuple[str, str]]:
    """(prompt, response) per line of the authors' file, checked as it is read: a JSON object of
    exactly those two strings, neither empty."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                if len(line) > MAX_LINE_CHARS:
                    raise ValueError(f"longer than {MAX_LINE_CHARS} characters")
                row = json.loads(line)
                if not isinstance(row, dict) or set(row) != {"prompt", "response"}:
                    raise ValueError("expected an object of exactly prompt and response")
                if not all(isinstance(row[k], str) and row[k].strip() for k in ("prompt", "response")):
                    raise ValueError("prompt and response must be non-empty strings")
            except ValueError as exc:  # json.JSONDecodeError is one
                raise ConfigError(f"{path} line {n}: {exc}") from None
            out.append((row["prompt"], row["response"]))
    return out


def match(responses: list[tuple[str, str]], items: list[Item], path: Path) -> tuple[dict[str, str], list[str]]:
    """Each response to the item of the same prompt (or of the prompt `EDITED` says it became),
    every item exactly once: item id -> response, in the items' order; and the ids matched by edit."""
    by_prompt = {_prompt(it): it.id for it in items}
    edits = {f"ifeval/{k}": v for k, v in EDITED.items()}
    found: dict[str, str] = {}
    edited = []
    for n, (prompt, response) in enumerate(responses, 1):
        item_id = by_prompt.get(prompt)
        if item_id is None:
            item_id = next(
                (i for i, (then, now) in edits.items() if by_prompt.get(prompt.replace(then, now, 1)) == i), None
            )
            if item_id is None:
                raise ConfigError(f"{path} response {n}: its prompt is no item's ({prompt[:60]!r}...)")
            edited.append(item_id)
        if item_id in found:
            raise ConfigError(f"{path} response {n}: a second response to {item_id}")
        found[item_id] = response
    missing = [it.id for it in items if it.id not in found]
    if missing:
        raise ConfigError(f"{path}: no response to {len(missing)} items ({', '.join(missing[:3])}, ...)")
    return {it.id: found[it.id] for it in items}, edited


def _prompt(item: Item) -> str:
    prompt: str = item.answer_key.reference["prompt"]
    return prompt


def load(data_dir: Path = DATA_DIR) -> PublishedIFEval:
    """GPT-4's responses matched to the suite's items (of `data_dir`'s `input_data.jsonl`), with the
    committed token estimates, each checked as it is read."""
    items = IFEval(data_dir / ITEMS_FILE).load()
    path = data_dir / RESPONSES_FILE
    answers, edited = match(read_responses(path), items, path)
    tokens_path = data_dir / TOKENS_FILE
    try:
        raw = json.loads(tokens_path.read_text(encoding="utf-8"))
        tokens = {str(k): (_count(v[0], f"{k} prompt"), _count(v[1], f"{k} answer")) for k, v in raw["items"].items()}
        tokenizer = dict(raw["tokenizer"])
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ConfigError(f"cannot read {tokens_path}: {exc}") from None
    if set(tokens) != set(answers):
        raise ConfigError(f"{tokens_path}: token estimates must cover exactly the {len(answers)} items")
    return PublishedIFEval(answers, tokens, tokenizer, tuple(edited))


def _count(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 1_000_000:
        raise ValueError(f"{what} must be a token count")
    return v


# ---- GPT-4's answers as an eval run --------------------------------------------------------------


def tier_fingerprint() -> str:
    return digest("published", SOURCE["repository"], SOURCE["file"], SOURCE["sha256"])


def write_run(published: PublishedIFEval, suite: Suite, runs_dir: Path) -> Path:
    """Write (or rewrite whole) the run `runs_dir/ifeval-published`: the tier `gpt-4`, GPT-4's
    response to every item, graded by `suite`'s grader. Built beside its destination and renamed
    into place, so a failure leaves the old run (or none)."""
    items = {it.id: it for it in suite.load()}
    if set(items) != set(published.answers):
        raise ConfigError(f"the {suite.name} suite's items are not the published responses' items")
    return replace_run(runs_dir, RUN, lambda tmp: _write(published, suite, items, tmp))


async def _write(published: PublishedIFEval, suite: Suite, items: Mapping[str, Item], root: Path) -> None:
    fp = tier_fingerprint()
    gens, grades = [], []
    for item_id, text in published.answers.items():
        item = items[item_id]
        gk = generation_key(fp, item.prompt_sha)
        prompt, answer = published.tokens[item_id]
        gens.append(GenerationRecord(gk, TIER, item_id, MODEL, text, "stop", prompt, answer, 0.0))
        g = await suite.grade(item, text)
        key = grade_key(gk, suite.fingerprint, item_id)
        grades.append(GradeRecord(key, gk, TIER, item_id, bool(g.correct), g.extracted, g.detail))
    with RunStore(root) as store:
        store.add_generations(gens)
        store.add_grades(grades)
    right = sum(g.correct for g in grades)
    RunStore(root).write_manifest(_manifest(published, suite, items, right))


def _manifest(published: PublishedIFEval, suite: Suite, items: Mapping[str, Item], right: int) -> dict[str, Any]:
    tier = published_tier(TIER, MODEL, tier_fingerprint(), PRICE.settings(TIER))
    return {
        "name": RUN,
        "suite": {
            "name": suite.name,
            "fingerprint": suite.fingerprint,
            "task": suite.task,
            "source": f"{suite.source}; GPT-4's responses published by the authors ({RESPONSES_FILE})",
            "limit": None,
            "seed": 0,
        },
        "tiers": [tier],
        "items": [{"id": i, "prompt_sha": items[i].prompt_sha, "group": items[i].group} for i in published.items],
        "published": {
            "source": SOURCE,
            "model": WHICH_GPT4,
            "tokenizer": dict(published.tokenizer),
            "matched": {"responses": len(published.answers), "suite": len(items), "by_edit": list(published.edited)},
            "edited": {f"ifeval/{k}": {"asked": a, "now": b} for k, (a, b) in EDITED.items()},
            "prices": {TIER: asdict(PRICE)},
            "right": right,
            "grading": {"grader": f"this project's {suite.name} grader (evals.ifeval_checks), strict prompt-level"},
        },
    }
