"""`cross_tier`'s reading of a given answer through the real vLLM's `prompt_logprobs`, on the text
that makes a length-based walk over decoded pieces go wrong: characters split over several byte
tokens (accents, CJK, an emoji), and trailing whitespace that a template may trim. An answer the
reader cannot find would be "malformed", retried, and counted against the deployment: a client
could open vLLM's breaker by asking for an answer in Japanese. Each is read, once a token."""

from __future__ import annotations

import httpx
import pytest

from router.generation import GenerationRequest, Message
from tests.support.vllm_server import VllmServer, backend

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ASK = GenerationRequest(messages=(Message("user", "Say something."),), max_tokens=16)


@pytest.mark.parametrize(
    "answer",
    [
        "The answer is 51.",
        "Café crème, naïve façade.",
        "東京は日本の首都です。",
        "Done 🙂👍🏽",
        "Two lines.\n\nThen more.\n",
    ],
    ids=["ascii", "accents", "cjk", "emoji", "trailing-newline"],
)
async def test_an_answer_is_read_token_by_token_whatever_its_text(vllm: VllmServer, answer: str) -> None:
    async with backend(vllm, breaker_failures=1, max_attempts=1) as b:
        read = await b.score_continuation(ASK, answer)
        stats = b.stats()
    root = vllm.base_url.removesuffix("/v1")
    tokens = httpx.post(
        f"{root}/tokenize",
        json={"model": vllm.model, "prompt": answer.rstrip(), "add_special_tokens": False},
        headers={"Authorization": f"Bearer {vllm.key}"},
        timeout=60,
    ).json()["count"]
    # the answer's own tokens, give or take the one a template's boundary may merge or split
    assert abs(read.continuation_tokens - tokens) <= 1, (read.continuation_tokens, tokens)
    assert all(lp <= 0.0 for lp in read.token_logprobs)
    assert stats["consecutive_failures"] == 0 and stats["breaker_opens_total"] == 0
