"""An upstream that bills what a request's shape lets it bill, and a service in front of it, for
the budget tests: whatever shape a request has, the ledger's spend of a key must stay within its
budget.

`billing(mode)` answers every request (chat or completions, plain or streamed, any `n`) after a
short delay, so a burst is all in flight before any of it settles, with every choice run to
`max_tokens`, and reports usage as a server could:

- "realistic": a tokenizer of about four bytes a token reading every string it was sent (message
  contents, calls and their arguments, tools, the response_format schema, stop strings; keys
  included, JSON punctuation not), and a few template tokens per message;
- "greedy": a token per byte of those strings, a hosted API's own system prompt (4096 tokens), 64
  template tokens per message, and the few tokens (8) a server may count past max_tokens: the most
  the service accepts from an upstream before it refuses the usage as impossible.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any, Literal

import httpx

from tests.support.accounting import auth, keys_section, read_ledger
from tests.support.fault_upstream import Action, Received, chat_chunk, sse

Mode = Literal["realistic", "greedy"]
ANSWER = "SCORE: 7"  # an answer the judge verifier can read, and self-consistency samples agree on
PROMPT_FIELDS = ("messages", "prompt", "tools", "tool_choice", "response_format", "stop")


def _text_bytes(value: Any) -> int:
    """UTF-8 bytes of every string (keys too) and number in a JSON value."""
    if isinstance(value, dict):
        return sum(len(str(k).encode()) + _text_bytes(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_text_bytes(v) for v in value)
    if value is None:
        return 0
    return len(str(value).encode())


def billed_usage(body: dict[str, Any], mode: Mode) -> dict[str, int]:
    text = sum(_text_bytes(body[k]) for k in PROMPT_FIELDS if k in body)
    messages = len(body.get("messages") or [None])
    choices = int(body.get("n") or 1) * int(body["max_tokens"])
    if mode == "realistic":
        prompt, completion = math.ceil(text / 4) + 8 * messages + 16, choices
    else:
        prompt, completion = text + 64 * messages + 4096, choices + 8
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def billing(mode: Mode, delay_s: float = 0.3) -> Action:
    async def act(conn: Any, req: Received) -> bool:
        await asyncio.sleep(delay_s)
        usage = billed_usage(req.body, mode)
        n = int(req.body.get("n") or 1)
        if req.streaming:
            if req.is_chat:
                events: list[dict[str, Any]] = [chat_chunk(ANSWER), chat_chunk(finish="length")]
            else:
                events = [
                    {"id": "b", "object": "text_completion", "created": 0, "model": "fake", "choices": [choice]}
                    for choice in (
                        {"index": 0, "text": ANSWER, "finish_reason": None},
                        {"index": 0, "text": "", "finish_reason": "length"},
                    )
                ]
            events.append({"id": "b", "choices": [], "usage": usage})
            return await sse(*events)(conn, req)
        if req.is_chat:
            choices: list[dict[str, Any]] = [
                {"index": i, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "length"}
                for i in range(n)
            ]
        else:
            choices = [{"index": i, "text": ANSWER, "finish_reason": "length"} for i in range(n)]
        body = {"id": "b", "object": "chat.completion", "created": 0, "model": "fake", "choices": choices}
        await conn.reply(200, json.dumps({**body, "usage": usage}).encode())
        return True

    return act


PRICE = "[tiers.price]\nusd_per_1m_input_tokens = 0.60\nusd_per_1m_output_tokens = 2.40\n"


def remote_tier(name: str, base_url: str, *, max_tokens: int = 2048, extra: str = "") -> str:
    return f"""
[[tiers]]
name = "{name}"
backend = "openai"
max_tokens = {max_tokens}
timeout_s = 30
{extra}
[tiers.openai]
base_url = "{base_url}"
model = "fake-{name}"
max_attempts = 1
breaker_failures = 100000
{PRICE}"""


def budget_config(tmp: Path, keys: dict[str, dict[str, Any]], tiers: str) -> tuple[Path, dict[str, str]]:
    body, raw = keys_section(keys)
    path = tmp / "config.toml"
    path.write_text(f'[server]\n{body}\n[ledger]\npath = "{tmp / "ledger.sqlite3"}"\n{tiers}')
    return path, raw


async def burst(base: str, key: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """Every body at once, each by its endpoint (a `prompt` to /v1/completions); streamed bodies
    are read to their end."""
    limits = httpx.Limits(max_connections=len(bodies) + 1)
    async with httpx.AsyncClient(base_url=base, headers=auth(key), timeout=120, limits=limits) as client:

        async def one(body: dict[str, Any]) -> httpx.Response:
            path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
            async with client.stream("POST", path, json=body) as r:
                await r.aread()
                return r

        return list(await asyncio.gather(*(one(b) for b in bodies)))


def spent(ledger: Path, key: str) -> float:
    return math.fsum(e.cost_usd for e in read_ledger(ledger).values() if e.key_id == key)
