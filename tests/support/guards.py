"""What the guard tests share: planted personal data and secrets (seeded, checksums right), a
served config whose top tier is a recording upstream, and requests on every API surface that carry
the planted items in each place of a request.

The served cascade: `small` is the real SmolLM2 (local), with a `format` verifier that no answer
passes, so every 'auto' request would escalate; `large` is an `openai` tier on a `FaultUpstream`
(remote), which records every body it receives; `small` shadows to `large` at rate 1. Guards are
scoped per key, so one process serves each policy: `keep` (keep_local), `redact` (redact, restore),
`log` (log_only), `block` (block), `out` (the answer checked and redacted).
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.accounting import keys_section
from tests.support.config import TOKEN_PRICE, Toml, tier, toml_value, write_config
from tests.support.model import SMOL

POLICIES = ("keep", "redact", "log", "block", "out")


def luhn_digit(partial: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(partial)):
        d = int(ch)
        if i % 2 == 0:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return str((10 - total % 10) % 10)


class Planter:
    """Seeded generators of planted items, each unique within a run (so a leak names its item)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.made: set[str] = set()

    def _unique(self, make: Any) -> str:
        while True:
            value = str(make())
            if value not in self.made:
                self.made.add(value)
                return value

    def email(self) -> str:
        def make() -> str:
            user = "".join(self.rng.choices(string.ascii_lowercase, k=7))
            host = self.rng.choice(["example.com", "mail.example.org", "corp.example.net", "uni.example.edu"])
            return f"{user}.{self.rng.randrange(10, 99)}@{host}"

        return self._unique(make)

    def phone(self) -> str:
        def make() -> str:
            style = self.rng.randrange(3)
            area, mid, last = self.rng.randrange(201, 989), self.rng.randrange(200, 999), self.rng.randrange(1000, 9999)
            if style == 0:
                return f"+1 ({area}) {mid}-{last}"
            if style == 1:
                return f"{area}-{mid}-{last}"
            return f"+44 20 7946 {self.rng.randrange(1000, 9999)}"

        return self._unique(make)

    def card(self) -> str:
        def make() -> str:
            prefix = self.rng.choice(["4", "51", "55", "37", "6011"])
            length = 15 if prefix == "37" else 16
            body = prefix + "".join(self.rng.choices(string.digits, k=length - len(prefix) - 1))
            digits = body + luhn_digit(body)
            if self.rng.random() < 0.5:
                return " ".join(digits[i : i + 4] for i in range(0, len(digits), 4))
            return digits

        return self._unique(make)

    def key(self) -> str:
        def make() -> str:
            kind = self.rng.randrange(4)
            alnum = string.ascii_letters + string.digits
            if kind == 0:
                return "sk-proj-" + "".join(self.rng.choices(alnum, k=40))
            if kind == 1:
                return "AKIA" + "".join(self.rng.choices(string.ascii_uppercase + string.digits, k=16))
            if kind == 2:
                return "ghp_" + "".join(self.rng.choices(alnum, k=36))
            return "sk-ant-api03-" + "".join(self.rng.choices(alnum + "-_", k=48))

        return self._unique(make)

    def any(self) -> tuple[str, str]:
        kind = self.rng.choice(["email", "phone", "card", "key"])
        return kind, getattr(self, kind)()


@dataclass
class Planted:
    """One request to send: its surface path, body, and the items it carries (in `place`)."""

    path: str
    body: dict[str, Any]
    slots: list[str]
    place: str

    @property
    def items(self) -> list[str]:
        return [item for slot in self.slots for item in slot.split(", ")]


WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def requests_for(planter: Planter, model: str = "auto") -> list[Planted]:
    """One request per (surface, place, streamed or not) with planted items in that place."""
    out: list[Planted] = []
    for stream in (False, True):
        out.extend(_chat(planter, model, stream))
        out.extend(_completions(planter, model, stream))
        out.extend(_responses(planter, model, stream))
        out.extend(_messages(planter, model, stream))
    return out


def _two(planter: Planter) -> list[str]:
    """Two slots of a request's text, each holding six planted items."""
    return [", ".join(planter.any()[1] for _ in range(6)) for _ in range(2)]


def _chat(p: Planter, model: str, stream: bool) -> list[Planted]:
    base = {"model": model, "max_tokens": 4, "stream": stream, "temperature": 0}
    made = []
    a = _two(p)
    made.append(
        Planted(
            "/v1/chat/completions",
            {**base, "messages": [{"role": "user", "content": f"My details are {a[0]} and {a[1]}. Say ok."}]},
            a,
            "plain",
        )
    )
    a = _two(p)
    made.append(
        Planted(
            "/v1/chat/completions",
            {
                **base,
                "messages": [
                    {"role": "system", "content": f"The account holder's contact is {a[0]}; backup {a[1]}."},
                    {"role": "user", "content": "Say ok."},
                ],
            },
            a,
            "system",
        )
    )
    a = _two(p)
    made.append(
        Planted(
            "/v1/chat/completions",
            {
                **base,
                "messages": [
                    {"role": "user", "content": f"Remember {a[0]}."},
                    {"role": "assistant", "content": f"Noted: {a[1]}."},
                    {"role": "user", "content": "Say ok."},
                ],
            },
            a,
            "earlier turns",
        )
    )
    a = _two(p)
    made.append(
        Planted(
            "/v1/chat/completions",
            {
                **base,
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "lookup",
                            "description": "Look a customer up",
                            "parameters": WEATHER_PARAMS,
                        },
                    }
                ],
                "messages": [
                    {"role": "user", "content": "Look the customer up."},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "lookup", "arguments": json.dumps({"city": a[0]})},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": f"found: {a[1]}"},
                    {"role": "user", "content": "Say ok."},
                ],
            },
            a,
            "tool-call arguments",
        )
    )
    return made


