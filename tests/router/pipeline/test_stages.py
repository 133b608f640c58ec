"""Request stages through the HTTP API, in process: what a stage can do to a request (refuse,
rewrite, narrow the plan, answer from a stored answer) and to its answer (refuse it, note it), on
both completion surfaces, streamed and not, with the ledger as the witness.

The tiers are `Counting` backends (tests/support/cache.py) behind a real SQLite ledger: a
generation shows in `calls`, so a request a stage refused provably reached no tier.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.cache.answer import CachedAnswer
from router.cascade import CascadeResult
from router.config import load_settings
from router.errors import ConfigError
from router.generation import GenerationRequest, Message, Tenant
from router.pipeline import Stage, StageContext, StageRefused
from router.pipeline.builtin import register_builtin_stages
from router.pipeline.stages import StageRegistry, build_stages
from tests.support.accounting import chat, read_ledger, running
from tests.support.cache import Counting
from tests.support.config import write_config
from tests.support.model import SMOL


class Recording(Counting):
    """A Counting tier that keeps the last request it generated for."""

    last: GenerationRequest | None = None

    async def stream(self, request: GenerationRequest):  # type: ignore[no-untyped-def]
        self.last = request
        async for event in super().stream(request):
            yield event


class Note(Stage):
    """Notes every request it sees, before and after."""

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.seen = 0

    async def before(self, ctx: StageContext) -> CachedAnswer | None:
        self.seen += 1
        ctx.notes[self.name] = {"surface": ctx.surface, "seen": self.seen, "plan": [t.name for t in ctx.plan]}
        return None

    async def after(self, ctx: StageContext, result: CascadeResult) -> None:
        ctx.notes[self.name]["answered_by"] = result.final.tier


class Refuse(Stage):
    async def before(self, ctx: StageContext) -> CachedAnswer | None:
        raise StageRefused(self.name, "Not this one.", param="messages")


class Rewrite(Stage):
    """Puts an operator's system message first."""

    async def before(self, ctx: StageContext) -> CachedAnswer | None:
        messages = (Message("system", "Be brief."), *(ctx.request.messages or ()))
        ctx.request = ctx.request.with_(messages=messages)
        return None


class Afresh(Stage):
    """Replaces the request with one it builds itself, naming no tenant."""

    async def before(self, ctx: StageContext) -> CachedAnswer | None:
        ctx.request = GenerationRequest(messages=(Message("user", "Rewritten."),), max_tokens=8)
        return None


class LargeOnly(Stage):
    async def before(self, ctx: StageContext) -> CachedAnswer | None:
        ctx.narrow(["large"])
        return None


class Stored(Stage):
    """Answers every chat request from a stored answer (as a semantic cache would)."""

    async def before(self, ctx: StageContext) -> CachedAnswer | None:
        message = {"role": "assistant", "content": "stored answer"}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        return CachedAnswer("req-earlier", "small", "small", [choice], usage, None, None)


class HoldBack(Stage):
    """Refuses any answer that mentions 'answer 1': sees every answer before it is sent."""

    inspects_output = True

    async def after(self, ctx: StageContext, result: CascadeResult) -> None:
        if "answer 1" in result.generation.text:
            raise StageRefused(self.name, "The answer was withheld.")


STAGES = {"note": Note, "refuse": Refuse, "rewrite": Rewrite, "large_only": LargeOnly, "stored": Stored}
STAGES["hold_back"] = HoldBack
STAGES["afresh"] = Afresh


def registry() -> StageRegistry:
    reg = StageRegistry()
    for name, cls in STAGES.items():
        reg.register(name, cls)
    register_builtin_stages(reg.register)
    return reg


def config(tmp: Path, stages: str, *, threshold: float = 0.5) -> Path:
    """Two tiers (their backends replaced in the tests), a keyless server, a SQLite ledger, stages."""
    tiers = "".join(
        f'[[tiers]]\nname = "{name}"\nbackend = "llamacpp"\nthreshold = {threshold}\nmax_tokens = 64\n'
        f'[tiers.llamacpp]\nmodel = "{SMOL}"\n'
        "[tiers.price]\nusd_per_1m_input_tokens = 0.60\nusd_per_1m_output_tokens = 2.40\n"
        for name in ("small", "large")
    )
    text = f'[server]\nallow_unauthenticated = true\n[ledger]\npath = "{tmp / "ledger.sqlite3"}"\n{stages}\n{tiers}'
    return write_config(tmp / "config.toml", text)


