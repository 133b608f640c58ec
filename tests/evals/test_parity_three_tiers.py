"""The live cascade and the offline sweep decide alike on a three-tier cascade, with a pre-router
in front of the lower tiers, task policies and a verifier that abstains: for every item, the same
answering tier, the same tiers run and the same cost, to the last digit.

The run is made by the real runner (scripted tiers, tests/support/evals.py): `small`, `large` and a
third `huge`; every answer is scored by `length` (a graded score), `odd_abstains` (abstains on odd
questions: an abstention accepts nothing) and `keyword` (read here as the pre-router's probability).
It is then replayed through the real `Cascade` (`evals.replay`) and routed by `evals.sweep`'s
policies, at a spread of thresholds and skip levels. Both sides walk the tiers by one step function
(`router.policy.decide`, `router.policy.skipped`); a rule changed on either side fails here."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from evals.replay import Replay, replay_request
from evals.runner import EvalPlan, run_eval
from evals.store import RunStore
from evals.suites import get_suite
from evals.sweep import CascadePolicy, PreRoutePolicy, ResultTable, load_table, route_cost
from router.config import VerifierSpec, load_settings
from router.generation import Generation, GenerationRequest
from router.tasks import TaskLabel
from router.verification import Score
from tests.support.config import tier
from tests.support.evals import (
    ScriptedBackend,
    question_number,
    registry,
    scripted,
    write_config,
    write_suite,
)

N = 24


class OddAbstains:
    """Abstains on odd questions ("does not apply"); else scores by length."""

    name = "odd_abstains"

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        if question_number(request) % 2:
            return Score.abstain("not for odd questions")
        return Score(min(1.0, len(candidate.text) / 30), "length")


def huge_reply(request: GenerationRequest) -> str:
    return f"the answer is certainly {question_number(request) + 100}"


@pytest.fixture(scope="module")
async def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("three")
    huge = tier(
        "huge",
        max_tokens=64,
        engine={"model": "unused", "n_parallel": 2},
        price={"usd_per_1m_input_tokens": 5000.0, "usd_per_1m_output_tokens": 9000.0, "stands_for": "test"},
    )
    settings = load_settings(write_config(tmp, huge))
    suite = get_suite(str(write_suite(tmp, N)))
    plan = EvalPlan(
        suite=suite,
        items=suite.select(suite.load(), None, 0),
        settings=settings,
        tiers=["small", "large", "huge"],
        verifiers=[VerifierSpec(name=v) for v in ("length", "odd_abstains", "keyword")],
    )
    backends = {**scripted(busy_small=0.37), "huge": ScriptedBackend("huge", huge_reply, busy_s=3.0)}
    reg = registry()
    reg.register("odd_abstains", lambda params, ctx: OddAbstains())
    root = tmp / "runs" / "three"
    with RunStore(root) as store:
        await run_eval(plan, store, registry=reg, backends=backends)  # type: ignore[arg-type]
    return root


LABELS = ("length", "odd_abstains")


def threshold_pairs(table: ResultTable, label: str) -> list[tuple[float, float]]:
    """Pairs of the scores the lower tiers were given (so some answers sit exactly at a threshold,
    where `>=` and `>` part), with accept-all and escalate-all beside them."""
    seen = sorted({s for it in table.items for t in (0, 1) if (s := it.tiers[t].scores[label]) is not None})
    picks = [seen[0], seen[len(seen) // 2], seen[-1]]
    return [(0.0, 1.0), (1.0, 0.0), *itertools.product(picks, picks)]


# the keyword verifier gives 0.9 or 0.2: (0.9, 0.2) and (0.2, 0.9) put items exactly at a skip
# threshold, where `<` and `<=` part
SKIPS = ((0.5, 0.5), (0.95, 0.1), (0.0, 0.0), (0.9, 0.2), (0.2, 0.9))


async def test_three_tiers_with_a_prerouter_task_policies_and_abstentions_decide_alike(run_root: Path) -> None:
    store = RunStore(run_root)
    table = load_table(store)
    names = [t.name for t in table.tiers]
    assert names == ["small", "large", "huge"]
    assert any(it.tiers[0].scores["odd_abstains"] is None for it in table.items)  # abstentions are in play
    replay = Replay(store)
    task = replay.task
    other = TaskLabel("code", "another task")
    checked = answered = 0
    seen_tiers: set[int] = set()
    cases = [
        (label, own, theirs)
        for label in LABELS
        for own in threshold_pairs(table, label)
        for theirs in threshold_pairs(table, label)[:3]
    ]
    for label, own, theirs in cases:
        for skip in (None, *SKIPS):
            cascade = replay.cascade(
                label,
                list(own),
                tasks={task.task: list(theirs)},
                prerouter=None if skip is None else "keyword",
                skip_below=() if skip is None else skip,
            )
            for asked, thresholds in ((task, theirs), (other, own)):  # the task's policy; the tier's own
                if skip is None:
                    simulated = CascadePolicy(label, thresholds)
                else:
                    simulated = PreRoutePolicy("keyword", skip, label, thresholds)
                for item in table.items:
                    live = await cascade.run(replay_request(item.id), task=asked)
                    route = simulated.route(item)
                    cost, _, _ = route_cost(item, route)
                    where = (label, own, theirs, skip, asked.task, item.id)
                    assert live.final.tier == names[route.answered], where
                    ran = [a.tier for a in live.attempts if a.generation is not None]
                    assert ran == [names[t] for t in route.ran], where
                    assert [a.tier for a in live.attempts if a.skipped] == [
                        names[t] for t in range(route.answered) if t not in route.ran
                    ], where
                    assert live.cost_usd == cost, (where, live.cost_usd, cost)  # to the last digit
                    seen_tiers.add(route.answered)
                    answered += route.answered != 0
                    checked += 1
    assert seen_tiers == {0, 1, 2} and answered > 0  # every tier answers somewhere: the test can fail
    assert checked == len(cases) * (1 + len(SKIPS)) * 2 * N
