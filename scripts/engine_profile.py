"""Where a batched engine step goes: llama.cpp's own decode against everything else.

    .venv/bin/python scripts/engine_profile.py [--model NAME] [--tokens N] 1 8 16

Runs N concurrent greedy chat generations (one per concurrency level given) through the engine
in-process, no HTTP, and times every `llama_decode` call. Prints output tok/s, the share of wall
time spent inside llama_decode, and the remaining time per step (sampling, detokenising, the
hop to the event loop, scheduling).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import llama_cpp

from router.backends.llama.backend import LlamaCppBackend
from router.config import LlamaCppSettings
from router.generation import GenerationRequest, Message
from router.models.catalog import CATALOG, ModelStore

PROMPTS = [f"Write a Python function number {i} that computes something useful, with a docstring." for i in range(64)]
_spent = {"decode_s": 0.0, "steps": 0}
_decode = llama_cpp.llama_decode


def _timed_decode(ctx, batch):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    try:
        return _decode(ctx, batch)
    finally:
        _spent["decode_s"] += time.perf_counter() - t0
        _spent["steps"] += 1


async def level(name: str, concurrency: int, tokens: int, threads: int) -> str:
    settings = LlamaCppSettings(model=name, n_ctx=8192, n_threads=threads, n_parallel=max(concurrency, 1))
    backend = LlamaCppBackend(name, ModelStore().path_of(CATALOG[name]), settings, tokens)
    await backend.start()
    try:
        await backend.generate(GenerationRequest(prompt="hi", max_tokens=4))  # warm-up
        _spent.update(decode_s=0.0, steps=0)
        t0 = time.perf_counter()
        gens = await asyncio.gather(
            *(
                backend.generate(GenerationRequest(messages=(Message("user", p),), max_tokens=tokens))
                for p in PROMPTS[:concurrency]
            )
        )
        wall = time.perf_counter() - t0
    finally:
        await backend.close()
    out = sum(g.completion_tokens for g in gens)
    other_ms = (wall - _spent["decode_s"]) / max(_spent["steps"], 1) * 1000
    return (
        f"c={concurrency}: {out / wall:.1f} output tok/s, {100 * _spent['decode_s'] / wall:.0f}% of "
        f"{wall:.1f} s inside llama_decode over {_spent['steps']} steps, {other_ms:.1f} ms per step elsewhere"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("levels", nargs="+", type=int)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    llama_cpp.llama_decode = _timed_decode  # the engine looks it up on the module at each step
    for c in args.levels:
        print(asyncio.run(level(args.model, c, args.tokens, args.threads)), flush=True)


if __name__ == "__main__":
    main()
