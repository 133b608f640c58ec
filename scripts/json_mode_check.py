"""JSON mode through a running service: do all 50 varied prompts come back as JSON objects?

    .venv/bin/python scripts/json_mode_check.py [--url http://127.0.0.1:8000/v1] [--model auto]

Sends each line of tests/router/api/data/json_mode_prompts.txt with `response_format: json_object`
through the official `openai` client (4 at a time), parses every answer, and prints per prompt the
tier that answered, whether the small tier's answer passed the `format` check, and the answer when
it is not a JSON object; then the count. Exit status 0 only when every answer is a JSON object.

The test suite sends 20 of these prompts to SmolLM2 (tests/router/api/test_structured_api.py); this is
the acceptance check of issue 17 on `make serve`'s default tiers, where answering all 50 takes
minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

PROMPTS = Path(__file__).resolve().parent.parent / "tests" / "router" / "api" / "data" / "json_mode_prompts.txt"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="auto")
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.url, api_key="unused", max_retries=0, timeout=600)
    prompts = PROMPTS.read_text().splitlines()

    def ask(prompt: str) -> tuple[str, dict[str, Any]]:
        r = client.chat.completions.create(
            model=args.model,
            messages=[{"role": "user", "content": prompt}],
            response_format={"type": "json_object"},
            max_tokens=args.max_tokens,
        )
        return r.choices[0].message.content or "", (r.model_extra or {}).get("tierroute", {})

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, prompts))
    good = 0
    for prompt, (text, ext) in zip(prompts, answers, strict=True):
        try:
            ok = isinstance(json.loads(text), dict)
        except ValueError:
            ok = False
        good += ok
        first = (ext.get("attempts") or [{}])[0]
        line = f"{'ok ' if ok else 'BAD'} tier={ext.get('tier')} first format_ok={first.get('format_ok')}  {prompt}"
        print(line if ok else f"{line}\n    {text[:300]!r}")
    print(f"{good}/{len(prompts)} answers are JSON objects")
    return 0 if good == len(prompts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
