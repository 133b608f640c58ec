"""Reports from stored runs: Markdown (with PNG figures beside it), one self-contained HTML file,
and CSV. Everything is computed from the run directories alone, so a report regenerates on any
machine, without models, in seconds.

Per suite: each tier's accuracy, tokens, latency and priced cost; every verifier's AUROC, ECE,
APGR, CPT and AIQ over the whole threshold sweep, beside the oracle and random baselines; and the
cascade at thresholds calibrated on one split, reported on the held-out split only.

The numbers are computed once (`suite.build`, one `SuiteReport` per run) and then drawn three
ways, each in its own module so a change to one output cannot move another's bytes by accident:
`tables` (the sections as header and rows, shared by the Markdown, the HTML and the CSV files),
`figures` (the PNGs, matplotlib imported only there) and `pages` (the prose, README.md and
report.html, and `write`, which puts every file of a report into one directory).
"""
