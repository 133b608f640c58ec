"""Each suite judged by its task's policy against the one policy every request had before tasks.

    .venv/bin/python scripts/task_policy_gain.py [--seed 0] [--fraction 0.5]

Before tasks (issue 18) the default config judged every request by mean token confidence at 0.91,
the threshold calibrated on GSM8K. Now each suite's items are judged by the policy of their task
(`tiers[].tasks.<task>`), as recorded in the committed run's manifest. For each committed run this
prints, on the held-out items of the calibration split that `eval calibrate` uses (same seed and
fraction) and on all items: accuracy, cost per 1k requests and escalation of both, side by side,
with always-small and always-large on the same items. Reads the runs as they are; writes nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from evals.calibrate import split
from evals.store import RunStore
from evals.sweep import CascadePolicy, PolicyResult, ResultTable, SingleTier, evaluate, load_table
from router.tasks import SUITE_TASKS

RESULTS = Path("evals/results")
BEFORE = ('confidence[stat="mean"]', 0.91)  # the pre-task default: one verifier and threshold for all


def _cell(r: PolicyResult) -> str:
    return f"{100 * r.accuracy:.1f}% / ${r.cost_per_1k:.4f} / {100 * r.escalation_rate:.0f}%"


def rows(table: ResultTable) -> list[tuple[str, PolicyResult]]:
    now = table.tiers[0].threshold  # the task policy's threshold recorded with the run
    verifier, threshold = BEFORE
    return [
        ("before tasks: confidence mean at 0.91", evaluate(CascadePolicy(verifier, (threshold,)), table)),
        (f"task policy ('config' at {now:g})", evaluate(CascadePolicy("config", (now,)), table)),
        ("always small", evaluate(SingleTier(0), table)),
        ("always large", evaluate(SingleTier(len(table.tiers) - 1), table)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fraction", type=float, default=0.5)
    args = parser.parse_args()
    print("| suite (task) | items | policy | accuracy / cost per 1k / escalated |")
    print("|---|---|---|---|")
    for suite in ("gsm8k", "humaneval", "mmlu"):
        with RunStore(RESULTS / suite) as store:
            table = load_table(store)
            task = SUITE_TASKS.get(store.manifest()["suite"]["task"])
        _, held = split(table, args.seed, args.fraction)
        for label, part in (("held-out", held), ("all", table)):
            for name, result in rows(part):
                print(f"| {suite} ({task}) | {label} {result.n} | {name} | {_cell(result)} |")


if __name__ == "__main__":
    main()
