"""The default config's open-ended policy (scripts/open_ended_policy.py): its candidates combine the
two verifiers as the cascade does, the committed page regenerates from the committed IFEval run,
and `config.toml` holds the policy the page says split 0 deploys."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.calibrate import Target
from router.config import DEFAULT_CONFIG, load_settings
from scripts.open_ended_policy import (
    COMMAND,
    DEGEN,
    FLOOR,
    INSTR,
    MIN,
    as_config,
    combined,
    deployed,
    mean_label,
    page,
    tables_of,
)

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "eval" / "open-ended-policy.md"


def test_where_instructions_abstain_degeneration_decides_alone() -> None:
    for degen in (0.0, 0.04, 0.5, 1.0):
        scores = combined({INSTR: None, DEGEN: degen})
        assert set(scores.values()) == {degen}  # every candidate: the floor means what it meant before
        assert all((v is not None and v >= FLOOR) == (degen >= FLOOR) for v in scores.values())


def test_candidates_by_hand() -> None:
    s = combined({INSTR: 1 / 3, DEGEN: 1.0})
    assert s[MIN] == pytest.approx(1 / 3)  # fails at the floor: a constraint of three missed
    assert s[mean_label(3)] == pytest.approx((3 * (1 / 3) + 1.0) / 4)  # 0.5: passes, just
    assert s[mean_label(1)] == pytest.approx((1 / 3 + 1.0) / 2)
    s = combined({INSTR: 0.0, DEGEN: 1.0})  # a clean answer that meets none of its constraints
    assert s[mean_label(1)] == pytest.approx(0.5) and s[mean_label(2)] == pytest.approx(1 / 3)
    s = combined({INSTR: 2 / 3, DEGEN: 1.0})  # stat = "all": 0 unless every constraint is met
    assert s[mean_label(2, "all")] == pytest.approx(1 / 3) and s[mean_label(2)] == pytest.approx(7 / 9)
    assert combined({INSTR: 1.0, DEGEN: 0.04})[mean_label(2, "all")] == pytest.approx(2.04 / 3)
    assert as_config(mean_label(3)) == ("mean", FLOOR, ((INSTR, 3.0, ()), (DEGEN, 1.0, ())))
    assert as_config(mean_label(2, "all")) == ("mean", FLOOR, ((INSTR, 2.0, (("stat", "all"),)), (DEGEN, 1.0, ())))
    assert as_config(MIN) == ("min", FLOOR, ((INSTR, 1.0, ()), (DEGEN, 1.0, ())))


@pytest.mark.slow  # seconds of CPU: 200 splits
def test_the_page_regenerates_from_the_committed_run() -> None:
    run, top = ROOT / "evals" / "results" / "ifeval", ROOT / "evals" / "results" / "ifeval-published"
    text = page(tables_of(run, top), Target.parse("min-relative=0.95"))
    assert COMMAND in text
    assert text == PAGE.read_text(encoding="utf-8")


def test_config_holds_the_policy_the_page_deploys() -> None:
    combine, threshold, members = as_config(deployed(PAGE.read_text(encoding="utf-8")))
    policy = load_settings(DEFAULT_CONFIG).tiers[0].tasks["open_ended"]
    assert policy.threshold == threshold and (policy.combine or "mean") == combine
    assert policy.verifiers is not None
    assert tuple((v.name, v.weight, tuple(sorted(v.params.items()))) for v in policy.verifiers) == members
