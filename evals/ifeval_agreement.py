"""How this project's IFEval grading and instruction reader agree with the published ones.

Two measurements, on the committed data in ``evals/data/ifeval``:

* `grading_agreement`: per instruction kind, how often `evals.ifeval_checks.follows` gives GPT-4's
  published answer the verdict a third party's strict grading with the authors' checkers gave it
  (``eval_results_strict.jsonl``, 540 prompts, 832 instructions).
* `reader_accuracy`: per kind, the precision and recall of the `instructions` verifier's reader
  (`verifiers.instructions.parse`) against IFEval's answer key on its 541 prompts: of the kind
  alone, and of the kind with the key's exact arguments. This reads the key; the verifier never
  does.

``.venv/bin/python -m evals.ifeval_agreement`` prints both as the Markdown tables in
docs/evaluating.md and docs/verifiers.md; tests/evals/test_ifeval_checks.py and
tests/verifiers/test_instructions.py hold them to their floors.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.ifeval_checks import follows
from verifiers.instructions.parse import read_constraints

DATA = Path(__file__).resolve().parent / "data" / "ifeval"


def rows(name: str) -> list[dict[str, Any]]:
    """The records of one of the committed IFEval files."""
    text = (DATA / name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@dataclass
class Agreement:
    total: Counter[str]
    agree: Counter[str]
    # (prompt key, kind) -> (our verdict, the published one), where they differ
    differ: dict[tuple[int, str], tuple[bool, bool]]


def grading_agreement() -> Agreement:
    items = {r["prompt"]: r for r in rows("input_data.jsonl")}
    out = Agreement(Counter(), Counter(), {})
    for graded in rows("eval_results_strict.jsonl"):
        item = items[graded["prompt"]]
        verdicts = zip(item["instruction_id_list"], item["kwargs"], graded["follow_instruction_list"], strict=True)
        for kind, kwargs, theirs in verdicts:
            ours = follows(kind, kwargs, graded["response"], prompt=item["prompt"])
            out.total[kind] += 1
            if ours == theirs:
                out.agree[kind] += 1
            else:
                out.differ[(item["key"], kind)] = (ours, theirs)
    return out


STATS = ("kind_precision", "kind_recall", "args_precision", "args_recall")


def _norm(value: Any) -> Any:
    if isinstance(value, str):
        return value.strip().lower()
    if isinstance(value, list):
        return tuple(sorted({v.strip().lower() for v in value}))
    return value


def _args(kwargs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _norm(v)) for k, v in kwargs.items() if v is not None))


def _ratio(hit: int, other: int) -> float:
    return hit / (hit + other) if hit + other else 1.0


def reader_accuracy() -> dict[str, dict[str, float]]:
    """Precision and recall of the reader against IFEval's key, per kind and overall (key "")."""
    counts: dict[str, Counter[str]] = {name: Counter() for name in ("tp", "fp", "fn", "atp", "afp", "afn")}
    for row in rows("input_data.jsonl"):
        key = [(k, _args(a)) for k, a in zip(row["instruction_id_list"], row["kwargs"], strict=True)]
        got = [(c.kind, _args(c.args)) for c in read_constraints(row["prompt"])]
        kinds_wanted: Counter[Any] = Counter(k for k, _ in key)
        kinds_had: Counter[Any] = Counter(k for k, _ in got)
        for prefix, want, have in (("", kinds_wanted, kinds_had), ("a", Counter[Any](key), Counter[Any](got))):
            for thing in want | have:
                kind = thing if isinstance(thing, str) else thing[0]
                hit = min(want[thing], have[thing])
                counts[prefix + "tp"][kind] += hit
                counts[prefix + "fp"][kind] += have[thing] - hit
                counts[prefix + "fn"][kind] += want[thing] - hit
    out: dict[str, dict[str, float]] = {}
    kinds = sorted(counts["tp"] | counts["fp"] | counts["fn"])
    for kind in [*kinds, ""]:

        def n(name: str, kind: str = kind) -> int:
            return sum(counts[name].values()) if kind == "" else counts[name][kind]

        out[kind] = {
            "kind_precision": _ratio(n("tp"), n("fp")),
            "kind_recall": _ratio(n("tp"), n("fn")),
            "args_precision": _ratio(n("atp"), n("afp")),
            "args_recall": _ratio(n("atp"), n("afn")),
        }
    return out


def main() -> None:
    a = grading_agreement()
    accuracy = reader_accuracy()
    print("| kind | instructions | agree (grading) | reader P / R (kind) | reader P / R (with arguments) |")
    print("|---|---|---|---|---|")
    for kind in sorted(a.total):
        r = accuracy.get(kind, dict.fromkeys(STATS, 1.0))
        print(
            f"| `{kind}` | {a.total[kind]} | {a.agree[kind]} ({a.agree[kind] / a.total[kind]:.1%}) | "
            f"{r['kind_precision']:.2f} / {r['kind_recall']:.2f} | {r['args_precision']:.2f} / {r['args_recall']:.2f} |"
        )
    total, agree, r = sum(a.total.values()), sum(a.agree.values()), accuracy[""]
    print(
        f"| all | {total} | {agree} ({agree / total:.1%}) | {r['kind_precision']:.3f} / {r['kind_recall']:.3f} | "
        f"{r['args_precision']:.3f} / {r['args_recall']:.3f} |"
    )
    print()
    for (key, kind), (ours, theirs) in sorted(a.differ.items()):
        print(f"- prompt {key}, `{kind}`: ours {ours}, published {theirs}")


if __name__ == "__main__":
    main()
