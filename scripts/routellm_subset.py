"""Make `evals/data/routellm/` (the published frontier results the `eval frontier` report reads)
from a checkout of RouteLLM (lm-sys/RouteLLM, Apache-2.0).

Reads, with git, `routellm/evals/gsm8k/gsm8k_responses.csv` (per GSM8K test item: both models'
answers and RouteLLM's correctness labels) and `routellm/evals/mmlu/responses/mmlu_*.csv` (per
MMLU test item: correctness only), matches each row to this project's suite item by normalized
text (`evals.frontier.published.normalize`: the GSM8K question; the MMLU question with its four
options), and writes per matched item its id, token counts and what the report needs: GSM8K
answer texts and labels, MMLU correctness (for the items of the committed MMLU run only: the
report has small-tier results for no others). No prompt text is kept (the suites have it).

Tokens are counted with the vocabulary of the small tier's model (Qwen2.5-Coder-0.5B-Instruct, via
llama.cpp with `vocab_only`): message contents, plus OpenAI's chat overhead of 3 tokens per
message and 3 for the reply. An MMLU answer counts as one token: only its correctness was
published. Run from the repository root:

    .venv/bin/python scripts/routellm_subset.py --repo PATH/TO/RouteLLM/.git --commit SHA
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evals.data import GSM8K_TEST, MMLU_TEST, fetch, read_jsonl
from evals.frontier.published import DATA_DIR, GPT4, MIXTRAL, MODELS, normalize
from evals.suites.gsm8k import GSM8K
from evals.suites.mmlu import MMLU
from router.models.catalog import CATALOG, ModelStore

GSM8K_CSV = "routellm/evals/gsm8k/gsm8k_responses.csv"
MMLU_DIR = "routellm/evals/mmlu/responses"
TOKENIZER_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"
PER_MESSAGE, PER_REPLY = 3, 3


def git_show(repo: str, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", repo, "show", f"{commit}:{path}"], check=True, capture_output=True
    ).stdout.decode("utf-8")


def git_ls(repo: str, commit: str, path: str) -> list[str]:
    out = subprocess.run(
        ["git", "-C", repo, "ls-tree", "--name-only", f"{commit}:{path}"], check=True, capture_output=True
    )
    return sorted(out.stdout.decode().split())


class Counter_:
    """Tokens of a text by the small tier's vocabulary (no weights loaded)."""

    def __init__(self) -> None:
        import llama_cpp

        path = ModelStore().path_of(CATALOG[TOKENIZER_MODEL])
        self.model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)

    def text(self, text: str) -> int:
        return len(self.model.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def messages(self, contents: list[str]) -> int:
        return sum(self.text(c) + PER_MESSAGE for c in contents) + PER_REPLY


def gsm8k(repo: str, commit: str, tok: Counter_) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = list(csv.DictReader(io.StringIO(git_show(repo, commit, GSM8K_CSV))))
    ours: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(read_jsonl(fetch(GSM8K_TEST))):
        ours[normalize(row["question"])].append(i)
    items = {it.id: it for it in GSM8K().load()}
    out, unmatched, ambiguous = [], 0, 0
    for n, row in enumerate(rows):
        hits = ours.get(normalize(row["prompt"]), [])
        if not hits:
            unmatched += 1
            continue
        ambiguous += len(hits) > 1
        for i in hits:
            item = items[f"gsm8k/{i}"]
            answers = {}
            for tier in (MIXTRAL, GPT4):
                text = row[f"{MODELS[tier]}_response"]
                answers[tier] = {"text": text, "tokens": tok.text(text), "correct": row[MODELS[tier]] == "True"}
            out.append(
                {
                    "id": item.id,
                    "row": str(n),
                    "prompt_tokens": tok.messages([m.content for m in item.messages]),
                    "answers": answers,
                }
            )
    out.sort(key=lambda r: int(str(r["id"]).split("/")[1]))
    counts = {"published": len(rows), "suite": len(items), "matched": len(out), "unmatched": unmatched}
    counts.update(ambiguous=ambiguous, kept=len(out))
    return out, counts


def _mmlu_text(question: str, options: list[str]) -> str:
    return normalize(question + "\n" + "\n".join(f"{k}. {v}" for k, v in zip("ABCD", options, strict=True)))


def mmlu(repo: str, commit: str, tok: Counter_, keep: set[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    ours: dict[str, list[str]] = defaultdict(list)
    for i, row in enumerate(read_jsonl(fetch(MMLU_TEST))):
        if row.get("correct_answer") not in ("A", "B", "C", "D"):
            continue
        options = [row["answer_a"], row["answer_b"], row["answer_c"], row["answer_d"]]
        ours[_mmlu_text(row["question"].strip(), options)].append(f"mmlu/{i}")
    items = {it.id: it for it in MMLU().load()}
    found: dict[str, dict[str, Any]] = {}
    published = unmatched = ambiguous = conflicting = 0
    matched: set[str] = set()
    for name in git_ls(repo, commit, MMLU_DIR):
        subject = name.removeprefix("mmlu_").removesuffix(".csv")
        for n, row in enumerate(csv.DictReader(io.StringIO(git_show(repo, commit, f"{MMLU_DIR}/{name}")))):
            published += 1
            prompt = row["prompt"].rstrip()
            if not prompt.endswith("Answer:"):
                unmatched += 1
                continue
            lines = prompt.removesuffix("Answer:").rstrip("\n").split("\n")
            question, options = "\n".join(lines[:-4]), [ln[3:] for ln in lines[-4:]]
            if [ln[:3] for ln in lines[-4:]] != ["A. ", "B. ", "C. ", "D. "]:
                unmatched += 1
                continue
            hits = ours.get(_mmlu_text(question, options), [])
            if not hits:
                unmatched += 1
                continue
            ambiguous += len(hits) > 1
            matched.update(hits)
            correct = {t: row[MODELS[t]] == "True" for t in (MIXTRAL, GPT4)}
            for item_id in hits:
                if item_id not in keep:
                    continue
                entry = {
                    "id": item_id,
                    "row": f"{subject}/{n}",
                    "prompt_tokens": tok.messages([m.content for m in items[item_id].messages]),
                    "answers": {t: {"text": None, "tokens": 1, "correct": correct[t]} for t in (MIXTRAL, GPT4)},
                }
                if item_id in found and found[item_id]["answers"] != entry["answers"]:
                    conflicting += 1  # the same question published twice with different outcomes: keep the first
                found.setdefault(item_id, entry)
    out = sorted(found.values(), key=lambda r: int(r["id"].split("/")[1]))
    counts = {"published": published, "suite": len(items), "matched": len(matched), "unmatched": unmatched}
    counts.update(ambiguous=ambiguous, conflicting=conflicting, kept=len(out))
    return out, counts


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", required=True, help="a RouteLLM git directory")
    ap.add_argument("--commit", required=True, help="the commit to read (a full sha)")
    ap.add_argument("--out", default=str(DATA_DIR))
    ap.add_argument(
        "--mmlu-run",
        action="append",
        default=["evals/results/mmlu"],
        help="keep the MMLU items of these runs only (repeatable; default: the committed run)",
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = Counter_()
    g_rows, g_counts = gsm8k(args.repo, args.commit, tok)
    keep = {e["id"] for run in args.mmlu_run for e in json.loads((Path(run) / "manifest.json").read_text())["items"]}
    m_rows, m_counts = mmlu(args.repo, args.commit, tok, keep)
    write_jsonl(out / "gsm8k.jsonl", g_rows)
    write_jsonl(out / "mmlu.jsonl", m_rows)
    labels = Counter((t, a["correct"]) for r in g_rows for t, a in r["answers"].items())
    meta = {
        "source": {
            "repository": "lm-sys/RouteLLM",
            "commit": args.commit,
            "paths": [GSM8K_CSV, f"{MMLU_DIR}/mmlu_*.csv"],
            "license": "Apache-2.0",
            "retrieved": datetime.now(UTC).date().isoformat(),
        },
        "models": MODELS,
        "tokenizer": {
            "model": TOKENIZER_MODEL,
            "sha256": CATALOG[TOKENIZER_MODEL].sha256,
            "how": f"llama.cpp vocab_only; message contents plus {PER_MESSAGE} per message and {PER_REPLY} per reply "
            "(OpenAI's chat overhead); an MMLU answer is 1 token (only its correctness was published)",
        },
        "matched": {"gsm8k": g_counts, "mmlu": m_counts},
        "published_right_gsm8k": {t: labels[(t, True)] for t in (MIXTRAL, GPT4)},
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(meta["matched"], indent=1))


if __name__ == "__main__":
    main()
