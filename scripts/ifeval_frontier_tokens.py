"""Make `evals/data/ifeval/frontier_tokens.json`: the estimated tokens of each IFEval item for the
published GPT-4 tier (`evals.frontier.ifeval`), counted once so the report needs no tokenizer.

Per item (all 541): the prompt, as `evals.frontier.ifeval.prompt_texts` gives it (the suite's
request messages) with OpenAI's chat overhead of 3 tokens per message and 3 for the reply; the
answer, GPT-4's published response as `evals.frontier.ifeval.load` matches it to the item. Counted
in the small tier's vocabulary (Qwen2.5-Coder-0.5B-Instruct via llama.cpp `vocab_only`, the
tokenizer of the RouteLLM subset and of BFCL's estimates). Run from the repository root, with the
model pulled (`tierroute models pull qwen2.5-coder-0.5b-instruct-q4_k_m`):

    .venv/bin/python scripts/ifeval_frontier_tokens.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evals.frontier.ifeval import (
    DATA_DIR,
    ITEMS_FILE,
    PER_MESSAGE,
    PER_REPLY,
    RESPONSES_FILE,
    TOKENS_FILE,
    match,
    prompt_texts,
    read_responses,
)
from evals.suites.ifeval import IFEval
from router.generation import GenerationRequest
from router.models.catalog import CATALOG, ModelStore

TOKENIZER_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"
HOW = (
    f"llama.cpp vocab_only; prompt: the suite's message contents plus {PER_MESSAGE} per message and {PER_REPLY} "
    "per reply (OpenAI's chat overhead); answer: GPT-4's published response"
)


class Tokens:
    """Tokens of a text by the small tier's vocabulary (no weights loaded)."""

    def __init__(self) -> None:
        import llama_cpp

        path = ModelStore().path_of(CATALOG[TOKENIZER_MODEL])
        self.model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)

    def __call__(self, text: str) -> int:
        return len(self.model.tokenize(text.encode("utf-8"), add_bos=False, special=False))


def count(tok: Tokens, data_dir: Path) -> dict[str, list[int]]:
    suite = IFEval(data_dir / ITEMS_FILE)
    items = suite.load()
    path = data_dir / RESPONSES_FILE
    answers, _ = match(read_responses(path), items, path)
    out = {}
    for item in items:
        contents = prompt_texts(suite.request(item, GenerationRequest(messages=item.messages)))
        prompt = sum(tok(c) + PER_MESSAGE for c in contents) + PER_REPLY
        out[item.id] = [prompt, tok(answers[item.id])]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DATA_DIR), help="the IFEval data directory (default: the committed one)")
    ap.add_argument("--out", default=str(DATA_DIR / TOKENS_FILE))
    args = ap.parse_args()
    tokenizer = {"model": TOKENIZER_MODEL, "sha256": CATALOG[TOKENIZER_MODEL].sha256, "how": HOW}
    items = count(Tokens(), Path(args.data))
    lines = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in items.items())
    text = f'{{\n "tokenizer": {json.dumps(tokenizer, ensure_ascii=False)},\n "items": {{\n{lines}\n }}\n}}\n'
    json.loads(text)  # the file is JSON
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"{len(items)} items -> {args.out}")


if __name__ == "__main__":
    main()
