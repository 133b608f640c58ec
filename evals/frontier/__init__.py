"""What a cascade saves against a frontier model: the local small tier in front of upper tiers whose
per-item answers were published by others (RouteLLM's GPT-4-1106-preview and Mixtral-8x7B on GSM8K
and MMLU), imported as eval runs and reported by `tierroute eval frontier`.

`published` reads the committed subset of that data and holds the price sheet; `bfcl` and `ifeval`
import the Berkeley Function Calling Leaderboard's per-item correctness of GPT-4o and GPT-4-turbo,
and the IFEval authors' full GPT-4 responses (graded here), as runs of their suites; `tiers` writes it as
eval runs (GSM8K answers regraded by this project's grader); `cascade` joins them with the local
small tier's stored results and calibrates on one half, reports on the other; `page` writes the
report.
"""