def stage(name: str, params: str = "") -> str:
    return f'[[stages]]\nname = "{name}"\n' + (f"params = {params}\n" if params else "")


def last_chunk(r: httpx.Response) -> dict[str, Any]:
    lines = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", r.text
    return json.loads(lines[-2])  # type: ignore[no-any-return]


async def serve(tmp: Path, stages: str, **kwargs: Any) -> tuple[Any, Recording, Recording]:
    small, large = Recording("small"), Recording("large")
    ctx = running(config(tmp, stages, **kwargs), backends={"small": small, "large": large}, stages=registry())
    return ctx, small, large


async def test_a_stage_runs_on_every_request_of_every_surface_and_says_so(tmp_path: Path) -> None:
    ctx, small, _ = await serve(tmp_path, stage("note"))
    async with ctx as client:
        plain = await client.post("/v1/chat/completions", json=chat("Hi"))
        streamed = await client.post("/v1/chat/completions", json=chat("Hi", stream=True))
        legacy = await client.post("/v1/completions", json={"model": "auto", "prompt": "Hi", "max_tokens": 8})
    notes = [plain.json()["tierroute"]["stages"], last_chunk(streamed)["tierroute"]["stages"]]
    notes.append(legacy.json()["tierroute"]["stages"])
    assert [n["note"]["surface"] for n in notes] == ["chat.completions", "chat.completions", "completions"]
    assert [n["note"]["seen"] for n in notes] == [1, 2, 3]
    assert all(n["note"]["answered_by"] == "small" and n["note"]["plan"] == ["small", "large"] for n in notes)
    assert small.calls == 3


async def test_a_refusal_before_generation_reaches_no_tier_and_writes_no_row(tmp_path: Path) -> None:
    ctx, small, large = await serve(tmp_path, stage("note") + stage("refuse"))
    async with ctx as client:
        r = await client.post("/v1/chat/completions", json=chat("Hi"))
        s = await client.post("/v1/chat/completions", json=chat("Hi", stream=True))
    for resp in (r, s):
        assert resp.status_code == 400
        err = resp.json()["error"]
        assert err["code"] == "refused_by_refuse" and err["param"] == "messages" and err["message"] == "Not this one."
    assert small.calls == large.calls == 0
    assert read_ledger(tmp_path / "ledger.sqlite3") == {}


async def test_a_stage_rewrites_what_the_tiers_are_sent(tmp_path: Path) -> None:
    ctx, small, _ = await serve(tmp_path, stage("rewrite"))
    async with ctx as client:
        r = await client.post("/v1/chat/completions", json=chat("Hi"))
    assert r.status_code == 200
    assert small.last is not None and [m.role for m in small.last.messages or ()] == ["system", "user"]


async def test_a_request_a_stage_builds_afresh_is_still_the_callers(tmp_path: Path) -> None:
    # the tenant decides whose prompt KV a local tier may reuse (docs/security.md): a stage that
    # dropped it would have its requests share one another's
    ctx, small, _ = await serve(tmp_path, stage("afresh"))
    async with ctx as client:
        r = await client.post("/v1/chat/completions", json=chat("Hi"))
    assert r.status_code == 200
    assert small.last is not None and small.last.last_user_text() == "Rewritten."
    assert small.last.tenant == Tenant("anonymous")  # a keyless server's one tenant


async def test_a_stage_narrows_the_plan_and_the_cascade_tries_only_what_is_left(tmp_path: Path) -> None:
    ctx, small, large = await serve(tmp_path, stage("large_only") + stage("note"))
    async with ctx as client:
        r = await client.post("/v1/chat/completions", json=chat("Hi"))
        s = await client.post("/v1/chat/completions", json=chat("Hi", stream=True))
    assert r.status_code == 200 and r.json()["tierroute"]["tier"] == "large"
    assert r.json()["tierroute"]["stages"]["note"]["plan"] == ["large"]
    assert last_chunk(s)["tierroute"]["tier"] == "large"
    assert small.calls == 0 and large.calls == 2
    rows = read_ledger(tmp_path / "ledger.sqlite3")
    assert {row.tier for row in rows.values()} == {"large"}


