"""The workloads page (evals.report.workloads): the perfect verifier's ceiling against a hand
computation, and the split figures at a target of the top tier's accuracy meeting it held out
where the verifier is informative."""

from __future__ import annotations

import math
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from evals.report.workloads import TARGETS, ceiling, curve_png, markdown, workload
from evals.sweep import CONFIG, ItemOutcome, ResultTable, TierInfo
from router.cli.main import main
from router.config import PriceSettings
from tests.support.evals import outcome, synthetic


def _table(rows: list[tuple[bool, float, bool, float]]) -> ResultTable:
    """(small right, small cost, large right, large cost) per item."""
    items = [
        ItemOutcome(f"i/{n}", "", (outcome(a, 0.5, ca), outcome(b, 1.0, cb))) for n, (a, ca, b, cb) in enumerate(rows)
    ]
    price = PriceSettings(usd_per_hour=1.0)
    tiers = [TierInfo("small", "m", price, "", 0.5, True), TierInfo("large", "M", price, "", 0.5, True)]
    return ResultTable(run="t", suite="t", source="", tiers=tiers, items=items, verifiers=[CONFIG, "v"])


def test_ceiling_by_hand() -> None:
    # 10 items: small right on 4; large right on 8, of them 5 where small is wrong (costs 3,1,4,1,5)
    rows = [(True, 1.0, True, 10.0)] * 3 + [(True, 1.0, False, 10.0)]
    rows += [(False, 1.0, True, 10.0 + c) for c in (3, 1, 4, 1, 5)] + [(False, 1.0, False, 10.0)]
    table = _table(rows)
    top = 3 * 10 + 10 + sum(10 + c for c in (3, 1, 4, 1, 5)) + 10  # 124
    # 95% of 8 right is 7.6: 4 + 4 escalations, the four cheapest (11, 11, 13, 14)
    assert ceiling(table, 0.95) == pytest.approx(1 - (10 + 11 + 11 + 13 + 14) / top)
    # 50% of 8 is 4: the small tier alone reaches it
    assert ceiling(table, 0.5) == pytest.approx(1 - 10 / top)
    # 100% of 8 = 8: needs 4 escalations too (4 + 4 = 8), 105% cannot be reached: all five
    assert ceiling(table, 1.0) == pytest.approx(1 - (10 + 11 + 11 + 13 + 14) / top)
    assert ceiling(table, 1.05) == pytest.approx(1 - (10 + 11 + 11 + 13 + 14 + 15) / top)


@pytest.mark.slow
def test_workload_meets_the_target_on_an_informative_verifier() -> None:
    table = synthetic(400, seed=2)
    free = replace(
        table,
        items=[replace(it, tiers=tuple(replace(t, cost_usd=0.0) for t in it.tiers)) for it in table.items],
    )
    w = workload(table, free, n_splits=200)
    assert [h.target for h in w.headline] == list(TARGETS)
    h95, h99 = w.headline
    assert h95.ratio.median >= 0.95 - 0.03  # held out, around the target
    assert h95.saved.median > h99.saved.median  # asking more costs more
    assert h95.saved.median <= h95.ceiling + 0.05
    assert all(not math.isnan(c.saved.median) for c in w.curve)
    page = markdown([("as run", [w])], "tierroute eval workloads syn", 200)
    assert "| syn | 400 |" in page and "min-relative" in page
    assert curve_png([("as run", [w])]).startswith(b"\x89PNG")


REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "eval" / "workloads.md"


def test_the_readme_quotes_the_workloads_page_row_for_row() -> None:
    page = PAGE.read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith("| ") and not line.startswith("| suite")]
    assert rows and all(row in readme for row in rows), "README's workload tables differ from docs/eval/workloads.md"
    command = page.split("```\n", 2)[1].strip()
    assert command in readme


@pytest.mark.slow  # seconds of CPU: 200 splits x 23 targets x 2 prices per suite
def test_the_committed_page_is_what_its_command_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = shlex.split(PAGE.read_text(encoding="utf-8").split("```\n", 2)[1].strip())
    assert args[:3] == ["tierroute", "eval", "workloads"]
    args = args[1:]
    args[args.index("--out") + 1] = str(tmp_path)
    monkeypatch.chdir(REPO)
    assert main(args) == 0
    for name in ("workloads.md", "workloads.csv"):
        made = (tmp_path / name).read_text(encoding="utf-8").replace(str(tmp_path), "docs/eval")
        assert made == (REPO / "docs" / "eval" / name).read_text(encoding="utf-8"), f"docs/eval/{name} is stale"


@pytest.mark.parametrize(
    ("runs", "top", "says"),
    [
        (["ifeval"], "ifeval", "expected RUN=TOP_RUN[:TIER]"),
        (["snips"], "ifeval=ifeval-published", "ifeval is not one of the runs listed"),
        (["ifeval"], "ifeval=snips:large", "runs of different suites (ifeval, snips)"),
        (["ifeval"], "ifeval=ifeval", "name one of its tiers (small, large) as ifeval:TIER"),
        (["ifeval"], "ifeval=ifeval-published:gpt-4o", "name one of its tiers (gpt-4)"),
    ],
)
def test_a_top_run_that_cannot_go_above_is_refused(
    runs: list[str], top: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(REPO)
    argv = ["eval", "workloads", *runs, "--top", top, "--runs-dir", "evals/results", "--out", str(tmp_path)]
    assert main(argv) != 0
    assert says in capsys.readouterr().err
    assert not (tmp_path / "workloads.md").exists()


def test_the_ifeval_row_is_the_small_tier_in_front_of_gpt4s_published_answers() -> None:
    """Recounted from the two runs: the small tier of `ifeval` (its large tier's run is still
    incomplete and is not read) in front of `ifeval-published`, all 541 items; the page's
    accuracies and the perfect verifier's ceiling at 95% are these."""
    from evals.frontier.cascade import join
    from evals.store import RunStore
    from evals.sweep import load_table

    results = REPO / "evals" / "results"
    small = load_table(RunStore(results / "ifeval"), tiers=["small"])
    gpt4 = load_table(RunStore(results / "ifeval-published"))
    table = join(small, gpt4, ["gpt-4"])
    assert len(table.items) == 541 and [t.name for t in table.tiers] == ["small", "gpt-4"]
    right = [sum(it.tiers[k].correct for it in table.items) for k in (0, 1)]
    assert right == [127, 421]
    assert "instructions" in table.verifiers  # the constraint verifier competes with the others
    row = next(line for line in PAGE.read_text(encoding="utf-8").splitlines() if line.startswith("| ifeval | 541 |"))
    assert "small 23.5%" in row and "gpt-4 77.8%" in row
    assert f"| {100 * ceiling(table, 0.95):.1f}% |" in row
