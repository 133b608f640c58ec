"""Why the small tier answers "A" to most MMLU questions: the prompt, or the model?

    .venv/bin/python scripts/mmlu_letter_bias.py [--run evals/results/mmlu] [--probe N]

Offline (no model): reads the committed run's top-5 alternatives at the answer position (the MMLU
suite asks every tier for them), and prints per tier how often each letter is picked and is right,
the probability each letter gets on average (the model's prior over letters), and the accuracy
after *contextual calibration* (Zhao et al., 2021: divide each item's letter probabilities by the
mean probabilities, estimated on the calibration half (`evals.calibrate.split`, seed 0), and pick
the largest) on the held-out half. If the bias were only a prior over letters, calibration would
recover the accuracy the model's content knowledge allows.

`--probe N` (needs the small model, about N x 2 prompt prefills) asks the question that settles it:
the same N items with the options rotated by one place (each option moves to the next letter, the
right letter with it). A model that reads the options follows the content to the new letter; a
model that answers "A" whatever the options says "A" again. It also tries the same items without
the suite's two worked examples (zero-shot), to see whether the examples cause the bias.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from collections import Counter
from pathlib import Path

from evals.calibrate import split
from evals.store import RunStore
from evals.suites import get_suite
from evals.sweep import load_table

LETTERS = "ABCD"


def letter_probs(top: list[list[object]] | None) -> list[float] | None:
    """The four letters' probabilities at the first token that is a letter, from its top-5."""
    for token in top or []:
        piece, _, alternatives = token  # [piece, logprob, [[piece, logprob], ...]]
        if str(piece).strip().strip("(").rstrip(").:") in LETTERS:
            probs = dict.fromkeys(LETTERS, 0.0)
            for alt, lp in alternatives:  # type: ignore[attr-defined]
                letter = str(alt).strip().strip("(").rstrip(").:")
                if letter in probs:
                    probs[letter] += math.exp(float(lp))
            return [probs[c] for c in LETTERS]
    return None


def offline(run_dir: Path) -> None:
    store = RunStore(run_dir)
    manifest = store.manifest()
    table = load_table(store)
    calibration, held = split(table, seed=0)
    cal_ids, held_ids = {i.id for i in calibration.items}, {i.id for i in held.items}
    items = {i.id: i for i in get_suite("mmlu").load()}
    by_tier: dict[str, list[tuple[str, str, list[float], bool]]] = {t["name"]: [] for t in manifest["tiers"]}
    for tier_name, entry, rec, grade in store.graded():
        probs = letter_probs(rec.top_logprobs)
        if probs is not None:
            by_tier[tier_name].append((entry["id"], items[entry["id"]].answer_key.reference, probs, grade.correct))
    for tier in manifest["tiers"]:
        rows = by_tier[tier["name"]]
        picks = Counter(LETTERS[max(range(4), key=lambda k: p[k])] for _, _, p, _ in rows)
        refs = Counter(ref for _, ref, _, _ in rows)
        prior = [sum(p[k] for _, _, p, _ in rows) / len(rows) for k in range(4)]
        cal_prior = [sum(p[k] for i, _, p, _ in rows if i in cal_ids) / max(1, len(cal_ids)) for k in range(4)]
        held_rows = [r for r in rows if r[0] in held_ids]
        raw = sum(LETTERS[max(range(4), key=lambda k: p[k])] == ref for _, ref, p, _ in held_rows)
        fixed = sum(
            LETTERS[max(range(4), key=lambda k: p[k] / max(cal_prior[k], 1e-9))] == ref for _, ref, p, _ in held_rows
        )
        print(f"tier {tier['name']}: {len(rows)} items with letter probabilities")
        print(f"  picked  {dict(sorted(picks.items()))}   right letters {dict(sorted(refs.items()))}")
        print("  mean probability per letter " + " ".join(f"{c}={v:.3f}" for c, v in zip(LETTERS, prior, strict=True)))
        print(
            f"  held-out ({len(held_rows)}): argmax accuracy {raw / max(1, len(held_rows)):.1%}, "
            f"after contextual calibration {fixed / max(1, len(held_rows)):.1%}"
        )


def probe(n: int) -> None:
    from router.backends.llama.backend import LlamaCppBackend
    from router.config import LlamaCppSettings
    from router.generation import GenerationRequest, Message
    from router.models.catalog import resolve_model

    suite = get_suite("mmlu")
    manifest = json.loads((Path("evals/results/mmlu") / "manifest.json").read_text())
    wanted = [e["id"] for e in manifest["items"][:n]]
    items = {i.id: i for i in suite.load()}
    name = "qwen2.5-coder-0.5b-instruct-q4_k_m"
    settings = LlamaCppSettings(model=name, n_threads=2, n_ctx=2048, n_parallel=4)
    backend = LlamaCppBackend("small", resolve_model(name, None), settings, 8)

    def rotated(text: str) -> str:
        head, opts = text.rsplit("\nA. ", 1)
        values = [line[3:] for line in ("A. " + opts).split("\n")]
        values = values[-1:] + values[:-1]  # option k moves to letter k+1: the right letter moves with it
        return head + "\n" + "\n".join(f"{c}. {v}" for c, v in zip(LETTERS, values, strict=True))

    async def ask(messages: tuple[Message, ...]) -> str:
        reply = await backend.generate(GenerationRequest(messages=messages, max_tokens=2, temperature=0.0))
        return reply.text.strip()[:1]

    async def main() -> None:
        await backend.start()
        try:
            results: dict[str, Counter[str]] = {"as run": Counter(), "rotated": Counter(), "zero-shot": Counter()}
            right: Counter[str] = Counter()
            for item_id in wanted:
                item = items[item_id]
                ref = item.answer_key.reference
                last = item.messages[-1]
                asked = {
                    "as run": (item.messages, ref),
                    "rotated": (
                        (*item.messages[:-1], Message(last.role, rotated(last.content))),
                        LETTERS[(LETTERS.index(ref) + 1) % 4],
                    ),
                    "zero-shot": ((last,), ref),
                }
                for variant, (messages, want) in asked.items():
                    got = await ask(messages)
                    results[variant][got] += 1
                    right[variant] += got == want
            for variant, picks in results.items():
                print(f"  {variant:9s}: accuracy {right[variant] / n:.1%}, picks {dict(sorted(picks.items()))}")
        finally:
            await backend.close()

    print(f"probe: the first {n} items of the run, small tier, greedy")
    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, default=Path("evals/results/mmlu"))
    parser.add_argument("--probe", type=int, default=0, help="also ask the small model N items, rotated and zero-shot")
    args = parser.parse_args()
    offline(args.run)
    if args.probe:
        probe(args.probe)


if __name__ == "__main__":
    main()
