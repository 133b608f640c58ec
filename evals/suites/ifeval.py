"""IFEval: 541 prompts whose instructions a program can check (length, format, case, keywords...).

The instruction-following workload is what most application traffic looks like: write this, in
that shape. IFEval (Zhou et al., 2023) pairs each prompt with the ids and arguments of the
constraints it states ("answer in lowercase", "at least 300 words", "wrap the answer in double
quotes"); the answer is graded by checking each one. The data is the authors' (Apache-2.0), read
from ``evals/data/ifeval/input_data.jsonl`` (PROVENANCE.md beside it).

The constraint list and its arguments are the grader's alone (`AnswerKey.reference`): a verifier
sees the prompt and the answer, and must read the constraints from the prompt's own words
(`verifiers/instructions`). Grading is IFEval's *strict* accuracy per prompt: every instruction
followed (`evals/ifeval_checks.py`); the per-instruction results are in the grade's detail.
"""

from __future__ import annotations

import json
from pathlib import Path

from evals.data import read_jsonl
from evals.grading import Grade
from evals.suites.base import AnswerKey, Item, Suite
from router.generation import Message

DATA = Path(__file__).resolve().parents[1] / "data" / "ifeval" / "input_data.jsonl"


class IFEval(Suite):
    name = "ifeval"
    task = "text"
    # IFEval's longest asks are "at least 800 words" (about 1,100 tokens)
    max_tokens = 1280
    version = "1"
    source = "IFEval (Zhou et al., 2023), 541 prompts, Apache-2.0 (evals/data/ifeval/PROVENANCE.md)"

    def __init__(self, path: Path = DATA) -> None:
        self.path = path

    def load(self, cache_dir: Path | None = None) -> list[Item]:
        items = []
        for row in read_jsonl(self.path):
            instructions = [
                {"id": iid, "kwargs": {k: v for k, v in (kw or {}).items() if v is not None}}
                for iid, kw in zip(row["instruction_id_list"], row["kwargs"], strict=True)
            ]
            items.append(
                Item(
                    id=f"ifeval/{row['key']}",
                    messages=(Message("user", row["prompt"]),),
                    answer_key=AnswerKey(reference={"instructions": instructions, "prompt": row["prompt"]}),
                    group=row["instruction_id_list"][0].split(":")[0],
                )
            )
        return items

    async def grade(self, item: Item, text: str) -> Grade:
        from evals.ifeval_checks import follows

        ref = item.answer_key.reference
        results = [follows(i["id"], i["kwargs"], text, prompt=ref["prompt"]) for i in ref["instructions"]]
        detail = json.dumps({i["id"]: ok for i, ok in zip(ref["instructions"], results, strict=True)})
        return Grade(all(results), text.strip()[:200], detail)
