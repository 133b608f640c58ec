"""Test seams for the eval runner: scripted backends and verifiers, a two-tier config, a small
JSONL suite. They sit behind the same `Engine.from_settings(backends=..., registry=...)` seams the
production code offers; nothing in the runner knows about them."""

from __future__ import annotations

import json
import random
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from evals.runner import EvalPlan, run_eval
from evals.store import RunStore
from evals.suites import get_suite
from evals.sweep import CONFIG, ItemOutcome, ResultTable, TierInfo, TierOutcome
from router.backends.base import Backend
from router.config import PriceSettings, VerifierSpec, load_settings
from router.generation import Delta, Generation, GenerationRequest
from tests.support.config import keyless, tier
from tests.support.model import SMOL
from verifiers.base import Registry, Score, VerifierContext


def write_config(
    tmp: Path,
    extra_tier: str = "",
    *,
    models: tuple[str, str] = (SMOL, SMOL),
    n_parallel: int = 2,
    verifier: str = 'name = "keyword"',
) -> Path:
    """The two-tier test config: a time-priced small tier with one verifier, a token-priced large one."""
    small = tier(
        "small",
        threshold=0.5,
        max_tokens=64,
        engine={"model": models[0], "n_parallel": n_parallel},
        price={"usd_per_hour": 3.6, "stands_for": "test: $0.001 per busy second"},
        extra=f"[[tiers.verifiers]]\n{verifier}",
    )
    large = tier(
        "large",
        max_tokens=64,
        engine={"model": models[1], "n_parallel": n_parallel},
        price={
            "usd_per_1m_input_tokens": 1000.0,
            "usd_per_1m_output_tokens": 2000.0,
            "stands_for": "test: $0.001 per input token, $0.002 per output token",
        },
    )
    path = tmp / "config.toml"
    path.write_text("\n" + keyless({"enabled": False}) + small + large + extra_tier)
    return path


def write_suite(tmp: Path, n: int = 8) -> Path:
    """n sums, numeric grader; answers are the scripted backends' business."""
    path = tmp / "sums.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {
                        "id": f"q{i}",
                        "prompt": f"What is {i} + 100?",
                        "reference": i + 100,
                        "grader": "numeric",
                        "group": "even" if i % 2 == 0 else "odd",
                    }
                )
                + "\n"
            )
    return path


def question_number(request: GenerationRequest) -> int:
    m = re.search(r"What is (\d+) \+ 100", request.last_user_text())
    assert m, request.last_user_text()
    return int(m.group(1))


class ScriptedBackend(Backend):
    """Answers `reply(request)` at once. Token counts are word counts; the busy time is fixed so
    costs are exact. `fail_on` items raise (to simulate a crash mid-run)."""

    def __init__(
        self,
        name: str,
        reply: Callable[[GenerationRequest], str],
        *,
        busy_s: float = 1.0,
        fail_on: Callable[[GenerationRequest], BaseException | None] | None = None,
    ) -> None:
        super().__init__(name)
        self.reply = reply
        self.busy_s = busy_s
        self.fail_on = fail_on
        self.requests: list[GenerationRequest] = []
        self.started = 0

    async def start(self) -> None:
        self.started += 1

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        self.requests.append(request)
        if self.fail_on is not None and (exc := self.fail_on(request)) is not None:
            raise exc
        text = self.reply(request)
        words = len(text.split())
        yield Delta(text)
        yield Generation(
            text=text,
            finish_reason="stop",
            prompt_tokens=10,
            completion_tokens=words,
            token_logprobs=(-0.1,) * words,
            latency_s=0.5,
            busy_s=self.busy_s,
            model=f"scripted-{self.name}",
        )


def small_reply(request: GenerationRequest) -> str:
    """Right on even questions. Says 'sure' on multiples of 4 (right) and on 3 (wrong)."""
    i = question_number(request)
    answer = i + 100 if i % 2 == 0 else i + 99
    sure = "sure, " if i % 4 == 0 or i == 3 else ""
    return f"{sure}the answer is {answer}"


def large_reply(request: GenerationRequest) -> str:
    """Right on everything but question 5."""
    i = question_number(request)
    return f"the answer is {i + 100 if i != 5 else 0}"


@dataclass
class KeywordVerifier:
    name: str = "keyword"
    calls: int = 0

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        self.calls += 1
        return Score(0.9 if "sure" in candidate.text else 0.2, "keyword")


@dataclass
class LengthVerifier:
    name: str = "length"

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        return Score(min(1.0, len(candidate.text) / 40), "length")


