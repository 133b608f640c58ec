"""The service decides exactly as the simulator: the committed eval runs replayed through the real
`Cascade` (stored answers as its backends, stored scores as its verifiers) give, for every item,
the same answering tier, the same tiers run and the same cost as `evals.sweep` computes offline, at
several thresholds per suite, for single verifiers and for each tier's configured combination."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from evals.replay import Replay, replay_request
from evals.store import RunStore
from evals.sweep import CONFIG, CascadePolicy, load_table, route_cost
from router.tasks import TaskLabel

pytestmark = pytest.mark.slow  # loads a model, starts processes or spends seconds of CPU

RESULTS = Path(__file__).resolve().parents[2] / "evals" / "results"
RUNS = ["gsm8k", "humaneval", "mmlu"]


def _thresholds(values: list[float]) -> list[float]:
    """A spread of thresholds over the observed scores: accept all, escalate all, and between."""
    ordered = sorted(v for v in values if v is not None)
    picks = {0.0, 1.0}
    for q in (0.1, 0.3, 0.5, 0.7, 0.9):
        picks.add(ordered[int(q * (len(ordered) - 1))])
    return sorted(picks)


@pytest.mark.parametrize("run", RUNS)
async def test_replayed_cascade_decides_as_the_simulator(run: str) -> None:
    store = RunStore(RESULTS / run)
    table = load_table(store)
    replay = Replay(store)
    names = [t.name for t in table.tiers]
    labels = [CONFIG, *[v for v in table.verifiers if v != CONFIG][:3]]
    checked = 0
    for label in labels:
        for th in _thresholds([it.tiers[0].scores[label] for it in table.items]):
            cascade = replay.cascade(label, [th])
            policy = CascadePolicy(label, (th,))
            for item in table.items:
                live = await cascade.run(replay_request(item.id))
                route = policy.route(item)
                cost, _, correct = route_cost(item, route)
                where = f"{run} {item.id} {label}@{th}"
                assert live.final.tier == names[route.answered], where
                assert [a.tier for a in live.attempts if a.generation is not None] == [names[t] for t in route.ran], (
                    where
                )
                assert live.escalated == (route.answered != 0), where
                assert math.isclose(live.cost_usd, cost, rel_tol=1e-12, abs_tol=1e-15), (where, live.cost_usd, cost)
                checked += 1
    assert checked >= len(table.items) * len(labels) * 3


@pytest.mark.parametrize("run", RUNS)
async def test_the_replay_judges_each_item_by_its_suites_task_policy(run: str) -> None:
    """A tier's policy for the suite's task decides the items of that suite, as the simulator
    decides them at that policy's threshold; a request of another task gets the tier's own."""
    store = RunStore(RESULTS / run)
    table = load_table(store)
    replay = Replay(store)
    assert replay.task.task == {"gsm8k": "maths", "humaneval": "code", "mmlu": "choice"}[run]
    names = [t.name for t in table.tiers]
    scores = [it.tiers[0].scores[CONFIG] for it in table.items]
    spread = _thresholds(scores)
    own, theirs = spread[1], spread[-2]
    if own == theirs:  # few distinct scores (code_tests on HumanEval): accept-all against the rest
        own = spread[0]
    assert own != theirs
    cascade = replay.cascade(CONFIG, [own], tasks={replay.task.task: [theirs]})
    for task, threshold in ((replay.task, theirs), (TaskLabel("open_ended", "other"), own)):
        simulated = CascadePolicy(CONFIG, (threshold,))
        for item in table.items:
            live = await cascade.run(replay_request(item.id), task=task)
            route = simulated.route(item)
            assert live.final.tier == names[route.answered], (run, item.id, task)
            assert live.attempts[0].threshold == threshold and live.task == task
            assert math.isclose(live.cost_usd, route_cost(item, route)[0], rel_tol=1e-12, abs_tol=1e-15)
