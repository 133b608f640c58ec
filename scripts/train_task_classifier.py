"""Fit the task classifier (`router.learned.task_model`) and measure it on held-out prompts.

    .venv/bin/python scripts/train_task_classifier.py [--out router/data/task_model.json] [--no-write]

Data: the prompts of the eval suites, each as the router sees it (the last user message, not
MMLU's few-shot turns) and labelled by its suite's task (gsm8k -> maths, humaneval -> code,
mmlu -> choice), plus `evals/data/open_ended_prompts.jsonl`: open-ended prompts written for the
project and maths, code and choice prompts worded unlike the suites.

Split, fixed by hashing so a rerun (or a grown file) keeps every item on its side: a suite item is
held out when crc32 of its id falls in the held-out share; a prompt of the file is held out with
its whole `group` (a hand-written prompt is its own group, a templated one shares its template's),
so no held-out prompt has a sibling from the same template in training. MMLU's 14,042 items are
sampled (`--mmlu-train`, `--mmlu-test`, drawn by seed) so one suite does not drown the others; the
script also scores every held-out MMLU item. Prints the table quoted in docs/tasks.md and writes
the fitted model unless `--no-write`. Deterministic: the same data and arguments give the same file.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evals.suites import get_suite
from router.generation import GenerationRequest, Message
from router.learned.task_model import DEFAULT_PATH, fit
from router.tasks import detect_task

PROMPTS = Path(__file__).resolve().parents[1] / "evals" / "data" / "open_ended_prompts.jsonl"
SUITE_TASKS = {"gsm8k": "maths", "humaneval": "code", "mmlu": "choice"}


@dataclass(frozen=True)
class Example:
    text: str
    task: str
    source: str  # a suite's name, or the file's source ("hand" or "template")
    group: str  # what is kept together on one side of a split


def held_out(key: str, share: float) -> bool:
    return zlib.crc32(key.encode()) % 1000 < share * 1000


def last_user_text(messages: tuple[object, ...]) -> str:
    for m in reversed(messages):
        if getattr(m, "role", None) == "user":
            return str(getattr(m, "content", ""))
    raise ValueError("an item without a user message")


def load_examples(
    share: float, mmlu_train: int, mmlu_test: int, seed: int
) -> tuple[list[Example], list[Example], list[Example]]:
    """(train, test, every held-out MMLU item)."""
    train: list[Example] = []
    test: list[Example] = []
    mmlu_all: list[Example] = []
    for name, task in SUITE_TASKS.items():
        items = get_suite(name).load()
        tr = [Example(last_user_text(i.messages), task, name, i.id) for i in items if not held_out(i.id, share)]
        te = [Example(last_user_text(i.messages), task, name, i.id) for i in items if held_out(i.id, share)]
        if name == "mmlu":
            mmlu_all = te
            rng = random.Random(f"{seed}:mmlu")
            tr = rng.sample(tr, min(mmlu_train, len(tr)))
            te = rng.sample(te, min(mmlu_test, len(te)))
        train += tr
        test += te
    for line in PROMPTS.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        ex = Example(row["text"], row["task"], row["source"], row["group"])
        (test if held_out(row["group"], share) else train).append(ex)
    return train, test, mmlu_all


def accuracy_table(predict: Callable[[str], str], test: list[Example]) -> tuple[str, float, list[tuple[Example, str]]]:
    right: Counter[str] = Counter()
    total: Counter[str] = Counter()
    by_source: dict[str, Counter[str]] = defaultdict(Counter)
    wrong = []
    for ex in test:
        label = predict(ex.text)
        ok = label == ex.task
        total[ex.task] += 1
        right[ex.task] += ok
        by_source[f"{ex.task} ({ex.source})"]["n"] += 1
        by_source[f"{ex.task} ({ex.source})"]["right"] += ok
        if not ok:
            wrong.append((ex, label))
    lines = ["| held-out | n | accuracy |", "|---|---:|---:|"]
    for task in sorted(total):
        lines.append(f"| {task} | {total[task]} | {right[task] / total[task]:.1%} |")
    for key in sorted(by_source):
        c = by_source[key]
        lines.append(f"| - {key} | {c['n']} | {c['right'] / c['n']:.1%} |")
    overall = sum(right.values()) / sum(total.values())
    macro = sum(right[t] / total[t] for t in total) / len(total)
    for name, keep in (("written for the project", ("hand", "template")), ("hand-written only", ("hand",))):
        mine = [(ex, ex not in {w for w, _ in wrong}) for ex in test if ex.source in keep]
        lines.append(f"| {name}, all tasks | {len(mine)} | {sum(ok for _, ok in mine) / len(mine):.1%} |")
    lines.append(f"| **overall** | {sum(total.values())} | **{overall:.1%}** |")
    lines.append(f"| mean of the classes | | {macro:.1%} |")
    return "\n".join(lines), overall, wrong


def choose_c(train: list[Example], grid: list[float], n_features: int, folds: int = 5) -> float:
    """The C with the best mean per-class accuracy in grouped k-fold cross-validation on the
    training split alone (the held-out split plays no part in choosing it)."""
    best, best_score = grid[0], -1.0
    for c in grid:
        right: Counter[str] = Counter()
        total: Counter[str] = Counter()
        for k in range(folds):
            inner = [e for e in train if zlib.crc32(e.group.encode()) % folds != k]
            outer = [e for e in train if zlib.crc32(e.group.encode()) % folds == k]
            model = fit([e.text for e in inner], [e.task for e in inner], n_features=n_features, c=c)
            for e in outer:
                total[e.task] += 1
                right[e.task] += model.predict(e.text)[0] == e.task
        score = sum(right[t] / total[t] for t in total) / len(total)
        print(f"  C={c:g}: cross-validated mean per-class accuracy {score:.2%}")
        if score > best_score:
            best, best_score = c, score
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_PATH)
    ap.add_argument("--no-write", action="store_true", help="measure only; leave the committed model alone")
    ap.add_argument("--held-out", type=float, default=0.3, help="share of items held out (default 0.3)")
    ap.add_argument("--mmlu-train", type=int, default=1200)
    ap.add_argument("--mmlu-test", type=int, default=500)
    ap.add_argument("--n-features", type=int, default=1 << 13)
    ap.add_argument(
        "-C",
        type=float,
        nargs="+",
        default=[100.0],
        help="inverse L2 strength; given several (the default was picked from -C 1 3 10 30 100), "
        "the best by grouped 5-fold cross-validation on the training split is used",
    )
    ap.add_argument("--seed", type=int, default=18)
    args = ap.parse_args()

    train, test, mmlu_all = load_examples(args.held_out, args.mmlu_train, args.mmlu_test, args.seed)
    print(f"train: {dict(sorted(Counter(e.task for e in train).items()))}")
    print(f"test:  {dict(sorted(Counter(e.task for e in test).items()))}")
    meta = {
        "trained_by": "scripts/train_task_classifier.py",
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "no_write")},
        "n_train_by_task": dict(sorted(Counter(e.task for e in train).items())),
    }
    c = args.C[0] if len(args.C) == 1 else choose_c(train, args.C, args.n_features)
    print(f"C = {c:g}")
    model = fit([e.text for e in train], [e.task for e in train], n_features=args.n_features, c=c, meta=meta)

    table, overall, wrong = accuracy_table(lambda text: model.predict(text)[0], test)
    print("\n" + table + "\n")
    # what the service does: the rules first, the classifier only for what no rule claims
    detect, detected, _ = accuracy_table(
        lambda text: detect_task(GenerationRequest(messages=(Message("user", text),)), model).task, test
    )
    print("the router's detection (router.tasks.detect_task: rules, then this classifier):\n" + detect + "\n")
    print(f"detection overall on held-out prompts: {detected:.1%}")
    every = sum(model.predict(e.text)[0] == "choice" for e in mmlu_all) / max(len(mmlu_all), 1)
    print(f"every held-out MMLU item ({len(mmlu_all)}): {every:.1%} labelled choice")
    train_acc = sum(model.predict(e.text)[0] == e.task for e in train) / len(train)
    print(f"training accuracy: {train_acc:.1%}")
    for ex, label in wrong:
        print(f"  wrong: {ex.task} ({ex.source}) -> {label}: {ex.text[:100]!r}")

    probe = " ".join(e.text for e in test)[:4096]
    times = []
    for _ in range(1000):
        start = time.perf_counter()
        model.predict(probe)
        times.append(time.perf_counter() - start)
    print(f"\npredict on a 4 KB prompt: median {statistics.median(times) * 1e6:.0f} us")

    if not args.no_write:
        model.save(args.out)
        print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB), held-out overall {overall:.1%}")


if __name__ == "__main__":
    main()
