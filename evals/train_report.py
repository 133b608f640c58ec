"""The training report of `eval train`: README.md and training.json beside the artifacts, and the
config snippet that serves them.

The prose says how the estimators are made, so a reader of the committed report need not read
the code to know which numbers are held-out ones; every figure is on held-out items.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.formatting import md_table
from evals.learned_comparison import LEARNED, Comparison, comparison_json, comparison_markdown


@dataclass
class TrainResult:
    """What one training made (artifacts, and the comparisons on held-out items), as the report
    and the command read it."""

    out: Path
    artifacts: list[dict[str, Any]]
    comparisons: list[Comparison]
    pooled: Comparison | None
    feature_verifiers: dict[str, list[str]]
    suite_specific: bool
    notes: list[str] = field(default_factory=list)
    splits: list[tuple[int, str, list[tuple[str, bool | None, str]]]] = field(
        default_factory=list
    )  # seed, suite, checks


def toml_snippet(result: TrainResult, cmp: Comparison) -> str:
    """The config for the tiers but the last: the learned verifier at its calibrated threshold,
    and the pre-router at the skip threshold calibrated in front of it."""
    group = "pooled" if not result.suite_specific else cmp.table.suite
    files = {a["kind"]: a for a in result.artifacts if a["group"] == group}
    ver, pre = files["verifier"], files["prerouter"]
    cal = cmp.verify_only[LEARNED]
    pv = cmp.preroute_verify[LEARNED]
    lines = [
        f"# learned estimators calibrated for {cmp.target} on {cal.n_calibration} calibration items of "
        f"{cmp.table.suite} (seed {cal.seed}); artifact paths are relative to the working directory"
    ]
    for name, th in cal.thresholds.items():
        lines += [
            "[[tiers]]",
            f'name = "{name}"',
            f"threshold = {th:.6g}",
            "[[tiers.verifiers]]",
            'name = "learned"',
            f'params = {{ artifact = "{(result.out / ver["file"]).as_posix()}", sha256 = "{ver["sha256"]}" }}',
            "[tiers.prerouter]",
            f'artifact = "{(result.out / pre["file"]).as_posix()}"',
            f'sha256 = "{pre["sha256"]}"',
            f"threshold = {pv.skip_below[name]:.6g}",
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


METHOD = [
    "## How they are made",
    "",
    "- **What they predict.** Per tier, the probability that the tier's answer is right (as the suite's grader "
    "judges it). The `learned` verifier reads what the cascade has once the tier has answered: the scores of the "
    "verifiers listed below, the answer's logprob statistics (mean, min, 10th and 25th percentile, spread, share "
    "of tokens below even odds), its length and whether it was cut off, the prompt's length and its hashed word "
    "uni- and bi-grams. The pre-router reads the prompt alone, before the tier generates. Token entropy is not a "
    "feature: the backends return only the sampled tokens' logprobs.",
    "- **The model.** A logistic regression per tier; 5-fold cross-validated log-loss chooses its "
    "regularisation and how much the prompt grams may weigh (or whether they are dropped); Platt scaling of the "
    "cross-validated logits calibrates it. The artifact is plain JSON, loaded only when its SHA-256 is the one "
    "the config names.",
    "- **Hygiene.** Items are split as `eval calibrate` splits them (seed and item id). The models are fit on "
    "the calibration items only. Thresholds are chosen on the calibration items too, from out-of-fold "
    "predictions: each calibration item is scored by a model fit (with its own inner cross-validation) on the "
    "other four fifths, never by one that saw it. Held-out items are scored once, by the final model (the one "
    "in the artifact), and every number below is on them.",
    "- **Policies.** *verify only*: the cascade with one verifier, thresholds calibrated for the target. "
    "*pre-route only*: skip a tier whose pre-router probability is below its threshold, else take its answer "
    "unverified. *pre-route then verify*: skip as the pre-router says, verify what runs; the verifier "
    "thresholds are the ones verify-only calibration chooses for the target, and the skip thresholds the "
    "cheapest whose calibration accuracy is at most 1 point below verify-only's (chosen one after the other, "
    "not as a pair: a joint search over thousands of pairs picks the luckiest). "
    "*verify only[learned], matched*: the learned cascade calibrated for "
    "`min-accuracy` at the accuracy the best single verifier's cascade reaches on the calibration items, so the "
    "two are compared at one accuracy level (a level taken from calibration items, not held-out ones). The cost "
    "target counts as met when any learned policy is cheaper than the best single verifier's at equal or "
    "better held-out accuracy.",
]


def write_report(result: TrainResult, *, command: str = "") -> None:
    lines = ["# Learned estimators: training report", ""]
    if command:
        lines += ["Regenerate:", "", "```", command, "```", ""]
    lines += [*METHOD, ""]
    lines += [
        "| artifact | version | sha256 |",
        "|---|---|---|",
        *(f"| `{a['file']}` | {a['version']} | `{a['sha256']}` |" for a in result.artifacts),
        "",
    ]
    lines += [f"- {n}" for n in result.notes]
    for a in (a for a in result.artifacts if a["kind"] == "verifier"):
        labels = sorted({lbl for r in a["runs"] for lbl in result.feature_verifiers[r]})
        lines += [f"Verifier scores read by `{a['file']}`: {', '.join(f'`{x}`' for x in labels) or 'none'}.", ""]
    for cmp in [*result.comparisons, *([result.pooled] if result.pooled else [])]:
        lines += [*comparison_markdown(cmp, level=2), ""]
        if result.pooled is None or cmp is result.pooled:  # a pooled estimator serves with the pooled thresholds
            lines += ["Config:", "", "```toml", toml_snippet(result, cmp).rstrip(), "```", ""]
    if result.splits:
        lines += splits_markdown(result)
    (result.out / "README.md").write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    (result.out / "training.json").write_text(
        json.dumps(
            {
                "artifacts": result.artifacts,
                "suites": [comparison_json(c) for c in result.comparisons],
                "pooled": comparison_json(result.pooled) if result.pooled else None,
                "other_splits": [
                    {
                        "seed": seed,
                        "suite": suite,
                        "checks": [{"target": w, "met": ok, "numbers": n} for w, ok, n in checks],
                    }
                    for seed, suite, checks in result.splits
                ],
            },
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )


def splits_markdown(result: TrainResult) -> list[str]:
    """Each target on each other split: estimators retrained and thresholds recalibrated per split."""
    seeds = sorted({seed for seed, _, _ in result.splits})
    lines = [
        "## The same on other splits",
        "",
        f"Retrained and recalibrated on the calibration split of each seed ({', '.join(map(str, seeds))}), "
        "reported on its held-out items: how often each target is met.",
        "",
    ]
    suites = list(dict.fromkeys(suite for _, suite, _ in result.splits))
    for suite in suites:
        rows: dict[str, dict[int, str]] = {}
        tally: dict[str, list[bool]] = {}
        for seed, s, checks in result.splits:
            if s != suite:
                continue
            for what, ok, numbers in checks:
                mark = "met" if ok else ("–" if ok is None else "**missed**")
                rows.setdefault(what, {})[seed] = f"{mark} ({numbers})"
                if ok is not None:
                    tally.setdefault(what, []).append(ok)
        header = ["target", *(f"seed {x}" for x in seeds), "met"]
        body = [
            [what, *(cells.get(x, "–") for x in seeds), f"{sum(tally.get(what, []))}/{len(tally.get(what, []))}"]
            for what, cells in rows.items()
        ]
        lines += [f"### {suite}", "", *md_table(header, body), ""]
    return lines
