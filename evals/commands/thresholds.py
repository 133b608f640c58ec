"""`tierroute eval sweep` and `tierroute eval calibrate`: the cascade at every threshold of a
stored run, and the thresholds that meet a target.

Calibrate chooses them on a calibration split, reports them on the held-out items and can write
them into the config. Both read a stored run only; no model is loaded.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from evals.commands.common import ESTIMATORS_HELP, add_runs_dir, table_of
from router.errors import ConfigError


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from evals.formatting import num, pct, th, usd
    from evals.sweep import baselines, summarize

    table = table_of(args, args.run)
    console = Console(highlight=False)

    def curve_table(first: str, curve: list[Any]) -> Table:
        out = Table(first, "accuracy", "cost/1k", "escalation", "savings", "p50", "p95")
        for p in curve[:: max(1, len(curve) // args.rows)]:
            out.add_row(
                th(p.param),
                pct(p.accuracy),
                usd(p.cost_per_1k),
                pct(p.escalation_rate),
                pct(p.savings),
                num(p.latency_p50, 2),
                num(p.latency_p95, 2),
            )
        return out

    verifiers = [args.verifier] if args.verifier else table.verifiers
    for v in verifiers:
        s = summarize(table, v)
        console.print(
            f"[bold]{table.suite} / {v}[/]: AUROC {', '.join(num(a) for a in s.auroc)}; APGR {num(s.apgr)}; "
            f"CPT(50/80/95%) {', '.join(pct(s.cpt[x]) for x in (0.5, 0.8, 0.95))}; AIQ {num(s.aiq)}"
        )
        console.print(curve_table("threshold", s.curve))
    if args.estimators:
        from evals.learned_comparison import PREROUTER
        from evals.sweep import preroute_sweep

        console.print(
            f"[bold]{table.suite} / pre-route only[/]: "
            "skip a tier when the pre-router's P(right) is below the threshold"
        )
        console.print(curve_table("skip below", preroute_sweep(table, PREROUTER)))
    base = baselines(table)
    for p in base["tiers"] + base["oracle"]:
        console.print(f"{p.policy}: accuracy {pct(p.accuracy)}, {usd(p.cost_per_1k)} per 1k")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from evals.calibrate import Target, baseline_hint, calibrate, toml_snippet, write_thresholds
    from evals.formatting import pct, th, usd
    from evals.sweep import CONFIG
    from router.tasks import task_of_suite

    table = table_of(args, args.run)
    target = Target.parse(args.target)
    verifier = args.verifier or CONFIG
    cal = calibrate(table, verifier, target, seed=args.seed, fraction=args.fraction)
    ths = ", ".join(f"{n}={th(v)}" for n, v in cal.thresholds.items())
    print(
        f"{table.suite}: verifier '{verifier}', target {target}: thresholds {ths} "
        f"(chosen on {cal.n_calibration} calibration items"
        f"{'' if cal.met else '; target NOT reachable there, nearest shown'})"
    )
    imported = table.manifest.get("import")
    if imported:  # an imported run: what graded its items, and whose labels
        from evals.ledger_import import grading_said

        print(f"  graded: {grading_said(imported)}")
    for label, r in (("calibration", cal.calibration), ("held-out", cal.held_out)):
        print(
            f"  {label:12s} accuracy {pct(r.accuracy)}, {usd(r.cost_per_1k)} per 1k, escalation "
            f"{pct(r.escalation_rate)}, savings vs top {pct(r.savings)} (n={r.n})"
        )
    for t in cal.held_out_tiers:
        print(f"  held-out, always {t.policy}: accuracy {pct(t.accuracy)}, {usd(t.cost_per_1k)} per 1k")
    print(f"  target met on held-out items: {'yes' if cal.held_out_met else 'no'}")
    # the thresholds belong to the policy of the suite's task, unless the tier's own is asked for
    task = None if args.tier_threshold else task_of_suite(table.manifest.get("suite", {}).get("task", "text"))
    snippet = toml_snippet(cal, task)
    configured = _single_configured(table, verifier)
    if args.write:
        if not configured:
            raise ConfigError(
                f"--write sets the tiers' thresholds, which apply to their configured verifiers; '{verifier}' is not "
                "what every calibrated tier is configured with. Set the tiers' verifiers, or paste:\n" + snippet
            )
        from router.config import DEFAULT_CONFIG

        path = Path(args.config) if args.config else DEFAULT_CONFIG
        write_thresholds(path, cal.thresholds, task=task)
        where = "the tiers' own threshold" if task is None else f"the tiers' policy for task '{task}'"
        print(f"wrote thresholds into {path} ({where})")
        print(baseline_hint(cal, task), end="")
    else:
        print("\n# paste into config.toml (or rerun with --write):\n" + snippet)
    return 0


def _single_configured(table: Any, verifier: str) -> bool:
    """Whether a threshold on `verifier` means the same as the config's threshold on each tier."""
    from evals.sweep import CONFIG

    if verifier == CONFIG:
        return True
    for snap in table.manifest["tiers"][: max(1, len(table.tiers) - 1)]:
        members = snap["verifiers"]
        if len(members) != 1 or members[0]["label"] != verifier:
            return False
    return True


def register(esub: Any, add: Any) -> None:
    p = add("sweep", "print the cascade's accuracy and cost at every threshold, from stored results", cmd_sweep, esub)
    add_runs_dir(p)
    p.add_argument("run", help="run name or directory")
    p.add_argument("--verifier", default=None, help="one verifier label (default: all)")
    p.add_argument("--tiers", default=None, help="comma-separated subset of the run's tiers, cheapest first")
    p.add_argument("--rows", type=int, default=15, help="rows per table (default 15)")
    p.add_argument("--reprice", action="store_true", help="price with the config's price sheet, not the run's")
    p.add_argument("--estimators", default=None, metavar="DIR", help=ESTIMATORS_HELP)

    p = add(
        "calibrate",
        "choose thresholds on a calibration split for a target; report them on held-out items",
        cmd_calibrate,
        esub,
    )
    add_runs_dir(p)
    p.add_argument("--run", required=True, help="run name or directory")
    p.add_argument(
        "--target",
        required=True,
        metavar="KIND=VALUE",
        help="min-accuracy=0.6, min-pgr=0.8, max-cost=0.05 (USD per 1k requests) or max-escalation=0.3",
    )
    p.add_argument("--verifier", default=None, help="the verifier to threshold (default: 'config', the tiers' own)")
    p.add_argument("--seed", type=int, default=0, help="fixes the calibration split (default 0)")
    p.add_argument("--fraction", type=float, default=0.5, help="share of items used to calibrate (default 0.5)")
    p.add_argument("--tiers", default=None, help="comma-separated subset of the run's tiers, cheapest first")
    p.add_argument("--reprice", action="store_true", help="price with the config's price sheet, not the run's")
    p.add_argument(
        "--write",
        action="store_true",
        help="write the thresholds into the config file: each tier's policy for the suite's task "
        "(tiers[].tasks.<task>.threshold)",
    )
    p.add_argument(
        "--tier-threshold",
        action="store_true",
        help="with --write: set the tiers' own threshold (every task without a policy) instead",
    )
    p.add_argument("--estimators", default=None, metavar="DIR", help=ESTIMATORS_HELP)
