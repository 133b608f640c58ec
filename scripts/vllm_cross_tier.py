"""`cross_tier` scores of recorded answers, read by vLLM (`prompt_logprobs`) and by the in-process
llama.cpp engine, from the same pinned model: how close the two readings are.

Both sides read the same request (the eval's, `evals.runner.build_request`) and the same answer
(a recorded one from evals/results/<run>/generations.jsonl), with Qwen2.5-Coder-0.5B Q4_K_M: the
GGUF itself on llama.cpp's side, its float32 dequantisation served by vLLM (scripts/vllm/env.sh)
on the other. Per answer: every `cross_tier` statistic on each side, their differences, and the
per-token logprob differences where both sides split the answer into the same tokens.

    VLLM_KEY=... .venv/bin/python scripts/vllm_cross_tier.py --vllm-url http://127.0.0.1:8000/v1 \\
        --run evals/results/gsm8k --tier large --items 60 --out docs/bench/vllm-cross-tier.json

The vLLM server is started separately (`VLLM_PORT=8000 VLLM_API_KEY=... make vllm`; its dtype,
VLLM_DTYPE, is recorded here as given by --vllm-dtype).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from evals.runner import build_request
from evals.suites import get_suite
from router.backends.llama.backend import LlamaCppBackend
from router.backends.openai import OpenAIBackend
from router.config import LlamaCppSettings, OpenAIBackendSettings, TierSettings
from router.models.catalog import CATALOG, ModelStore
from verifiers.cross_tier import STATS, continuation_stats

MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"


def _records(run: Path, tier: str, limit: int) -> list[dict[str, Any]]:
    out = []
    with (run / "generations.jsonl").open() as f:
        for line in f:
            rec = json.loads(line)
            if rec["tier"] == tier and rec.get("error") is None and rec["text"].strip():
                out.append(rec)
            if len(out) == limit:
                break
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-url", required=True)
    parser.add_argument("--vllm-key-env", default="VLLM_KEY")
    parser.add_argument("--vllm-dtype", default="bfloat16", help="the dtype the server was started with")
    parser.add_argument("--run", type=Path, default=Path("evals/results/gsm8k"))
    parser.add_argument("--tier", default="large", help="whose recorded answers are read")
    parser.add_argument("--items", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    manifest = json.loads((args.run / "manifest.json").read_text())
    suite = get_suite(manifest["suite"]["name"])
    items = {item.id: item for item in suite.load()}
    records = _records(args.run, args.tier, args.items)
    tier_cfg = TierSettings.model_validate(
        {
            "name": "reader",
            "backend": "llamacpp",
            "max_tokens": 1,
            "llamacpp": {"model": MODEL},
            "price": {"usd_per_hour": 0.1, "stands_for": "reader"},
        }
    )
    path = ModelStore().pull(CATALOG[MODEL])
    local = LlamaCppBackend(
        "reader", path, LlamaCppSettings(model=MODEL, n_ctx=4096, n_threads=args.threads, n_parallel=1), 1
    )
    remote = OpenAIBackend(
        "reader",
        OpenAIBackendSettings(
            base_url=args.vllm_url,
            model=MODEL,
            api_key_env=args.vllm_key_env,
            prompt_logprobs="vllm",
            hosted_prompt_tokens=256,
            max_attempts=2,
        ),
        timeout_s=300,
    )
    await local.start()
    await remote.start()
    rows: list[dict[str, Any]] = []
    try:
        for rec in records:
            request = build_request(suite, items[rec["item"]], tier_cfg, timeout_s=600)
            t0 = time.monotonic()
            a = await local.score_continuation(request, rec["text"])
            t1 = time.monotonic()
            b = await remote.score_continuation(request, rec["text"])
            t2 = time.monotonic()
            sa, sb = continuation_stats(a.token_logprobs, a.top1), continuation_stats(b.token_logprobs, b.top1)
            row: dict[str, Any] = {
                "item": rec["item"],
                "tokens": [a.continuation_tokens, b.continuation_tokens],
                "llamacpp": {k: round(v, 6) for k, v in sa.items()},
                "vllm": {k: round(v, 6) for k, v in sb.items()},
                "seconds": [round(t1 - t0, 3), round(t2 - t1, 3)],
            }
            if a.continuation_tokens == b.continuation_tokens:
                diffs = [abs(x - y) for x, y in zip(a.token_logprobs, b.token_logprobs, strict=True)]
                row["token_logprob_abs_diff"] = {"max": round(max(diffs), 6), "mean": round(statistics.fmean(diffs), 6)}
                row["top1_disagree"] = sum(1 for x, y in zip(a.top1, b.top1, strict=True) if x != y)
            rows.append(row)
            print(
                f"{rec['item']}: mean {sa['mean']:.4f} vs {sb['mean']:.4f}, tokens {a.continuation_tokens}/"
                f"{b.continuation_tokens}",
                flush=True,
            )
    finally:
        await local.close()
        await remote.close()

    summary: dict[str, Any] = {}
    for stat in STATS:
        d = [abs(r["llamacpp"][stat] - r["vllm"][stat]) for r in rows]
        summary[stat] = {
            "median_abs_diff": round(statistics.median(d), 6),
            "p95_abs_diff": round(_pct(d, 0.95), 6),
            "max_abs_diff": round(max(d), 6),
        }
    same = [r for r in rows if "token_logprob_abs_diff" in r]
    mean_lp = [math.log(r["llamacpp"]["mean"]) - math.log(r["vllm"]["mean"]) for r in rows]
    out = {
        "command": "scripts/vllm_cross_tier.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out",)),
        "model": MODEL,
        "vllm_dtype": args.vllm_dtype,
        "answers": len(rows),
        "answers_from": f"{args.run} tier {args.tier}",
        "same_tokenisation": len(same),
        "mean_logprob_diff_llamacpp_minus_vllm": {
            "mean": round(statistics.fmean(mean_lp), 6),
            "max_abs": round(max(abs(x) for x in mean_lp), 6),
        },
        "per_token_abs_diff_max": round(max(r["token_logprob_abs_diff"]["max"] for r in same), 6) if same else None,
        "per_token_abs_diff_mean": round(statistics.fmean(r["token_logprob_abs_diff"]["mean"] for r in same), 6)
        if same
        else None,
        "top1_disagreements": sum(r["top1_disagree"] for r in same),
        "tokens_compared": sum(r["tokens"][0] for r in same),
        "stats": summary,
        "rows": rows,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
