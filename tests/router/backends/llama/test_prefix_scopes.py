"""Whose prompt KV a local tier reuses for whom: `prefix_cache_scope`, on the real SmolLM2-135M.

The served attack is in test_prefix_tenants.py; here the engine in process, each scope's
boundary read from its own counters: a key reuses only its own prefixes by default, the keys of one
team share under 'team' (a key without a team keeps its own), and under 'global' every caller
shares (the operator's opt-in). The service's own work (no tenant: evals, the command line) is one
tenant of its own. The recent scorings a tier remembers (`cross_tier`'s reading of an answer) are
one tenant's too: another's scoring of the same answer is computed, not found ready, and a
rejected answer's start found by another tenant's scoring is not taken.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from router.backends.llama.backend import LlamaCppBackend
from router.generation import GenerationRequest, Message, Tenant
from tests.support.local_tiers import ask, drafts, engine_settings, started

pytestmark = pytest.mark.slow  # loads a model

SYSTEM = "You are a careful assistant who answers briefly and exactly, in plain words. " * 6
ANA, BEN, CY, DEE = Tenant("ana", "red"), Tenant("ben", "red"), Tenant("cy", "blue"), Tenant("dee")


def chat(question: str, tenant: Tenant | None) -> GenerationRequest:
    return GenerationRequest(
        messages=(Message("system", SYSTEM), Message("user", question)), max_tokens=1, tenant=tenant
    )


async def saved(backend: LlamaCppBackend, request: GenerationRequest) -> tuple[float, int]:
    """(prompt tokens the engine took from its cache for this request, its prompt tokens)."""
    before = backend.stats()["prefix_cache_tokens_saved"]
    g = await backend.generate(request)
    return backend.stats()["prefix_cache_tokens_saved"] - before, g.prompt_tokens


async def test_a_key_reuses_only_its_own_prefixes(smol_path: Path) -> None:
    async with started("small", smol_path, engine_settings(smol_path, prefix_cache_slots=8)) as b:
        assert b.prefix_scope == "key"
        assert (await saved(b, chat("Hi", ANA)))[0] == 0
        # ben of ana's own team, cy of another, dee of none, the service itself: none read ana's
        for tenant in (BEN, CY, DEE, None):
            assert (await saved(b, chat("Name a fruit.", tenant)))[0] == 0, tenant
        # and each reuses what it left itself
        for tenant in (ANA, BEN, None):
            n, prompt = await saved(b, chat("Name a colour.", tenant))
            assert n >= prompt - 16, tenant


async def test_a_team_shares_its_prefixes_under_team_scope(smol_path: Path) -> None:
    async with started("small", smol_path, engine_settings(smol_path, prefix_cache_scope="team")) as b:
        await b.generate(chat("Hi", ANA))
        n, prompt = await saved(b, chat("Name a fruit.", BEN))  # ana's teammate
        assert n >= prompt - 16
        assert (await saved(b, chat("Name a tree.", CY)))[0] == 0  # another team
        assert (await saved(b, chat("Name a bird.", DEE)))[0] == 0  # a key without a team is its own


async def test_every_caller_shares_under_global_scope(smol_path: Path) -> None:
    async with started("small", smol_path, engine_settings(smol_path, prefix_cache_scope="global")) as b:
        await b.generate(chat("Hi", ANA))
        for tenant, question in ((CY, "Name a fruit."), (DEE, "Name a tree."), (None, "Name a bird.")):
            n, prompt = await saved(b, chat(question, tenant))
            assert n >= prompt - 16, tenant


async def test_a_scoring_is_remembered_for_its_tenant_alone(smol_path: Path) -> None:
    async with started("large", smol_path, engine_settings(smol_path, prefix_cache_slots=8)) as b:
        answer = "The sky looks blue because air scatters blue light more than red light."

        async def read(tenant: Tenant) -> int:
            before = b.engine.tokens_read
            await b.score_continuation(ask(tenant=tenant), answer)
            return b.engine.tokens_read - before

        first = await read(ANA)
        assert first > 20
        assert await read(ANA) == 0  # ana's own scoring, found ready
        assert await read(BEN) == first  # ben's is his own work, all of it, not ana's found ready

        # a rejected answer ana's scoring read: its agreed start is taken for ana, not for cy
        scratch = await b.generate(ask())
        rejected = scratch.text[: len(scratch.text) // 2] + " Bananas are purple, and so is every cloud."
        await b.score_continuation(ask(tenant=ANA), rejected)
        theirs = await b.generate_reusing(ask(tenant=CY), rejected)
        assert drafts(theirs, "scored") == (0, 0)
        own = await b.generate_reusing(ask(tenant=ANA), rejected)
        assert drafts(own, "scored")[1] > 0
