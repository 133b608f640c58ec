"""Top-k alternatives through the `openai` backend: asked for only when wanted, read from chat and
legacy completions shapes, plain and streamed, and clamped when the upstream sends too many, bad
numbers or huge pieces. The upstream is the scripted server on loopback."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.backends.openai.reading import MAX_PIECE_CHARS
from router.generation import Delta, Generation, GenerationRequest, Message, TokenLogprob
from tests.support.fault_upstream import FaultUpstream, chat_chunk, ok, raw, sse
from tests.support.openai_backend import backend_for, collect

CHAT = GenerationRequest(messages=(Message("user", "Pick A or B."),), max_tokens=8)
PLAIN = GenerationRequest(prompt="Pick A or B:", max_tokens=8)


def chat_token(token: str, logprob: Any, alternatives: list[tuple[Any, Any]]) -> dict[str, Any]:
    return {
        "token": token,
        "logprob": logprob,
        "bytes": None,
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in alternatives],
    }


def chat_body(content: list[dict[str, Any]], text: str) -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    choice["logprobs"] = {"content": content}
    return json.dumps({"id": "x", "object": "chat.completion", "model": "m", "choices": [choice]}).encode()


async def test_asks_only_when_wanted(upstream: FaultUpstream) -> None:
    async with backend_for(upstream) as backend:
        await backend.generate(CHAT)
        await backend.generate(CHAT.with_(top_logprobs=3))
        await backend.generate(PLAIN)
        await backend.generate(PLAIN.with_(top_logprobs=4))
    bodies = [r.body for r in upstream.requests]
    assert (bodies[0]["logprobs"], bodies[0]["top_logprobs"]) == (True, 0)
    assert (bodies[1]["logprobs"], bodies[1]["top_logprobs"]) == (True, 3)
    assert bodies[2]["logprobs"] == 1 and "top_logprobs" not in bodies[2]
    assert bodies[3]["logprobs"] == 4


async def test_chat_alternatives_are_read_and_clamped(upstream: FaultUpstream) -> None:
    long_piece = "x" * 10_000
    content = [
        chat_token(
            " B",
            -0.5,
            [
                (" A", -2.0),  # out of order: sorted
                (" B", -0.5),
                ("C", float("nan")),  # not finite: dropped (json.dumps writes NaN)
                ("D", 0.7),  # a probability above 1: dropped
                ("E", "-1"),  # not a number: dropped
                (7, -1.0),  # not a piece: dropped
                (long_piece, -3.0),  # cut
                ("F", -4.0),
                ("G", -5.0),  # beyond k=3 once sorted
            ],
        ),
        chat_token(".", -0.1, []),
    ]
    upstream.script(raw(200, chat_body(content, " B.")))
    async with backend_for(upstream) as backend:
        gen = await backend.generate(CHAT.with_(top_logprobs=3))
    assert gen.top_logprobs == (
        TokenLogprob(" B", -0.5, ((" B", -0.5), (" A", -2.0), ("x" * MAX_PIECE_CHARS, -3.0))),
        TokenLogprob(".", -0.1, ()),
    )
    assert gen.token_logprobs == (-0.5, -0.1)


@pytest.mark.parametrize(
    "content",
    [
        [chat_token(" B", float("inf"), [])],  # the sampled token's own logprob is not finite
        [chat_token(" B", 0.5, [])],  # nor at most 0
        [{"token": None, "logprob": -0.1}],  # no piece
        ["not an object"],
        [chat_token("a", -0.1, [])] * 100,  # more tokens than max_tokens could give
    ],
    ids=["inf", "positive", "no-piece", "not-object", "too-many"],
)
async def test_a_malformed_set_is_dropped_and_the_text_kept(upstream: FaultUpstream, content: Any) -> None:
    upstream.script(raw(200, chat_body(content, " B")))
    async with backend_for(upstream) as backend:
        gen = await backend.generate(CHAT.with_(top_logprobs=2))
    assert gen.text == " B"
    assert gen.top_logprobs is None


async def test_no_top_logprobs_when_not_asked(upstream: FaultUpstream) -> None:
    upstream.script(raw(200, chat_body([chat_token(" B", -0.5, [(" B", -0.5)])], " B")))
    async with backend_for(upstream) as backend:
        gen = await backend.generate(CHAT)
    assert gen.top_logprobs is None and gen.token_logprobs == (-0.5,)


async def test_completions_legacy_shape(upstream: FaultUpstream) -> None:
    logprobs = {
        "tokens": [" B", "."],
        "token_logprobs": [-0.5, -0.1],
        "top_logprobs": [{" A": -2.0, " B": -0.5, " C": -3.0}, {".": -0.1, "!": float("-inf")}],
        "text_offset": [0, 2],
    }
    choice = {"index": 0, "text": " B.", "finish_reason": "stop", "logprobs": logprobs}
    body = json.dumps({"id": "x", "object": "text_completion", "model": "m", "choices": [choice]}).encode()
    upstream.script(raw(200, body))
    async with backend_for(upstream) as backend:
        gen = await backend.generate(PLAIN.with_(top_logprobs=2))
    assert gen.top_logprobs == (
        TokenLogprob(" B", -0.5, ((" B", -0.5), (" A", -2.0))),
        TokenLogprob(".", -0.1, ((".", -0.1),)),
    )


async def test_stream_pieces_carry_their_tokens(upstream: FaultUpstream) -> None:
    first = {"content": [chat_token(" B", -0.5, [(" B", -0.5), (" A", -1.5), (" C", -2.5), (" D", -3.5)])]}
    second = {"content": [chat_token(".", -0.1, [(".", -0.1)])]}
    upstream.script(
        sse(
            chat_chunk(" B", logprobs=first),
            chat_chunk(".", logprobs=second),
            chat_chunk(None, finish="stop"),
        )
    )
    async with backend_for(upstream) as backend:
        deltas: list[Delta] = []
        final: Generation | None = None
        async for item in backend.stream(CHAT.with_(top_logprobs=2)):
            if isinstance(item, Delta):
                deltas.append(item)
            else:
                final = item
    assert final is not None and final.top_logprobs is not None
    assert [d.top_logprobs for d in deltas] == [final.top_logprobs[:1], final.top_logprobs[1:]]
    assert final.top_logprobs[0].top == ((" B", -0.5), (" A", -1.5))


async def test_a_stream_chunk_without_them_drops_the_set(upstream: FaultUpstream) -> None:
    first = {"content": [chat_token(" B", -0.5, [(" B", -0.5)])]}
    upstream.script(
        sse(chat_chunk(" B", logprobs=first), chat_chunk(".", logprobs=None), chat_chunk(None, finish="stop"))
    )
    async with backend_for(upstream) as backend:
        _, final = await collect(backend, CHAT.with_(top_logprobs=2))
    assert final.text == " B." and final.top_logprobs is None


async def test_the_happy_upstream_still_parses(upstream: FaultUpstream) -> None:
    upstream.script(ok(), ok())
    async with backend_for(upstream) as backend:
        gen = await backend.generate(CHAT.with_(top_logprobs=2))
        _, streamed = await collect(backend, CHAT.with_(top_logprobs=2))
    for g in (gen, streamed):
        assert g.top_logprobs is not None
        assert "".join(t.token for t in g.top_logprobs) == g.text
