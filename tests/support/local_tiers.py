"""Local llama.cpp tiers on SmolLM2-135M, for the tests of what one tier does with another's answer.

The escalation-reuse and shared-prefill tests ask the same question of the same engines and of the
same two-local-tier service; they differ only in the verifiers that reject the small answer. What
they share is here, so the engine settings and the reading of a `tierroute` reply stay one thing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai

from router.api.app import create_app
from router.config import LlamaCppSettings, load_settings
from router.generation import Generation, GenerationRequest, Message
from tests.support.config import smol_config
from tests.support.model import started as started
from tests.support.servers import UvicornThread

ASK = "Explain in a few sentences why the sky is blue."


def ask(text: str = ASK, **kw: object) -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", text),), max_tokens=int(kw.pop("max_tokens", 48)), **kw)  # type: ignore[arg-type]


def engine_settings(path: Path, **kw: object) -> LlamaCppSettings:
    """One thread an engine: two engines of two threads each crawl on a shared two-core machine."""
    return LlamaCppSettings(model=str(path), n_ctx=2048, n_threads=1, n_parallel=4, **kw)  # type: ignore[arg-type]


def drafts(g: Generation, source: str) -> tuple[int, int]:
    """(drafted, accepted) tokens of one draft source; (0, 0) when it drafted nothing."""
    return {s: (t, a) for s, t, a in g.drafts}.get(source, (0, 0))


@contextlib.contextmanager
def two_tier_service(tmp: Path, *, threshold: float, verifiers: str) -> Iterator[tuple[openai.OpenAI, str]]:
    """The service with two local SmolLM2 tiers of one thread each: a client and its base URL."""
    cfg = smol_config(tmp, threshold=threshold, verifiers=verifiers, large="local")
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0), srv.url


def ask_auto(client: openai.OpenAI, messages: list[dict[str, str]], *, stream: bool) -> tuple[str, dict[str, Any]]:
    """The cascade's answer to `messages` (32 tokens at most), whole or streamed, and its `tierroute` field."""
    if stream:
        chunks = list(client.chat.completions.create(model="auto", messages=messages, max_tokens=32, stream=True))  # type: ignore[arg-type]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks[-1].model_extra["tierroute"]  # type: ignore[index]
    r = client.chat.completions.create(model="auto", messages=messages, max_tokens=32)  # type: ignore[arg-type]
    return r.choices[0].message.content or "", r.model_extra["tierroute"]  # type: ignore[index]
