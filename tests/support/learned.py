"""A small stored run with something to learn, made by the real runner behind scripted backends.

The suite: sums, each prompt marked "Easy" or "Hard". The small tier is right on most easy
prompts and few hard ones, and its logprobs are higher when it is right (with noise), so a
prompt-only estimator can learn from the words and a verifier from the logprobs. The large tier
is right on nine in ten. Every draw is seeded by the item's number: the run is the same each time.
The eval verifiers are real built-ins that cost no generation."""

from __future__ import annotations

import json
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path

from evals.runner import EvalPlan, run_eval
from evals.store import RunStore
from evals.suites import get_suite
from router.backends.base import Backend
from router.config import VerifierSpec, load_settings
from router.generation import Delta, Generation, GenerationRequest
from tests.support.evals import write_config
from verifiers.base import Registry

EVAL_VERIFIERS = [
    VerifierSpec(name="confidence", params={"stat": "mean"}),
    VerifierSpec(name="confidence", params={"stat": "min", "name": "confidence_min"}),
    VerifierSpec(name="math_answer"),
]
_Q = re.compile(r"(Easy|Hard): what is (\d+) \+ 100\?")


def write_suite(tmp: Path, n: int, name: str = "marked") -> Path:
    path = tmp / f"{name}.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            kind = "Easy" if random.Random(f"kind{i}").random() < 0.5 else "Hard"
            f.write(
                json.dumps(
                    {
                        "id": f"{name}/{i}",
                        "prompt": f"{kind}: what is {i} + 100?",
                        "reference": i + 100,
                        "grader": "numeric",
                    }
                )
                + "\n"
            )
    return path


def parse(request: GenerationRequest) -> tuple[bool, int]:
    m = _Q.search(request.last_user_text())
    assert m, request.last_user_text()
    return m.group(1) == "Easy", int(m.group(2))


class TierBackend(Backend):
    """Answers at once; right with probability `p_easy` / `p_hard`, drawn per item."""

    def __init__(self, name: str, p_easy: float, p_hard: float, sep: float) -> None:
        super().__init__(name)
        self.p_easy, self.p_hard, self.sep = p_easy, p_hard, sep

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        easy, i = parse(request)
        rng = random.Random(f"{self.name}{i}")
        right = rng.random() < (self.p_easy if easy else self.p_hard)
        text = f"the answer is {i + 100 if right else i + 99}"
        level = -0.05 if right else -0.05 - self.sep
        lps = tuple(min(0.0, rng.gauss(level, 0.8)) for _ in range(6))
        yield Delta(text)
        yield Generation(
            text=text,
            finish_reason="stop",
            prompt_tokens=10,
            completion_tokens=len(lps),
            token_logprobs=lps,
            latency_s=0.5,
            busy_s=1.0,
            model=f"scripted-{self.name}",
        )


def backends() -> dict[str, Backend]:
    return {"small": TierBackend("small", 0.8, 0.25, 0.5), "large": TierBackend("large", 0.92, 0.88, 0.2)}


async def make_run(tmp: Path, n: int = 160, name: str = "marked", verifiers: list[VerifierSpec] | None = None) -> Path:
    """Run the scripted tiers over `n` items of suite `name` into tmp/runs/<name>, scored with
    `verifiers` (default: EVAL_VERIFIERS); return the run directory."""
    settings = load_settings(
        write_config(
            tmp,
            models=("scripted-small.gguf", "scripted-large.gguf"),
            n_parallel=8,
            verifier='name = "confidence"\nparams = { stat = "mean" }',
        )
    )
    suite = get_suite(str(write_suite(tmp, n, name)))
    items = suite.select(suite.load(), None, 0)
    plan = EvalPlan(
        suite=suite,
        items=items,
        settings=settings,
        tiers=["small", "large"],
        verifiers=list(EVAL_VERIFIERS if verifiers is None else verifiers),
    )
    root = tmp / "runs" / name
    with RunStore(root) as store:
        summary = await run_eval(plan, store, registry=Registry.from_entry_points(), backends=backends())
    assert not summary.failed
    return root
