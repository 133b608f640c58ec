"""Tool round trips through a running service: does the model use a function's result?

    .venv/bin/python scripts/tool_round_trip.py [--url http://127.0.0.1:8000/v1]

With the official `openai` client, for 6 questions that need one of 3 functions: the first turn
(`tools`, `tool_choice` auto), then the client's `tool` message with a fixed result and the second
turn, non-streamed and streamed. Prints per question the tier, the calls, the answers and each
attempt's verdict; then counts of second turns: `answered` (words), `recalled` (calls again),
`echoed` (text that is JSON: a call and a result written out, not an answer). The acceptance check
of issue 17's tool round trip on `make serve`'s default tiers (minutes on two cores).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from typing import Any

import openai


def _schema(**properties: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": list(properties),
    }


TOOLS: list[Any] = [
    {"type": "function", "function": {"name": n, "description": d, "parameters": p}}
    for n, d, p in (
        ("get_weather", "The current weather in a city", _schema(city="string")),
        ("get_time", "The current local time in a city", _schema(city="string")),
        ("convert_currency", "Convert an amount between currencies", _schema(amount="number", to="string")),
    )
]
RESULTS = {
    "get_weather": '{"temperature_c": 21, "sky": "sunny"}',
    "get_time": '{"time": "14:05"}',
    "convert_currency": '{"result": 92.4}',
}
PROMPTS = [
    "What is the weather in Paris right now?",
    "What time is it in Tokyo?",
    "Convert 100 US dollars to euros.",
    "Is it raining in London?",
    "What's the local time in New York?",
    "How much is 50 euros in Japanese yen?",
]


def _kind(calls: int, text: str) -> str:
    if calls:
        return "recalled"
    return "echoed" if text.lstrip().startswith(("{", "```")) else "answered"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.url, api_key="unused", max_retries=0, timeout=900)
    counts: Counter[str] = Counter()
    for prompt in PROMPTS:
        messages: list[Any] = [{"role": "user", "content": prompt}]
        first = client.chat.completions.create(model="auto", messages=messages, tools=TOOLS, max_tokens=args.max_tokens)
        m = first.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
        print(f"## {prompt}\n turn 1: tier={first.model_extra['tierroute']['tier']} calls={calls}")  # type: ignore[index]
        if not m.tool_calls:
            counts["no first call"] += 1
            continue
        messages.append(
            {"role": "assistant", "content": m.content, "tool_calls": [c.model_dump() for c in m.tool_calls]}
        )
        for c in m.tool_calls:
            messages.append({"role": "tool", "tool_call_id": c.id, "content": RESULTS[c.function.name]})
        started = time.monotonic()
        second = client.chat.completions.create(
            model="auto", messages=messages, tools=TOOLS, max_tokens=args.max_tokens
        )
        m2 = second.choices[0].message
        ext = second.model_extra["tierroute"]  # type: ignore[index]
        kind = _kind(len(m2.tool_calls or []), m2.content or "")
        counts[kind] += 1
        verdicts = [(a["tier"], a["accepted"], a["reason"][:90]) for a in ext["attempts"]]
        print(f" turn 2: {kind} tier={ext['tier']} {m2.content!r:.160} ({time.monotonic() - started:.0f} s)")
        print(f"   attempts: {verdicts}")
        text, streamed_calls = "", 0
        for chunk in client.chat.completions.create(
            model="auto", messages=messages, tools=TOOLS, max_tokens=args.max_tokens, stream=True
        ):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                streamed_calls += len(chunk.choices[0].delta.tool_calls or [])
        kind = _kind(streamed_calls, text)
        counts[f"streamed {kind}"] += 1
        print(f" turn 2 streamed: {kind} {text!r:.160}")
    print(json.dumps(dict(sorted(counts.items()))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
