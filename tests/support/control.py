"""Shared by the control-plane tests: a config of two scripted tiers (`small`, `large`) with an
admin key, and the admin API's calls as plain functions.

The tiers are OpenAI-compatible upstreams scripted on loopback (tests/support/fault_upstream.py),
so these tests measure keys, limits and the admin API, not a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from router.admission.auth import hash_key, new_key
from tests.support.config import write_config

TIER = """
[[tiers]]
name = "{name}"
backend = "openai"
max_tokens = 8
timeout_s = 5
[tiers.openai]
base_url = "{base_url}"
model = "scripted"
max_attempts = 1
hosted_prompt_tokens = 0  # the scripted server adds no system prompt: reservations near the real cost
[tiers.price]
usd_per_1m_input_tokens = {price_in}
usd_per_1m_output_tokens = {price_out}
"""


def control_config(
    tmp: Path,
    upstream: str,
    *,
    ledger: str,
    keys: dict[str, dict[str, Any]] | None = None,
    poll_s: float = 0.5,
    name: str = "config.toml",
) -> tuple[Path, dict[str, str]]:
    """A config with an admin key ('root', roles admin only), `keys` (name -> entry fields), the
    ledger at `ledger` (a SQLite path or a postgresql:// URL) and tiers small and large; returns
    it and the raw keys by name."""
    raw: dict[str, str] = {}
    lines = ["[server]", f"keys_poll_s = {poll_s}"]
    for key_name, fields in {"root": {"roles": ["admin"]}, **(keys or {})}.items():
        raw[key_name] = new_key()
        lines += ["[[server.api_keys]]", f'name = "{key_name}"', f'hash = "{hash_key(raw[key_name])}"']
        lines += [f"{k} = {_toml(v)}" for k, v in fields.items()]
    where = f'url = "{ledger}"' if ledger.startswith("postgresql://") else f'path = "{ledger}"'
    text = "\n".join(lines) + f"\n[ledger]\n{where}\n"
    text += TIER.format(name="small", base_url=upstream, price_in=0.10, price_out=0.40)
    text += TIER.format(name="large", base_url=upstream, price_in=0.60, price_out=2.40)
    return write_config(tmp / name, text), raw


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    return repr(value)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def create_key(client: httpx.Client | Any, base: str, admin: str, **body: Any) -> dict[str, Any]:
    """POST /admin/keys; the created key's record with its `key`."""
    r = client.post(f"{base}/admin/keys", json=body, headers=bearer(admin))
    assert r.status_code == 201, r.text
    found: dict[str, Any] = r.json()
    return found


def ask(client: httpx.Client, base: str, key: str, *, model: str = "small", user: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
    }
    if user is not None:
        body["user"] = user
    return client.post(f"{base}/v1/chat/completions", json=body, headers=bearer(key))
