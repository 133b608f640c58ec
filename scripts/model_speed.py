"""Single-stream decode speed of each pulled catalog model on this machine.

    .venv/bin/python scripts/model_speed.py [--threads N] [--tokens N] [--model NAME] [--high-level]

Greedy plain completion of a fixed prompt through the engine (one sequence), after a short
warm-up; prints output tokens per second measured from the first to the last token. With
--high-level, the same completion through llama-cpp-python's own `Llama` object too (flash
attention off and on), to tell the engine's speed from the machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from router.backends.llama.backend import LlamaCppBackend
from router.config import LlamaCppSettings
from router.generation import Delta, GenerationRequest
from router.models.catalog import CATALOG, ModelStore

PROMPT = 'def is_prime(n: int) -> bool:\n    """Return True when n is a prime number."""\n'


async def measure(name: str, threads: int, tokens: int) -> tuple[float, float]:
    store = ModelStore()
    path = store.path_of(CATALOG[name])
    backend = LlamaCppBackend(
        name, path, LlamaCppSettings(model=name, n_ctx=2048, n_threads=threads, n_parallel=1), tokens
    )
    await backend.start()
    try:
        await backend.generate(GenerationRequest(prompt=PROMPT, max_tokens=8))
        first = last = 0.0
        n = 0
        t0 = time.perf_counter()
        async for item in backend.stream(GenerationRequest(prompt=PROMPT + "    # step by step\n", max_tokens=tokens)):
            if isinstance(item, Delta):
                last = time.perf_counter()
                first = first or last
            else:
                n = item.completion_tokens
        return (n - 1) / (last - first), first - t0
    finally:
        await backend.close()


def measure_high_level(name: str, threads: int, tokens: int, flash_attn: bool) -> float:
    from llama_cpp import Llama

    from router.backends.llama.native import physical_cores

    n = threads or physical_cores()
    llm = Llama(
        model_path=str(ModelStore().path_of(CATALOG[name])),
        n_ctx=2048,
        n_threads=n,
        n_threads_batch=n,
        flash_attn=flash_attn,
        verbose=False,
    )
    try:
        llm(PROMPT, max_tokens=8)
        stamps = [
            time.perf_counter()
            for _ in llm(PROMPT + "    # step by step\n", max_tokens=tokens, stream=True, temperature=0.0)
        ]
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])
    finally:
        llm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--model", action="append", help="only this catalog model (repeatable)")
    parser.add_argument("--high-level", action="store_true", help="also measure llama-cpp-python's Llama object")
    args = parser.parse_args()
    for name, entry in CATALOG.items():
        if args.model and name not in args.model:
            continue
        if not ModelStore().is_verified(entry):
            print(f"{name}: not pulled")
            continue
        tps, ttft = asyncio.run(measure(name, args.threads, args.tokens))
        print(f"{name}: {tps:.1f} output tok/s, first token after {ttft * 1000:.0f} ms")
        if args.high_level:
            for fa in (False, True):
                hl = measure_high_level(name, args.threads, args.tokens, fa)
                print(f"{name}: llama_cpp.Llama {hl:.1f} output tok/s (flash attention {'on' if fa else 'off'})")


if __name__ == "__main__":
    main()
