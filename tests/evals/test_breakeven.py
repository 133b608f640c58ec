"""Break-even price ratios: the closed form agrees with repricing the run and searching, a cascade
that never pays says "never", a one-tier run has no ratio, and the committed runs' report has the
section for every suite."""

from __future__ import annotations

import csv
import math
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from evals.breakeven import LinearCost, analyse, break_even_scale, scale_price, scaled_top_prices
from evals.calibrate import Target, split
from evals.report.pages import markdown
from evals.report.suite import build
from evals.report.tables import summary_rows
from evals.store import RunStore
from evals.sweep import CascadePolicy, ResultTable, SingleTier, evaluate, load_table
from router.cli import main
from router.config import PriceSettings
from tests.support.evals import make_run

REPO = Path(__file__).resolve().parents[2]
TARGET = Target.parse("min-pgr=0.5")


def held_costs(
    store: RunStore, table: ResultTable, s: float, ths: tuple[float, ...], verifier: str
) -> tuple[float, float]:
    """(cascade, always-top) $/1k on the held-out items, from the run reloaded with the top tier's
    price multiplied by `s`: the brute force the closed form must agree with."""
    repriced = load_table(store, prices=scaled_top_prices(table, s))
    _, held = split(repriced, 0, 0.5)
    return (
        evaluate(CascadePolicy(verifier, ths), held).cost_per_1k,
        evaluate(SingleTier(held.top), held).cost_per_1k,
    )


def test_scale_price_scales_every_price() -> None:
    hourly = PriceSettings(usd_per_hour=3.6, stands_for="a VM")
    assert scale_price(hourly, 2.5).usd_per_hour == pytest.approx(9.0)
    assert scale_price(hourly, 2.5).stands_for == "a VM"
    tokens = scale_price(PriceSettings(usd_per_1m_input_tokens=1.0, usd_per_1m_output_tokens=4.0), 0.0)
    assert (tokens.usd_per_1m_input_tokens, tokens.usd_per_1m_output_tokens, tokens.usd_per_hour) == (0.0, 0.0, None)


def test_break_even_scale_cases() -> None:
    # 2 + 1s < 0 + 3s for s > 1
    assert break_even_scale(LinearCost(2.0, 1.0), LinearCost(0.0, 3.0)) == pytest.approx(1.0)
    # cheaper at every price
    assert break_even_scale(LinearCost(0.0, 1.0), LinearCost(0.5, 3.0)) == 0.0
    # pays the top tier as much as always-top does, plus its own: never
    assert break_even_scale(LinearCost(2.0, 3.0), LinearCost(0.0, 3.0)) is None
    assert break_even_scale(LinearCost(2.0, 4.0), LinearCost(0.0, 3.0)) is None


@pytest.mark.slow
async def test_closed_form_matches_repricing_and_search(tmp_path: Path) -> None:
    store = RunStore(await make_run(tmp_path))
    table = load_table(store)
    report = build(table, TARGET, top_free=load_table(store, prices=scaled_top_prices(table, 0.0)))
    b = report.breakeven
    assert b is not None and b.base_ratio is not None and b.rows
    first = evaluate(SingleTier(0), table).cost_per_1k
    top = evaluate(SingleTier(table.top), table).cost_per_1k
    assert b.base_ratio == pytest.approx(top / first)
    finite = [e for e in b.rows if e.ratio is not None]
    assert finite, [(e.verifier, e.never_because) for e in b.rows]
    for e, cal in zip(b.rows, report.calibrations, strict=True):
        ths = tuple(cal.thresholds.values())
        # at the recorded prices the decomposition gives back the calibration table's figures
        assert e.cascade.at(1.0) == pytest.approx(cal.held_out.cost_per_1k, rel=1e-9)
        assert e.savings_at(b.base_ratio) == pytest.approx(cal.held_out.savings, rel=1e-9, abs=1e-12)
        # costs are linear in the top tier's price: reprice the run and compare
        for s in (0.3, 2.0, 17.0):
            cascade, always_top = held_costs(store, table, s, ths, e.verifier)
            assert cascade == pytest.approx(e.cascade.at(s), rel=1e-9)
            assert always_top == pytest.approx(e.top.at(s), rel=1e-9)
    e = finite[0]
    ths = tuple(e.thresholds.values())
    star = e.cost_scale
    assert star is not None and e.ratio == pytest.approx(star * b.base_ratio)

    def cheaper(s: float) -> bool:
        cascade, always_top = held_costs(store, table, s, ths, e.verifier)
        return cascade < always_top

    # search: the smallest multiplier where the repriced cascade is cheaper, by bisection
    lo, hi = 0.0, 1.0
    while not cheaper(hi):
        lo, hi = hi, hi * 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if cheaper(mid) else (mid, hi)
    assert hi == pytest.approx(star, rel=1e-6, abs=1e-9)
    # and a grid either side agrees with the sign of the closed form
    for s in (star * 0.5, star * 0.9, star * 1.1, star * 3 + 0.1):
        assert cheaper(s) == (s > star)