def _completions(p: Planter, model: str, stream: bool) -> list[Planted]:
    a = _two(p)
    body = {
        "model": model,
        "max_tokens": 4,
        "stream": stream,
        "temperature": 0,
        "prompt": f"Customer record: {a[0]}, {a[1]}.\nSummary:",
    }
    return [Planted("/v1/completions", body, a, "plain")]


def _responses(p: Planter, model: str, stream: bool) -> list[Planted]:
    base = {"model": model, "max_output_tokens": 16, "stream": stream, "temperature": 0}
    a, b = _two(p), _two(p)
    return [
        Planted(
            "/v1/responses",
            {**base, "instructions": f"The customer is {a[0]}.", "input": f"Also {a[1]}. Say ok."},
            a,
            "system",
        ),
        Planted(
            "/v1/responses",
            {
                **base,
                "tools": [
                    {
                        "type": "function",
                        "name": "lookup",
                        "description": "Look a customer up",
                        "parameters": WEATHER_PARAMS,
                    }
                ],
                "input": [
                    {"role": "user", "content": "Look the customer up."},
                    {
                        "type": "function_call",
                        "call_id": "c1",
                        "name": "lookup",
                        "arguments": json.dumps({"city": b[0]}),
                    },
                    {"type": "function_call_output", "call_id": "c1", "output": f"found: {b[1]}"},
                    {"role": "user", "content": "Say ok."},
                ],
            },
            b,
            "tool-call arguments",
        ),
    ]


def _messages(p: Planter, model: str, stream: bool) -> list[Planted]:
    base = {"model": model, "max_tokens": 4, "stream": stream, "temperature": 0}
    a, b = _two(p), _two(p)
    return [
        Planted(
            "/v1/messages",
            {
                **base,
                "system": f"Account contact: {a[0]}.",
                "messages": [{"role": "user", "content": f"And {a[1]}. Say ok."}],
            },
            a,
            "system",
        ),
        Planted(
            "/v1/messages",
            {
                **base,
                "tools": [{"name": "lookup", "description": "Look a customer up", "input_schema": WEATHER_PARAMS}],
                "messages": [
                    {"role": "user", "content": "Look the customer up."},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {"city": b[0]}}],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t1", "content": f"found: {b[1]}"},
                            {"type": "text", "text": "Say ok."},
                        ],
                    },
                ],
            },
            b,
            "tool-call arguments",
        ),
    ]


def guard_stages() -> str:
    """Two guards per policy key (personal data and secrets), each scoped to its key."""
    text = ""
    policies = {
        "keep": {"action": "keep_local"},
        "redact": {"action": "redact", "restore": True},
        "log": {"action": "log_only"},
        "block": {"action": "block"},
        "out": {"action": "log_only", "output": "redact"},
    }
    for key, params in policies.items():
        for stage in ("pii", "secrets"):
            values: dict[str, object] = {**params, "keys": [key], "label": f"{stage}_{key}"}
            text += f'\n[[stages]]\nname = "{stage}"\nparams = {toml_value(values)}\n'
    return text


def served_config(
    tmp: Path, upstream_url: str, *, stages: str | None = None, cache: bool = False
) -> tuple[Path, dict[str, str]]:
    """The served cascade of the module docstring, with a key per policy (and `admin`); `cache`
    turns the response cache on (its rows live in the ledger's database)."""
    keys, raw = keys_section({name: {} for name in POLICIES} | {"admin": {"roles": ["client", "admin", "metrics"]}})
    body = f'[server]\n{keys}\n[ledger]\npath = "{tmp / "ledger.sqlite3"}"\n'
    if cache:
        body += "[cache]\nenabled = true\n"
    engine = {"model": SMOL, "n_ctx": 2048, "n_threads": 1, "n_parallel": 4}
    never = '\n[[tiers.verifiers]]\nname = "format"\nparams = { regex = "^NEVER MATCHES$" }\n'
    body += tier(
        "small",
        threshold=0.5,
        max_tokens=16,
        timeout_s=120,
        engine=engine,
        price={"usd_per_hour": Toml("0.10"), "stands_for": "test small tier"},
        tables={"shadow": {"rate": Toml("1.0"), "target": "large", "usd_per_day": Toml("10.0")}},
        extra=never,
    )
    remote = {"base_url": upstream_url, "model": "smol", "max_attempts": 1, "hosted_prompt_tokens": 0}
    body += tier("large", backend="openai", max_tokens=16, timeout_s=30, engine=remote, price=TOKEN_PRICE)
    body += guard_stages() if stages is None else stages
    return write_config(tmp / "config.toml", body), raw


def received_text(upstream: Any) -> str:
    """Everything the recording upstream was sent, as one text."""
    return "\n".join(json.dumps(r.body, ensure_ascii=False) for r in upstream.requests)
