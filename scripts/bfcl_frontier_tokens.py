"""Make `evals/data/bfcl/frontier_tokens.json`: the estimated tokens of each BFCL v1 item for the
published frontier tiers (`evals.frontier.bfcl`), counted once so the report needs no tokenizer.

Per item (all four v1 categories): the prompt, as `evals.frontier.bfcl.prompt_texts` gives it (the
question with OpenAI's chat overhead of 3 tokens per message and 3 for the reply, and each offered
function's JSON definition), and the answer, as `answer_texts` gives it (the ground truth's own
calls; what the models wrote was not published). Counted in the small tier's vocabulary
(Qwen2.5-Coder-0.5B-Instruct via llama.cpp `vocab_only`, the tokenizer of the RouteLLM subset).
Run from the repository root, with the model pulled (`tierroute models pull
qwen2.5-coder-0.5b-instruct-q4_k_m`):

    .venv/bin/python scripts/bfcl_frontier_tokens.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evals.frontier.bfcl import DATA_DIR, PER_MESSAGE, PER_REPLY, TOKENS_FILE, answer_texts, prompt_texts
from evals.suites.bfcl import BFCL, CATEGORIES
from router.generation import GenerationRequest
from router.models.catalog import CATALOG, ModelStore

TOKENIZER_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"
HOW = (
    f"llama.cpp vocab_only; prompt: message contents plus {PER_MESSAGE} per message and {PER_REPLY} per reply "
    "(OpenAI's chat overhead) plus each function definition's JSON text; answer: the ground truth's own calls, "
    'each as {"name": ..., "arguments": {...}} JSON (the models\' answers were not published)'
)


class Tokens:
    """Tokens of a text by the small tier's vocabulary (no weights loaded)."""

    def __init__(self) -> None:
        import llama_cpp

        path = ModelStore().path_of(CATALOG[TOKENIZER_MODEL])
        self.model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)

    def __call__(self, text: str) -> int:
        return len(self.model.tokenize(text.encode("utf-8"), add_bos=False, special=False))


def count(tok: Tokens) -> dict[str, list[int]]:
    suite = BFCL(categories=tuple(CATEGORIES))
    out = {}
    for item in suite.load():
        contents, tools = prompt_texts(suite.request(item, GenerationRequest(messages=item.messages)))
        prompt = sum(tok(c) + PER_MESSAGE for c in contents) + PER_REPLY + sum(tok(t) for t in tools)
        out[item.id] = [prompt, sum(tok(a) for a in answer_texts(item.answer_key.reference))]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(DATA_DIR / TOKENS_FILE))
    args = ap.parse_args()
    tokenizer = {"model": TOKENIZER_MODEL, "sha256": CATALOG[TOKENIZER_MODEL].sha256, "how": HOW}
    items = count(Tokens())
    lines = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in items.items())
    text = f'{{\n "tokenizer": {json.dumps(tokenizer, ensure_ascii=False)},\n "items": {{\n{lines}\n }}\n}}\n'
    json.loads(text)  # the file is JSON
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"{len(items)} items -> {args.out}")


if __name__ == "__main__":
    main()
