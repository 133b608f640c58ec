"""How well the `execution` verifier predicts a right answer on committed eval runs.

    .venv/bin/python scripts/execution_auroc.py [RUN_DIR ...]   (default: evals/results/*)

Reads each run's generations and grades as they are (writes nothing), scores every answer with
the verifier's default params (no second opinion: that needs a model) through its public
``score()``, running each answer's program in the sandbox, and prints per tier: how many answers
show a program, the outcomes with the accuracy of each group, and the AUROC of the score at
predicting a right answer (evals.measures.auroc) two ways: over all answers with an abstention
counted as 0.5, and over the answers it scored only. Needs the suites' data (from the pinned
wheel, as `eval run` does) to rebuild each request, and bubblewrap; no model.

What it printed on the committed runs (November 2026), AUROC with abstentions as 0.5 / scored only:
GSM8K small 0.592 / 0.713 (57 answers show a program, 49 scored: agree 15, 7 right; disagree 33,
3 right), GSM8K large 0.659 / 0.929 (62 programs, 43 scored: agree 19, 15 right; disagree 23,
none right; 18 sympy programs abstain); HumanEval: 14 small answers whose example crashes score 0,
all wrong, the rest abstain; MMLU: abstains on every answer.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict
from pathlib import Path

from evals.measures import auroc
from evals.store import RunStore
from evals.suites import get_suite
from router.generation import GenerationRequest
from verifiers.execution import ExecutionVerifier

RESULTS = Path("evals/results")


def _area(correct: list[bool], scores: list[float]) -> str:
    area = auroc(correct, scores) if correct else None
    return "n/a" if area is None else f"{area:.3f}"


async def run(run_dir: Path, concurrency: int) -> None:
    store = RunStore(run_dir)
    manifest = store.manifest()
    suite = get_suite(manifest["suite"]["name"])
    items = {item.id: item for item in suite.load()}
    verifier = ExecutionVerifier(max_concurrency=concurrency, max_queue=100_000)
    jobs = []
    for tier, entry, rec, grade in store.graded():
        request = GenerationRequest(messages=items[entry["id"]].messages)
        jobs.append((tier, grade.correct, verifier.score(request, rec.to_generation())))
    scores = await asyncio.gather(*(job for _, _, job in jobs))
    by_tier: dict[str, list[tuple[bool, float | None, str, int]]] = defaultdict(list)
    sandbox_s: dict[str, list[float]] = defaultdict(list)
    for (tier_name, correct, _), score in zip(jobs, scores, strict=True):
        by_tier[tier_name].append((correct, score.value, score.details["outcome"], score.details["blocks"]))
        if "sandbox_s" in score.details:
            sandbox_s[tier_name].append(score.details["sandbox_s"])
    for tier_name in sorted(by_tier):
        rows = by_tier[tier_name]
        correct = [c for c, _, _, _ in rows]
        scored = [(c, v) for c, v, _, _ in rows if v is not None]
        programs = sum(b > 0 for _, _, _, b in rows)
        print(
            f"{run_dir.name:10s} {tier_name:6s} n={len(rows):4d} accuracy={sum(correct) / len(rows):.3f} "
            f"with a program={programs} scored={len(scored)} "
            f"AUROC abstain-as-0.5={_area(correct, [0.5 if v is None else v for _, v, _, _ in rows])} "
            f"scored-only={_area([c for c, _ in scored], [v for _, v in scored])}"
        )
        if sandbox_s[tier_name]:
            runs = sandbox_s[tier_name]
            print(f"{'':18s}{len(runs)} sandboxed runs, {sum(runs) / len(runs):.2f} s each on average (wall)")
        groups: dict[str, list[bool]] = defaultdict(list)
        for c, _, outcome, _ in rows:
            groups[outcome].append(c)
        for outcome, cs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            print(f"{'':18s}{len(cs):4d} x {outcome:20s} right {sum(cs)}/{len(cs)} ({sum(cs) / len(cs):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--concurrency", type=int, default=2, help="sandboxes at once (default 2)")
    args = parser.parse_args()
    runs = args.runs or sorted(p for p in RESULTS.iterdir() if (p / "manifest.json").is_file())
    for run_dir in runs:
        asyncio.run(run(run_dir, args.concurrency))


if __name__ == "__main__":
    main()
