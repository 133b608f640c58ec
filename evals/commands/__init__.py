"""`tierroute eval run | import | regrade | sweep | calibrate | report | workloads | train | frontier`: registered
into the main CLI by `register`.

One module per command, each holding its handler and its own flags together: `run` (with the
mixed suite and the default verifier lists), `importing` (`eval import`), `regrade`, `thresholds`
(`eval sweep` and `eval calibrate`), `report`, `workloads`, `train` and `frontier`; `common` holds what they
share and `progress` the console's progress bars. Heavy imports stay inside the handlers, so
building the parser is instant.
"""

from __future__ import annotations

from typing import Any

from evals.commands import frontier, importing, regrade, report, run, thresholds, train, workloads


def register(sub: Any, add: Any) -> None:
    ev = sub.add_parser("eval", help="run eval suites, sweep policies, calibrate thresholds, write reports")
    esub = ev.add_subparsers(dest="eval_command", metavar="ACTION", required=True)
    for module in (run, importing, regrade, thresholds, report, workloads, train, frontier):
        module.register(esub, add)
