"""The published frontier answers as an eval run: upper tiers that `sweep`, `calibrate` and the
frontier report read like any tier this project ran itself.

A run is written per suite with the suite's own item ids and prompt hashes (so it joins the small
tier's runs item by item) and one tier per published model, priced at its list price
(`published.PRICES`, recorded in the manifest with provider and date). Grades:

- GSM8K: every published answer is graded again by this suite's own grader (`GSM8K.grade`), the
  one that grades the small tier, and the manifest keeps where it and RouteLLM's label disagree.
  RouteLLM's label compares the answer's last integer with the reference; ours reads a stated final
  answer first and compares numbers, so they part on answers like "$18.00" or "The answer is 3,
  ... 4 more" (`Disagreement` keeps a few, with both readings).
- MMLU: only correctness was published, so the grade is RouteLLM's label and the answer text is
  empty (`detail` says so); no verifier can read such an answer.

The run is rebuilt whole from the committed subset on every call (in a scratch directory renamed
into place), so it always carries the current grader's verdicts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evals.frontier.published import MODELS, PRICES, TIERS, Published
from evals.frontier.runs import published_tier, replace_run
from evals.store import GenerationRecord, GradeRecord, RunStore, digest, generation_key, grade_key
from evals.suites.base import Suite

MAX_EXAMPLES = 6  # disagreements kept, with both readings, per tier


@dataclass(frozen=True)
class Disagreement:
    item: str
    tier: str
    ours: bool
    published: bool
    extracted: str | None  # what our grader read as the answer
    reference: str
    tail: str  # the answer's last characters, where the final number usually is


def run_name(suite: str) -> str:
    return f"routellm-{suite}"


def tier_fingerprint(published: Published, tier: str) -> str:
    """A published tier's identity: whose answers, from which commit."""
    src = published.meta["source"]
    return digest("published", src["repository"], src["commit"], MODELS[tier])


def write_run(published: Published, suite: Suite, runs_dir: Path) -> Path:
    """Write (or rewrite) the run `runs_dir/routellm-<suite>` from the published subset."""
    return replace_run(runs_dir, run_name(published.suite), lambda tmp: _write(published, suite, tmp))


async def _write(published: Published, suite: Suite, root: Path) -> None:
    items = {it.id: it for it in suite.load()}
    missing = [p.id for p in published.items if p.id not in items]
    if missing:
        from router.errors import ConfigError

        raise ConfigError(f"published items not in suite {suite.name}: {', '.join(missing[:5])}")
    disagreements: list[Disagreement] = []
    agree_counts: dict[str, dict[str, int]] = {t: {"both_right": 0, "both_wrong": 0} for t in TIERS}
    gens: list[GenerationRecord] = []
    grades: list[GradeRecord] = []
    with RunStore(root) as store:
        for tier in TIERS:
            fp = tier_fingerprint(published, tier)
            counts = agree_counts[tier]
            for p in published.items:
                item, answer = items[p.id], p.answers[tier]
                gk = generation_key(fp, item.prompt_sha)
                gens.append(
                    GenerationRecord(
                        key=gk,
                        tier=tier,
                        item=item.id,
                        model=MODELS[tier],
                        text=answer.text or "",
                        finish_reason="stop",
                        prompt_tokens=p.prompt_tokens,
                        completion_tokens=answer.tokens,
                        latency_s=0.0,  # not published
                    )
                )
                if answer.text is None:
                    correct, extracted = answer.published_correct, None
                    detail = "published correctness (RouteLLM); the answer itself was not published"
                else:
                    grade = await suite.grade(item, answer.text)
                    correct, extracted, detail = grade.correct, grade.extracted, grade.detail
                    if correct != answer.published_correct:
                        disagreements.append(
                            Disagreement(
                                p.id,
                                tier,
                                correct,
                                answer.published_correct,
                                extracted,
                                str(item.answer_key.reference),
                                " ".join(answer.text.split())[-160:],
                            )
                        )
                    else:
                        counts["both_right" if correct else "both_wrong"] += 1
                grades.append(
                    GradeRecord(
                        grade_key(gk, suite.fingerprint, item.id), gk, tier, item.id, correct, extracted, detail
                    )
                )
        store.add_generations(gens)
        store.add_grades(grades)
    RunStore(root).write_manifest(_manifest(published, suite, items, disagreements, agree_counts))


def _manifest(
    published: Published,
    suite: Suite,
    items: dict[str, Any],
    disagreements: list[Disagreement],
    agree_counts: dict[str, dict[str, int]],
) -> dict[str, Any]:
    tiers = [published_tier(t, MODELS[t], tier_fingerprint(published, t), PRICES[t].settings(MODELS[t])) for t in TIERS]
    grading: dict[str, Any] = {"grader": f"{suite.fingerprint}'s own" if suite.name == "gsm8k" else "published labels"}
    if suite.name == "gsm8k":
        for tier in TIERS:
            mine = [d for d in disagreements if d.tier == tier]
            grading[tier] = {
                **agree_counts[tier],
                "ours_right_published_wrong": sum(d.ours for d in mine),
                "ours_wrong_published_right": sum(not d.ours for d in mine),
                "examples": [asdict(d) for d in _examples(mine)],
            }
    return {
        "name": run_name(published.suite),
        "suite": {
            "name": suite.name,
            "fingerprint": suite.fingerprint,
            "task": suite.task,
            "source": f"{suite.source}; answers published by {published.meta['source']['repository']}",
            "limit": None,
            "seed": 0,
        },
        "tiers": tiers,
        "items": [
            {"id": p.id, "prompt_sha": items[p.id].prompt_sha, "group": items[p.id].group} for p in published.items
        ],
        "published": {
            "source": published.meta["source"],
            "tokenizer": published.meta["tokenizer"],
            "matched": published.matched,
            "prices": {t: asdict(PRICES[t]) for t in TIERS},
            "grading": grading,
        },
    }


def _examples(mine: list[Disagreement]) -> list[Disagreement]:
    """A few of each direction, in item order, so the page shows both kinds of disagreement."""
    up = [d for d in mine if d.ours][: MAX_EXAMPLES // 2]
    down = [d for d in mine if not d.ours][: MAX_EXAMPLES - len(up)]
    return sorted(up + down, key=lambda d: int(d.item.split("/")[1]))
