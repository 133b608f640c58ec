#!/usr/bin/env bash
# The long eval runs of issue 39, one after another, each resumable: every finished item is stored
# (evals/store.py), so running this again computes only what is missing. Hours on 2 cores.
#   1. both local tiers on the new workload suites (small first: its results are needed first),
#   2. the large local tier reads Mixtral's published GSM8K answers (cross_tier, for the anchors'
#      Mixtral -> GPT-4 setup verified after generation: docs/eval/frontier),
#   3. the large local tier (Qwen2.5-Coder-1.5B) on all 1,319 GSM8K items, beside the small one.
# Run from the repository root: `nice -n 8 scripts/long_evals.sh` (nice: tests keep the cores;
# at 19 it starves under a test run).
# It was run this way on 2026-12-07 from a checkout of 65f8f26, writing into main's evals/ (RUNS).
set -u
T=${TIERROUTE:-.venv/bin/tierroute}
RUNS=${RUNS:-evals}  # where the runs are stored (default: this checkout's evals/)
V=(--verifier 'confidence:{"stat":"mean"}' --verifier 'confidence:{"stat":"min","name":"confidence_min"}'
   --verifier degeneration)
for tier in small large; do
  "$T" eval run --suite banking77:770 --tiers "$tier" --runs-dir "$RUNS"/results "${V[@]}"
  "$T" eval run --suite snips --tiers "$tier" --runs-dir "$RUNS"/results "${V[@]}"
  "$T" eval run --suite bfcl --tiers "$tier" --runs-dir "$RUNS"/results "${V[@]}"
  "$T" eval run --suite ifeval --tiers "$tier" --runs-dir "$RUNS"/results "${V[@]}" --verifier instructions
done
"$T" eval frontier-score --suite gsm8k --tier large --out "$RUNS"/results/routellm-gsm8k-cross-tier
"$T" eval run --suite gsm8k --tiers large --runs-dir "$RUNS"/results-gsm8k-full --run gsm8k-full \
    --verifier 'confidence:{"stat":"mean"}' \
    --verifier 'confidence:{"stat":"min","name":"confidence_min"}' \
    --verifier 'format:{"regex":"\\\\boxed\\{","name":"boxed"}' \
    --verifier math_answer --verifier degeneration --verifier execution