@dataclass
class SpyVerifier:
    """Records everything it is given."""

    seen: list[tuple[GenerationRequest, Generation]] = field(default_factory=list)
    name: str = "spy"

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        self.seen.append((request, candidate))
        return Score(0.5, "spy")


@dataclass
class FlakyVerifier:
    """Unavailable (its scorer timed out) on odd questions while the class's `outage` lasts."""

    outage: ClassVar[bool] = True
    name: str = "flaky"

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        if FlakyVerifier.outage and question_number(request) % 2:
            return Score.unavailable("scorer timed out: TimeoutError")
        return Score(0.7, "flaky")


class Calls:
    """Counts verifier constructions and scores across a run."""

    def __init__(self) -> None:
        self.scores: dict[str, int] = {}
        self.spies: list[SpyVerifier] = []


def registry(calls: Calls | None = None) -> Registry:
    calls = calls or Calls()
    reg = Registry()

    def counted(name: str, make: Callable[[], Any]) -> Callable[[dict[str, Any], VerifierContext], Any]:
        def factory(params: dict[str, Any], ctx: VerifierContext) -> Any:
            inner = make()

            class Counting:
                def __init__(self) -> None:
                    self.name = inner.name

                async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
                    calls.scores[name] = calls.scores.get(name, 0) + 1
                    return await inner.score(request, candidate)

            return Counting()

        return factory

    def spy(params: dict[str, Any], ctx: VerifierContext) -> SpyVerifier:
        s = SpyVerifier()
        calls.spies.append(s)
        return s

    reg.register("keyword", counted("keyword", KeywordVerifier))
    reg.register("length", counted("length", LengthVerifier))
    reg.register("spy", spy)
    reg.register("flaky", lambda params, ctx: FlakyVerifier())
    return reg


def scripted(busy_small: float = 1.0, **kw: Any) -> dict[str, ScriptedBackend]:
    return {
        "small": ScriptedBackend("small", small_reply, busy_s=busy_small, **kw),
        "large": ScriptedBackend("large", large_reply, busy_s=2.0),
    }


N = 8


def plan_for(
    tmp_path: Path,
    *,
    limit: int | None = None,
    verifiers: tuple[str, ...] = ("length",),
    tiers: tuple[str, ...] = ("small", "large"),
    config: Path | None = None,
) -> EvalPlan:
    settings = load_settings(config or write_config(tmp_path))
    suite = get_suite(str(write_suite(tmp_path, N)))
    items = suite.select(suite.load(), limit, 0)
    return EvalPlan(
        suite=suite,
        items=items,
        settings=settings,
        tiers=list(tiers),
        verifiers=[VerifierSpec(name=v) for v in verifiers],
        limit=limit,
    )


async def run(plan: EvalPlan, root: Path, backends: dict[str, ScriptedBackend], calls: Calls | None = None):
    with RunStore(root) as store:
        return await run_eval(plan, store, registry=registry(calls), backends=backends)


async def make_run(tmp_path: Path, n: int = 40) -> Path:
    suite = get_suite(str(write_suite(tmp_path, n)))
    plan = EvalPlan(
        suite=suite,
        items=suite.select(suite.load(), None, 0),
        settings=load_settings(write_config(tmp_path)),
        tiers=["small", "large"],
        verifiers=[VerifierSpec(name="length")],
    )
    root = tmp_path / "runs" / "sums"
    with RunStore(root) as store:
        await run_eval(plan, store, registry=registry(), backends=scripted())
    return root


# ---- synthetic result tables (no run behind them), for calibration and report tests ----


def outcome(correct: bool, score: float, cost: float) -> TierOutcome:
    return TierOutcome(
        correct=correct,
        cost_usd=cost,
        latency_s=1.0,
        busy_s=1.0,
        prompt_tokens=1,
        completion_tokens=1,
        scores={"v": score, CONFIG: score},
        verify_cost_usd={},
        verify_s={},
    )


def synthetic(n: int = 200, seed: int = 1) -> ResultTable:
    """Small is right more often when its score is high; large is right 90% of the time."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        s = rng.random()
        items.append(
            ItemOutcome(f"item/{i}", "", (outcome(rng.random() < s, s, 0.001), outcome(rng.random() < 0.9, 1.0, 0.01)))
        )
    price = PriceSettings(usd_per_hour=1.0)
    tiers = [TierInfo("small", "m", price, "", 0.5, True), TierInfo("large", "M", price, "", 0.5, True)]
    return ResultTable(run="syn", suite="syn", source="", tiers=tiers, items=items, verifiers=[CONFIG, "v"])
