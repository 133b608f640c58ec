"""What a cascade saves against a frontier model: the local small tier in front of upper tiers whose
per-item answers were published by others (RouteLLM's GPT-4-1106-preview and Mixtral-8x7B on GSM8K
and MMLU), imported as eval runs and reported by `tierroute eval frontier`.

`published` reads the committed subset of that data and holds the price sheet; `tiers` writes it as
eval runs (GSM8K answers regraded by this project's grader); `cascade` joins them with the local
small tier's stored results and calibrates on one half, reports on the other; `page` writes the
report.
"""
