"""Shared by the ledger, limits, keys, metrics and report tests: configs with keys, an in-process
app with its lifespan, a verifier that rejects on a marker, and the reconciliation check."""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import httpx

from router.admission.auth import hash_key, new_key
from router.api.app import create_app
from router.config import load_settings
from router.generation import Generation, GenerationRequest
from router.ledger.entries import LedgerEntry
from router.ledger.store import SQLiteStore
from tests.support.config import smol_config
from verifiers.base import Registry, Score, VerifierCost

MARK = "[escalate]"
# the small tier's answer is rejected when the prompt carries MARK, so those requests escalate
ESCALATE_ON_MARK = '[[tiers.verifiers]]\nname = "escalate_marked"\n'


class EscalateMarked:
    """Scores 0 when the user's text carries MARK, else 1; charges a few verifier tokens, so
    verifier costs show in the ledger."""

    name = "escalate_marked"

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        rejected = MARK in request.last_user_text()
        return Score(
            0.0 if rejected else 1.0,
            "marked" if rejected else "unmarked",
            cost=VerifierCost(prompt_tokens=7, seconds=0.01),
        )


def registry() -> Registry:
    reg = Registry()
    reg.register("escalate_marked", lambda params, ctx: EscalateMarked())
    return reg


def keys_section(keys: dict[str, dict[str, Any]]) -> tuple[str, dict[str, str]]:
    """A [server] body with these keys (name -> limits), and the raw keys by name."""
    raw: dict[str, str] = {}
    lines: list[str] = []
    for name, limits in keys.items():
        raw[name] = new_key()
        lines += ["[[server.api_keys]]", f'name = "{name}"', f'hash = "{hash_key(raw[name])}"']
        lines += [f"{k} = {v!r}" for k, v in limits.items()]
    return "\n".join(lines), raw


def config_with_keys(tmp: Path, keys: dict[str, dict[str, Any]], **kwargs: Any) -> tuple[Path, dict[str, str]]:
    body, raw = keys_section(keys)
    # [[server.api_keys]] tables must come after [server]'s own keys: put extra server keys first
    extra = kwargs.pop("server_extra", "")
    return smol_config(tmp, server=f"{extra}\n{body}", **kwargs), raw


@contextlib.asynccontextmanager
async def running(cfg: Path, **app_kwargs: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan (engine and ledger opened, then closed), and a client for it."""
    app_kwargs.setdefault("registry", registry())
    app = create_app(load_settings(cfg), **app_kwargs)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        # a loopback name: a keyless server answers no other Host (server.allowed_hosts)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=300) as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


def chat(content: str, *, model: str = "auto", max_tokens: int = 8, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
    return body


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def tierroute_of(response_text: str, stream: bool) -> dict[str, Any] | None:
    """The `tierroute` object a client received: the body's, or a stream's final chunk's. None
    when a stream ended before it (or without [DONE])."""
    if not stream:
        return json.loads(response_text)["tierroute"]  # type: ignore[no-any-return]
    ext = None
    done = False
    for line in response_text.splitlines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        if "tierroute" in chunk:
            ext = chunk["tierroute"]
    return ext if done else None


def read_ledger(path: Path) -> dict[str, LedgerEntry]:
    store = SQLiteStore(path, read_only=True)
    store.open()
    try:
        return {e.request_id: e for e in store.entries()}
    finally:
        store.close()


def assert_matches(entry: LedgerEntry, ext: dict[str, Any], key_id: str | None = None) -> None:
    """The ledger row holds exactly what the client was sent: tier, costs, every attempt."""
    assert entry.request_id == ext["request_id"]
    assert entry.tier == ext["tier"]
    assert entry.escalated == ext["escalated"]
    assert entry.unverified == ext["unverified"]
    assert entry.cost_usd == ext["cost_usd"]
    assert entry.counterfactual_usd == ext["counterfactual_top_tier_usd"]
    assert len(entry.attempts) == len(ext["attempts"])
    for mine, theirs in zip(entry.attempts, ext["attempts"], strict=False):
        assert mine.tier == theirs["tier"]
        assert (mine.decision == "accepted") == theirs["accepted"]
        assert mine.prompt_tokens == theirs["prompt_tokens"]
        assert mine.completion_tokens == theirs["completion_tokens"]
        assert mine.cost_usd == theirs["cost_usd"]
        assert mine.verifier_cost_usd == theirs["verifier_cost_usd"]
        assert mine.verifier_tokens == theirs["verifier_tokens"]
        assert mine.threshold == theirs["threshold"]
        if theirs["score"] is not None:
            assert round(mine.score, 6) == theirs["score"]  # type: ignore[arg-type]
    if key_id is not None:
        assert entry.key_id == key_id


def assert_no_partial_requests(path: Path) -> None:
    """Every request row has all its attempts, and no attempt lacks its request."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        orphans = conn.execute(
            "SELECT COUNT(*) FROM attempts a LEFT JOIN requests r USING (request_id) WHERE r.request_id IS NULL"
        ).fetchone()[0]
        short = conn.execute(
            "SELECT COUNT(*) FROM requests r WHERE r.n_attempts != "
            "(SELECT COUNT(*) FROM attempts a WHERE a.request_id = r.request_id) OR r.n_attempts = 0"
        ).fetchone()[0]
    finally:
        conn.close()
    assert orphans == 0, f"{orphans} attempt rows without their request"
    assert short == 0, f"{short} request rows missing attempts"


def fsum_cost(exts: Iterable[dict[str, Any]]) -> float:
    return math.fsum(e["cost_usd"] for e in exts)
