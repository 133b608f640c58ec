"""How well the `degeneration` verifier predicts a right answer on committed eval runs.

    .venv/bin/python scripts/degeneration_auroc.py [RUN_DIR ...]   (default: evals/results/*)

Reads each run's generations and grades as they are (writes nothing), scores every answer with
the verifier's default params against the request the model was sent, and prints per tier: the
AUROC of the score at predicting a right answer (evals.measures.auroc), how many answers each sign
flagged, and the accuracy of the flagged and the unflagged answers. Needs the suites' data (from
the pinned wheel, as `eval run` does) to rebuild each request; no model.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter, defaultdict
from pathlib import Path

from evals.measures import auroc
from evals.store import RunStore
from evals.suites import get_suite
from router.generation import GenerationRequest
from verifiers.degeneration import DegenerationVerifier

RESULTS = Path("evals/results")


async def run(run_dir: Path) -> None:
    store = RunStore(run_dir)
    manifest = store.manifest()
    suite = get_suite(manifest["suite"]["name"])
    items = {item.id: item for item in suite.load()}
    verifier = DegenerationVerifier()
    by_tier: dict[str, list[tuple[bool, float, list[str]]]] = defaultdict(list)
    for tier, entry, rec, grade in store.graded():
        request = GenerationRequest(messages=items[entry["id"]].messages)
        score = await verifier.score(request, rec.to_generation())
        assert score.value is not None
        by_tier[tier].append((grade.correct, score.value, score.details["signs"]))
    for tier in sorted(by_tier):
        rows = by_tier[tier]
        correct = [c for c, _, _ in rows]
        area = auroc(correct, [v for _, v, _ in rows])
        flagged = [c for c, v, _ in rows if v < 1.0]
        clean = [c for c, v, _ in rows if v == 1.0]
        signs = Counter(s for _, _, ss in rows for s in ss)
        print(
            f"{run_dir.name:10s} {tier:6s} n={len(rows):4d} accuracy={sum(correct) / len(rows):.3f} "
            f"AUROC={'n/a' if area is None else f'{area:.3f}'} flagged={len(flagged)} "
            f"(right {sum(flagged)}/{len(flagged)}) unflagged right {sum(clean)}/{len(clean)}"
        )
        for sign, count in signs.most_common():
            print(f"{'':18s}{count:4d} x {sign}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*", type=Path)
    args = parser.parse_args()
    runs = args.runs or sorted(p for p in RESULTS.iterdir() if (p / "manifest.json").is_file())
    for run_dir in runs:
        asyncio.run(run(run_dir))


if __name__ == "__main__":
    main()