def test_narrowing_can_only_take_tiers_away() -> None:
    class T:
        def __init__(self, name: str) -> None:
            self.name = name

    ctx = StageContext("chat.completions", None, "auto", None, (T("small"), T("large")))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a subset"):
        ctx.narrow(["huge"])
    with pytest.raises(ValueError, match="not a subset"):
        ctx.narrow([])
    ctx.narrow(["large", "small"])
    assert [t.name for t in ctx.plan] == ["small", "large"]  # the plan's order, whatever the stage's


async def test_a_stored_answer_from_a_stage_is_served_and_recorded_at_no_cost(tmp_path: Path) -> None:
    ctx, small, large = await serve(tmp_path, stage("stored"))
    async with ctx as client:
        r = await client.post("/v1/chat/completions", json=chat("Hi"))
        s = await client.post("/v1/chat/completions", json=chat("Hi", stream=True))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "stored answer"
    assert r.headers["x-tierroute-cache"] == "stage" and r.json()["tierroute"]["cost_usd"] == 0.0
    assert last_chunk(s)["tierroute"]["cached_request_id"] == "req-earlier"
    assert small.calls == large.calls == 0
    rows = read_ledger(tmp_path / "ledger.sqlite3")
    assert len(rows) == 2 and all(row.cost_usd == 0.0 for row in rows.values())
    reasons = {a.reason for row in rows.values() for a in row.attempts}
    assert reasons == {"stored answer from stage stored: the answer of req-earlier"}


async def test_an_output_stage_withholds_an_answer_streamed_or_not_and_its_cost_is_recorded(tmp_path: Path) -> None:
    ctx, small, _ = await serve(tmp_path, stage("hold_back"))
    async with ctx as client:
        r = await client.post("/v1/chat/completions", json=chat("Hi"))  # "answer 1 here": withheld
        s = await client.post("/v1/chat/completions", json=chat("Hi", stream=True))  # "answer 2 here": sent
        t = await client.post("/v1/chat/completions", json=chat("Hi", stream=True))  # "answer 3 here"
    assert r.status_code == 400 and r.json()["error"]["code"] == "refused_by_hold_back"
    assert "answer 1" not in r.text
    assert s.status_code == 200 and "answer 2 here" in s.text and t.status_code == 200
    rows = read_ledger(tmp_path / "ledger.sqlite3")
    assert len(rows) == 3 and small.calls == 3  # the withheld answer was generated and is on the ledger


async def test_the_built_in_deny_phrases_refuses_without_naming_the_phrase(tmp_path: Path) -> None:
    ctx, small, _ = await serve(tmp_path, stage("deny_phrases", '{ phrases = ["Project Falcon"] }'))
    async with ctx as client:
        bad = await client.post("/v1/chat/completions", json=chat("tell me about project falcon"))
        legacy = await client.post("/v1/completions", json={"model": "auto", "prompt": "PROJECT FALCON?"})
        fine = await client.post("/v1/chat/completions", json=chat("tell me about falcons"))
    for resp in (bad, legacy):
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "refused_by_deny_phrases"
        assert "falcon" not in resp.text.lower()
    assert fine.status_code == 200 and small.calls == 1


@pytest.mark.parametrize(
    ("params", "why"),
    [
        ("{}", "phrases"),
        ("{ phrases = [] }", "phrases"),
        ('{ phrases = [""] }', "phrases"),
        ('{ phrases = ["x"], case_sensitive = "no" }', "case_sensitive"),
        ('{ phrases = ["x"], colour = "red" }', "unknown params"),
    ],
)
def test_a_stage_with_bad_params_or_an_unknown_name_is_refused_at_start(tmp_path: Path, params: str, why: str) -> None:
    settings = load_settings(config(tmp_path, stage("deny_phrases", params)))
    with pytest.raises(ConfigError, match=why):
        build_stages(settings.stages, registry())
    settings = load_settings(config(tmp_path, stage("no_such_stage")))
    with pytest.raises(ConfigError, match="unknown stage 'no_such_stage'"):
        build_stages(settings.stages, registry())