async def test_cascades_that_never_break_even(tmp_path: Path) -> None:
    store = RunStore(await make_run(tmp_path))
    table = load_table(store)
    top_free = load_table(store, prices=scaled_top_prices(table, 0.0))
    report = build(table, TARGET, top_free=top_free)
    cal = report.calibrations[0]
    # escalating everything pays the top tier on every item, plus the first tier: never cheaper
    everything = replace(cal, thresholds={n: math.inf for n in cal.thresholds})
    # escalating nothing is cheap at any ratio, but it answers with the first tier only
    _, held = split(table, 0, 0.5)
    nothing = replace(
        cal,
        thresholds={n: 0.0 for n in cal.thresholds},
        held_out=evaluate(CascadePolicy(cal.verifier, (0.0,)), held),
    )
    assert nothing.held_out.accuracy < cal.held_out_tiers[-1].accuracy
    b = analyse(table, top_free, [everything, nothing])
    by_cost, by_accuracy = b.rows
    assert by_cost.ratio is None and by_cost.never_because == "cost"
    assert by_cost.savings_at(10) is not None and by_cost.savings_at(1000) < 0  # type: ignore[operator]
    assert by_accuracy.ratio is None and by_accuracy.never_because == "accuracy"
    assert by_accuracy.savings_at(100) > 0.9  # type: ignore[operator]
    report.breakeven = b
    md = markdown([report], images=False)
    assert "never (cost)" in md and "never (accuracy)" in md
    rows = {row["verifier"]: row for row in summary_rows([report])}
    assert rows[cal.verifier]["breakeven_ratio"] == "never"


@pytest.mark.slow
async def test_one_tier_has_no_ratio(tmp_path: Path) -> None:
    root = await make_run(tmp_path)
    report = build(load_table(RunStore(root), tiers=["small"]), TARGET)
    assert report.breakeven is not None and report.breakeven.base_ratio is None
    assert "one tier" in report.breakeven.why_none
    md = markdown([report], images=False)
    assert "No break-even ratio: one tier" in md
    # the CLI reports a one-tier run without asking for the top tier's repricing
    out = tmp_path / "one"
    assert main(["eval", "report", str(root), "--tiers", "small", "--out", str(out)]) == 0
    assert "No break-even ratio" in (out / "README.md").read_text()
    assert not (out / "sums-breakeven.png").exists()


@pytest.mark.slow
def test_committed_runs_report_the_break_even(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command at the top of docs/eval/README.md, into a scratch directory: it gives the
    committed report, figure for figure, and each suite's break-even section."""
    committed = REPO / "docs/eval"
    text = (committed / "README.md").read_text(encoding="utf-8")
    command = text.split("```\n", 2)[1].strip().splitlines()[0]
    args = shlex.split(command)
    assert args[:3] == ["tierroute", "eval", "report"]
    args = args[1:]
    assert args[args.index("--out") + 1] == "docs/eval"
    args[args.index("--out") + 1] = str(tmp_path / "out")
    monkeypatch.chdir(REPO)  # the command's other paths are the repository's, as written
    assert main(args) == 0
    # the pages name the directory they were written to; the rest is the committed text exactly
    for name in ("README.md", "report.html", "summary.csv", "sweep.csv", "splits.csv"):
        made = (tmp_path / "out" / name).read_text(encoding="utf-8").replace(str(tmp_path / "out"), "docs/eval")
        assert made == (committed / name).read_text(encoding="utf-8"), f"docs/eval/{name} is not what its command gives"
    md = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert "**Break-even price ratio.**" in md
    suites = args[2 : args.index("--runs-dir")]
    assert suites == ["gsm8k", "humaneval", "mmlu", "structured"]
    for suite in suites:
        section = md.split(f"\n## {suite}\n", 1)[1].split("\n## ", 1)[0]
        assert "### When does a cascade pay? Break-even price ratio" in section
        assert "| config" in section.split("Break-even price ratio", 1)[1]
        assert "savings at r = 10" in section and "savings at r = 100" in section
        assert (tmp_path / "out" / f"{suite}-breakeven.png").stat().st_size > 1000
        assert (tmp_path / "out" / f"{suite}-price.png").stat().st_size > 1000
        assert "### Over 200 random splits: `min-pgr=0.8`" in section
        assert "### Price sensitivity: the local machine's price per busy hour" in section
    with open(tmp_path / "out" / "summary.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert {"breakeven_ratio", "savings_r10", "savings_r100"} <= set(rows[0])
    assert all(r["breakeven_ratio"] == "never" or float(r["breakeven_ratio"]) >= 0 for r in rows)
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert page.count("Break-even price ratio</h3>") == len(suites)


@pytest.mark.slow
async def test_two_tier_calibration_does_not_move_with_the_price(tmp_path: Path) -> None:
    """Why fixing the thresholds at the recorded prices is exact for two tiers and an accuracy target."""
    store = RunStore(await make_run(tmp_path))
    table = load_table(store)
    recorded = {c.verifier: c.thresholds for c in build(table, TARGET).calibrations}
    for s in (0.05, 40.0):
        repriced = build(load_table(store, prices=scaled_top_prices(table, s)), TARGET)
        assert {c.verifier: c.thresholds for c in repriced.calibrations} == recorded
