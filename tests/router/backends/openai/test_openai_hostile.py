"""The `openai` backend against an upstream that lies, floods or leaks: every answer it gives is
either read within bounds or refused as an upstream failure, and nothing it says is trusted.

The upstream is the scripted server on loopback (tests/support/fault_upstream.py); the backend is
the real one with its real SDK client and transport.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

import pytest
from pydantic import ValidationError

from router.backends.openai import OpenAIBackend
from router.backends.openai.call import TEMPLATE_TOKENS_ESTIMATE, estimate_prompt_tokens, estimate_tokens
from router.config import OpenAIBackendSettings
from router.errors import (
    AnswerTooLargeError,
    CircuitOpenError,
    DeadlineError,
    RequestError,
    UnavailableError,
    UpstreamError,
)
from router.generation import Delta, GenerationRequest, Message
from router.wire import sent_bytes
from tests.support.fault_upstream import (
    PROMPT_TOKENS,
    TOKENS,
    Endless,
    FaultUpstream,
    chat_chunk,
    dribble,
    ok,
    oversized,
    raw,
    reset,
    sse,
    stalled_body,
    status,
)
from tests.support.openai_backend import LEAKY, SECRET, TEXT, backend_for, chat_body, collect

CHAT = GenerationRequest(messages=(Message("user", "Say hello."),), max_tokens=32)


async def fail_plain(backend: OpenAIBackend) -> UnavailableError:
    with pytest.raises(UnavailableError) as info:
        await backend.generate(CHAT)
    return info.value


async def fail_stream(backend: OpenAIBackend) -> UnavailableError:
    with pytest.raises(UnavailableError) as info:
        await collect(backend, CHAT)
    return info.value


# -- Retry-After ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "inf",
        "-inf",
        "nan",
        "-5",
        "1e9",
        "1e400",
        "soon",
        "",
        "Thu, 01 Jan 1970 00:00:00 GMT",
        "Fri, 31 Dec 9999 23:59:59 GMT",
    ],
)
@pytest.mark.parametrize("way", ["plain", "stream"])
async def test_hostile_retry_after_gives_a_bounded_retry_after_quickly(
    upstream: FaultUpstream, value: str, way: str
) -> None:
    upstream.script(*[status(503, "busy", headers={"Retry-After": value})] * 3)
    async with backend_for(upstream, timeout_s=5.0, retry_after_s=30.0) as backend:
        started = time.monotonic()
        error = await (fail_plain(backend) if way == "plain" else fail_stream(backend))
        elapsed = time.monotonic() - started
    assert isinstance(error, UpstreamError)
    assert math.isfinite(error.retry_after) and 1.0 <= error.retry_after <= 30.0
    assert elapsed < 2.0  # no sleep on the upstream's say-so past the deadline


async def test_retry_after_beyond_the_deadline_is_clamped_to_the_tier_timeout(upstream: FaultUpstream) -> None:
    upstream.script(status(429, "later", headers={"Retry-After": "1e9"}))
    async with backend_for(upstream, timeout_s=4.0) as backend:
        error = await fail_plain(backend)
    assert error.retry_after == 4.0
    assert len(upstream.requests) == 1  # waiting would pass the deadline: given up at once


@pytest.mark.parametrize(
    "script",
    [
        [status(503, "down")] * 3,
        [status(500, "x", headers={"Retry-After": "inf"})],
        [status(429, "x", headers={"Retry-After": "1e9"})],
        [status(503, "x", headers={"Retry-After": "2"})],
        [status(401, "bad key")],
        [oversized(8 * 1024 * 1024, declare=True)],
    ],
    ids=["503-no-header", "inf", "1e9", "2s", "401", "oversized"],
)
async def test_the_same_failure_gives_the_same_retry_after_plain_and_streamed(
    upstream: FaultUpstream, script: list[Any]
) -> None:
    got = []
    for way in ("plain", "stream"):
        upstream.script(*script)
        async with backend_for(upstream, timeout_s=1.5, retry_after_s=17.0) as backend:
            got.append((await (fail_plain(backend) if way == "plain" else fail_stream(backend))).retry_after)
    assert got[0] == got[1]


async def test_plain_then_stream_against_a_dead_upstream_agree_with_the_default_settings(
    upstream: FaultUpstream,
) -> None:
    """The issue's case: a plain request spends its three attempts, the stream after it opens the
    breaker (five failures); both are told the same wait. (Resets: a 5xx counts once a request,
    `test_openai_backend`.)"""
    upstream.default = reset()
    defaults = OpenAIBackendSettings(base_url=upstream.base_url, model="m")
    async with backend_for(
        upstream,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
        breaker_failures=defaults.breaker_failures,
        breaker_cooldown_s=defaults.breaker_cooldown_s,
    ) as backend:
        plain = await fail_plain(backend)
        streamed = await fail_stream(backend)
    assert isinstance(streamed, CircuitOpenError)
    assert plain.retry_after == pytest.approx(streamed.retry_after, abs=1.0) == 30.0


async def test_retry_after_s_is_the_fallback_and_the_breaker_cool_down_the_floor(upstream: FaultUpstream) -> None:
    upstream.script(status(503), status(503))
    async with backend_for(
        upstream, max_attempts=1, retry_after_s=12.0, breaker_failures=2, breaker_cooldown_s=45.0
    ) as backend:
        first = await fail_plain(backend)  # breaker still closed, the upstream said nothing
        second = await fail_plain(backend)  # this failure opens it
    assert first.retry_after == 12.0
    assert second.retry_after == pytest.approx(45.0, abs=0.5)


# -- usage ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -1000, "completion_tokens": 4},
        {"prompt_tokens": 7, "completion_tokens": -4},
        {"prompt_tokens": 7.5, "completion_tokens": 4},
        {"prompt_tokens": "7", "completion_tokens": 4},
        {"prompt_tokens": True, "completion_tokens": 4},
        {"prompt_tokens": 10**9, "completion_tokens": 4},
        {"prompt_tokens": 7, "completion_tokens": 10**6},
        {"prompt_tokens": float("inf"), "completion_tokens": 4},
        {"prompt_tokens": float("nan"), "completion_tokens": 4},
        [7, 4],
        "lots",
    ],
    ids=[
        "negative-prompt",
        "negative-completion",
        "fraction",
        "string",
        "bool",
        "huge-prompt",
        "beyond-max-tokens",
        "inf",
        "nan",
        "list",
        "text",
    ],
)
@pytest.mark.parametrize("way", ["plain", "stream"])
async def test_impossible_usage_falls_back_to_the_estimate_with_a_warning(
    upstream: FaultUpstream, usage: Any, way: str, caplog: pytest.LogCaptureFixture
) -> None:
    if way == "plain":
        upstream.script(raw(200, chat_body(usage=usage)))
    else:
        events = [chat_chunk(t) for t in TOKENS]
        upstream.script(
            sse(
                *events,
                chat_chunk(finish="stop"),
                {"id": "u", "object": "chat.completion.chunk", "choices": [], "usage": usage},
            )
        )
    caplog.set_level(logging.WARNING, "router.backends.openai")
    async with backend_for(upstream, logprobs=False) as backend:
        gen = await backend.generate(CHAT) if way == "plain" else (await collect(backend, CHAT))[1]
    assert gen.text == TEXT
    estimate = estimate_prompt_tokens(CHAT)  # its text, and the chat template's tokens (`call`)
    assert gen.prompt_tokens == estimate == estimate_tokens("Say hello.") + 2 * TEMPLATE_TOKENS_ESTIMATE
    assert 0 < gen.completion_tokens <= CHAT.max_tokens
    assert "upstream usage refused" in caplog.text


async def test_plausible_usage_is_taken_as_sent(upstream: FaultUpstream) -> None:
    # a hosted API's own system prompt makes the count larger than our prompt: still plausible
    upstream.script(raw(200, chat_body(usage={"prompt_tokens": 900, "completion_tokens": CHAT.max_tokens + 2})))
    async with backend_for(upstream) as backend:
        gen = await backend.generate(CHAT)
    assert (gen.prompt_tokens, gen.completion_tokens) == (900, CHAT.max_tokens + 2)


@pytest.mark.parametrize("hosted", [0, 1_000_000], ids=["none", "most"])
async def test_usage_is_taken_up_to_the_hosted_allowance_and_refused_past_it(
    upstream: FaultUpstream, hosted: int, caplog: pytest.LogCaptureFixture
) -> None:
    # `hosted_prompt_tokens` at both ends of its range: the prompt count a server may report is
    # what it was sent (a token a byte, 64 per message) plus exactly that allowance, no more
    caplog.set_level(logging.WARNING, "router.backends.openai")
    async with backend_for(upstream, logprobs=False, hosted_prompt_tokens=hosted) as backend:
        bound = backend.prompt_token_limit(CHAT)
        assert bound == sent_bytes(CHAT) + 64 + hosted
        upstream.script(raw(200, chat_body(usage={"prompt_tokens": bound, "completion_tokens": 4})))
        assert (await backend.generate(CHAT)).prompt_tokens == bound
        assert "upstream usage refused" not in caplog.text
        upstream.script(raw(200, chat_body(usage={"prompt_tokens": bound + 1, "completion_tokens": 4})))
        gen = await backend.generate(CHAT)
    assert gen.prompt_tokens == estimate_prompt_tokens(CHAT)
    assert "upstream usage refused" in caplog.text


@pytest.mark.parametrize("hosted", [-1, 1_000_001])
def test_a_hosted_allowance_out_of_range_is_refused(hosted: int) -> None:
    with pytest.raises(ValidationError, match="hosted_prompt_tokens"):
        OpenAIBackendSettings(base_url="http://127.0.0.1:9/v1", model="m", hosted_prompt_tokens=hosted)


async def test_an_answer_longer_than_max_tokens_is_never_counted_beyond_it(upstream: FaultUpstream) -> None:
    upstream.script(raw(200, chat_body("word " * 5000, usage=None)))
    async with backend_for(upstream, logprobs=False) as backend:
        gen = await backend.generate(CHAT)
    assert gen.completion_tokens == CHAT.max_tokens


# -- sizes ---------------------------------------------------------------------------------------


LIMIT = 64 * 1024


@pytest.mark.parametrize(
    "answer",
    [
        oversized(LIMIT * 4, declare=True),
        oversized(LIMIT * 4, declare=False),
        oversized(LIMIT * 4, declare=False, code=500),
        oversized(LIMIT * 4, declare=True, code=400),
    ],
    ids=["declared", "chunked", "error-body-500", "error-body-400"],
)
@pytest.mark.parametrize("way", ["plain", "stream"])
async def test_an_oversized_answer_is_an_upstream_failure_not_retried(
    upstream: FaultUpstream, answer: Any, way: str
) -> None:
    upstream.script(answer)
    async with backend_for(upstream, max_response_bytes=LIMIT) as backend:
        error = await (fail_plain(backend) if way == "plain" else fail_stream(backend))
        assert backend.breaker.consecutive_failures == 1
    assert isinstance(error, UpstreamError)
    assert "refused" in str(error) and str(LIMIT) in str(error)
    assert len(upstream.requests) == 1


async def test_an_endless_stream_is_cut_at_the_byte_limit(upstream: FaultUpstream) -> None:
    endless = Endless()
    upstream.script(endless)
    pieces: list[str] = []
    # a million tokens asked for: an honest answer could be that large, so it is the request's 400
    async with backend_for(upstream, max_response_bytes=LIMIT, max_stream_events=10**6) as backend:
        with pytest.raises(AnswerTooLargeError, match="max_response_bytes"):
            async for item in backend.stream(CHAT.with_(max_tokens=10**6)):
                assert isinstance(item, Delta)
                pieces.append(item.text)
    assert 0 < len("".join(pieces)) < LIMIT
    assert len(upstream.requests) == 1  # text had begun: not retried


async def test_a_stream_that_ignores_max_tokens_is_cut(upstream: FaultUpstream) -> None:
    endless = Endless()
    upstream.script(endless)
    pieces: list[str] = []
    async with backend_for(upstream) as backend:
        with pytest.raises(UpstreamError, match="max_tokens=32"):
            async for item in backend.stream(CHAT):
                assert isinstance(item, Delta)
                pieces.append(item.text)
        assert backend.stats()["upstream_failed_requests_total"] == 1
    assert len(pieces) == 2 * (CHAT.max_tokens + 8)


async def test_a_stream_of_too_many_events_is_cut(upstream: FaultUpstream) -> None:
    upstream.script(sse(*[chat_chunk("") for _ in range(500)], chat_chunk("late"), chat_chunk(finish="stop")))
    async with backend_for(upstream, max_stream_events=100) as backend:
        error = await fail_stream(backend)
    assert isinstance(error, UpstreamError) and "more than 100 events" in str(error)
    assert len(upstream.requests) == 1


async def test_a_stream_dribbled_a_byte_at_a_time_is_cut(upstream: FaultUpstream) -> None:
    upstream.script(dribble(*[chat_chunk(t) for t in TOKENS], chat_chunk(finish="stop")))
    async with backend_for(upstream, max_stream_events=16) as backend:
        error = await fail_stream(backend)
    assert "pieces" in str(error)
    assert len(upstream.requests) == 1


async def test_a_stream_in_pieces_of_a_normal_size_is_read(upstream: FaultUpstream) -> None:
    upstream.script(dribble(*[chat_chunk(t) for t in TOKENS], chat_chunk(finish="stop"), piece=40))
    async with backend_for(upstream, max_stream_events=16, logprobs=False) as backend:
        pieces, gen = await collect(backend, CHAT)
    assert pieces == list(TOKENS) and gen.finish_reason == "stop"


@pytest.mark.slow
async def test_one_endless_line_costs_linear_time(upstream: FaultUpstream) -> None:
    line = b"data: " + b"x" * (3 * 1024 * 1024)  # no line end: one event that never completes
    upstream.script(sse(*[line[i : i + 128] for i in range(0, len(line), 128)], done=False))
    async with backend_for(upstream, max_stream_events=10**5, max_attempts=1) as backend:
        started = time.monotonic()
        error = await fail_stream(backend)
        assert time.monotonic() - started < 3.0  # rescanning the line per piece took over 4 s
    assert "malformed" in str(error)


async def test_a_compressed_answer_is_refused(upstream: FaultUpstream) -> None:
    import gzip

    bomb = gzip.compress(b" " * (4 * 1024 * 1024))  # 4 KB on the wire, 4 MB in memory
    upstream.script(raw(200, bomb, headers={"Content-Encoding": "gzip"}))
    async with backend_for(upstream) as backend:
        error = await fail_plain(backend)
    assert "compressed" in str(error)
    assert upstream.requests[0].headers["accept-encoding"] == "identity"


async def test_a_redirect_is_not_followed(upstream: FaultUpstream) -> None:
    with FaultUpstream() as elsewhere:
        upstream.script(raw(307, b"", headers={"Location": f"{elsewhere.base_url}/chat/completions"}))
        async with backend_for(upstream) as backend:
            error = await fail_plain(backend)
        assert elsewhere.requests == []
    assert isinstance(error, UpstreamError) and "HTTP 307" in str(error)
    assert len(upstream.requests) == 1


# -- error text ----------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [500, 503, 401, 404, 400, 422])
async def test_upstream_error_text_stays_in_the_log(
    upstream: FaultUpstream, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    upstream.default = status(
        code, LEAKY, param=f"messages; see http://10.0.7.12/{SECRET}", code_name="internal error at 10.0.7.12"
    )
    caplog.set_level(logging.WARNING, "router.backends.openai")
    async with backend_for(upstream) as backend:
        with pytest.raises((UnavailableError, RequestError)) as info:
            await backend.generate(CHAT)
    error = info.value
    for leak in (SECRET, "10.0.7.12", "Bearer", "Traceback", "/srv/vllm"):
        assert leak not in str(error)
    assert f"HTTP {code}" in str(error) and "tier large" in str(error)
    if isinstance(error, RequestError):
        assert error.param is None and error.code is None  # prose is not an identifier
    assert SECRET in caplog.text and "Traceback" in caplog.text  # whole, for the operator


async def test_an_error_body_that_is_not_json_stays_in_the_log(
    upstream: FaultUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    upstream.default = raw(502, f"<html>{LEAKY}</html>".encode(), content_type="text/html")
    async with backend_for(upstream) as backend:
        error = await fail_plain(backend)
    assert SECRET not in str(error) and "HTTP 502" in str(error)
    assert SECRET in caplog.text


# -- streams without a finish_reason -------------------------------------------------------------


async def test_done_without_finish_reason_is_a_cut_stream(upstream: FaultUpstream) -> None:
    # llama-cpp-python's server ends a running stream with [DONE] alone when another request
    # arrives (--interrupt_requests): that was passed off as a whole answer (issue 38's review).
    # The scripted upstream fails the tier's own probe too, so the cut is its failure here
    upstream.script(sse(*[chat_chunk(t) for t in TOKENS]))
    pieces: list[str] = []
    async with backend_for(upstream, logprobs=False) as backend:
        with pytest.raises(UpstreamError, match="stream broke after 13 characters"):
            async for item in backend.stream(CHAT):
                pieces += [item.text] if isinstance(item, Delta) else []
        assert backend.breaker.consecutive_failures == 1
    assert pieces == list(TOKENS)


async def test_finish_reason_without_done_is_complete(upstream: FaultUpstream) -> None:
    upstream.script(sse(*[chat_chunk(t) for t in TOKENS], chat_chunk(finish="length"), done=False))
    async with backend_for(upstream, logprobs=False) as backend:
        _, gen = await collect(backend, CHAT)
    assert (gen.text, gen.finish_reason) == (TEXT, "length")


async def test_neither_done_nor_finish_reason_is_a_cut_stream(upstream: FaultUpstream) -> None:
    upstream.script(sse(*[chat_chunk(t) for t in TOKENS], done=False))
    async with backend_for(upstream, logprobs=False) as backend:
        with pytest.raises(UpstreamError, match="stream broke after 13 characters"):
            await collect(backend, CHAT)


async def test_done_alone_is_no_answer_and_is_retried(upstream: FaultUpstream) -> None:
    upstream.script(sse())
    async with backend_for(upstream) as backend:
        _, gen = await collect(backend, CHAT)
    assert gen.text == TEXT
    assert len(upstream.requests) == 2


# -- shapes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"[1, 2, 3]",
        b'"just a string"',
        b"null",
        chat_body(choices="many"),
        chat_body(choices=[]),
        chat_body(choices=["a choice"]),
        chat_body(choices=[{"index": 1, "message": {"content": "not ours"}, "finish_reason": "stop"}]),
        chat_body(content=42),
        chat_body(content=[{"type": "text", "text": "parts"}]),
        chat_body(choices=[{"index": 0, "message": "hello", "finish_reason": "stop"}]),
        chat_body(choices=[{"index": 0, "message": {"content": "x"}, "finish_reason": 7}]),
        b"[" * 100_000 + b"]" * 100_000,
        b'{"choices": [{"index": 0, "message": {"content": "x"}}]' + b" " * 10,
        b"\xff\xfe" + "{}".encode("utf-16-le"),
        b'{"error": {"message": "served as 200"}}',
    ],
    ids=[
        "list",
        "string",
        "null",
        "choices-string",
        "no-choices",
        "choice-string",
        "only-choice-1",
        "content-number",
        "content-parts",
        "message-string",
        "finish-number",
        "deep-nesting",
        "truncated",
        "utf16",
        "error-as-200",
    ],
)
async def test_a_malformed_answer_is_retried_then_the_good_one_read(upstream: FaultUpstream, body: bytes) -> None:
    upstream.script(raw(200, body))
    async with backend_for(upstream) as backend:
        gen = await backend.generate(CHAT)
    assert gen.text == TEXT
    assert len(upstream.requests) == 2


@pytest.mark.slow
async def test_only_choice_zero_is_read_however_many_are_sent(upstream: FaultUpstream) -> None:
    others = [{"index": i, "message": {"content": f"other {i}"}, "finish_reason": "stop"} for i in range(1, 20_000)]
    mine = {"index": 0, "message": {"content": TEXT}, "finish_reason": "stop"}
    upstream.script(raw(200, chat_body(choices=[*others, mine])))
    async with backend_for(upstream) as backend:
        gen = await backend.generate(CHAT)
    assert gen.text == TEXT


async def test_interleaved_stream_choices_do_not_mix(upstream: FaultUpstream) -> None:
    events = []
    for t in TOKENS:
        events += [chat_chunk(t), chat_chunk("NOISE", index=1)]
    upstream.script(sse(*events, chat_chunk(finish="stop")))
    async with backend_for(upstream, logprobs=False) as backend:
        pieces, gen = await collect(backend, CHAT)
    assert pieces == list(TOKENS) and gen.text == TEXT


@pytest.mark.parametrize(
    "logprobs",
    [
        {"content": [{"token": "x", "logprob": float("nan")}]},
        {"content": [{"token": "x", "logprob": float("-inf")}]},
        {"content": [{"token": "x", "logprob": 3.5}]},
        {"content": [{"token": "x", "logprob": "-0.1"}]},
        {"content": "all of them"},
        "yes",
    ],
    ids=["nan", "-inf", "positive", "string", "content-string", "text"],
)
async def test_impossible_logprobs_are_dropped_and_the_text_kept(upstream: FaultUpstream, logprobs: Any) -> None:
    body = json.loads(chat_body())
    body["choices"][0]["logprobs"] = logprobs
    upstream.script(raw(200, json.dumps(body).encode()))  # json.dumps writes NaN and -Infinity
    async with backend_for(upstream) as backend:
        gen = await backend.generate(CHAT)
    assert gen.text == TEXT and gen.token_logprobs is None


async def test_text_that_is_not_unicode_is_replaced_not_fatal(upstream: FaultUpstream) -> None:
    upstream.script(
        raw(200, chat_body("ok \ud800 then").replace(b"then", b"th\xffen")),
        sse(
            b"data: " + json.dumps(chat_chunk("caf\udce9")).encode() + b"\n\n",
            b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "\xe9t\xc3\xa9"}}]}\n\n',
            chat_chunk(finish="stop"),
        ),
    )
    async with backend_for(upstream, logprobs=False) as backend:
        plain = await backend.generate(CHAT)
        _, streamed = await collect(backend, CHAT)
    assert plain.text == "ok \ufffd th\ufffden"
    assert streamed.text == "caf\ufffd\ufffdt\u00e9"
    for text in (plain.text, streamed.text):
        text.encode("utf-8")  # no lone surrogate survives


async def test_a_hostile_model_name_is_not_passed_on(upstream: FaultUpstream) -> None:
    upstream.script(raw(200, chat_body(model="x" * 100_000)), raw(200, chat_body(model="evil\r\nSet-Cookie: a=b")))
    async with backend_for(upstream) as backend:
        assert (await backend.generate(CHAT)).model == "fake-large"
        assert (await backend.generate(CHAT)).model == "fake-large"


@pytest.mark.parametrize(
    "event",
    [
        "not json",
        "[1, 2]",
        json.dumps({"choices": "x"}),
        json.dumps({"choices": [{"index": 0, "delta": "x"}]}),
        json.dumps({"error": {"message": LEAKY}}),
    ],
    ids=["not-json", "list", "choices-string", "delta-string", "error-event"],
)
async def test_a_bad_stream_event_before_text_is_retried_and_after_text_fails(
    upstream: FaultUpstream, event: str
) -> None:
    upstream.script(sse(event), sse(chat_chunk("Hi"), event))
    async with backend_for(upstream, logprobs=False) as backend:
        with pytest.raises(UpstreamError) as info:
            await collect(backend, CHAT)
    assert SECRET not in str(info.value)
    assert len(upstream.requests) == 2  # the first retried; the second broke after text


async def test_crlf_framing_comments_and_other_fields_are_read(upstream: FaultUpstream) -> None:
    body = b": keep-alive\r\n\r\nevent: message\r\nid: 1\r\n"
    events = [b"data: " + json.dumps(chat_chunk(t)).encode() + b"\r\n\r\n" for t in TOKENS]
    upstream.script(sse(body, *events, chat_chunk(finish="stop"), newline=b"\r\n"))
    async with backend_for(upstream, logprobs=False) as backend:
        pieces, gen = await collect(backend, CHAT)
    assert pieces == list(TOKENS) and gen.finish_reason == "stop"


async def test_after_all_of_it_the_backend_still_answers(upstream: FaultUpstream) -> None:
    upstream.script(oversized(LIMIT * 2, declare=False), raw(200, b"[" * 50_000), ok())
    async with backend_for(upstream, max_response_bytes=LIMIT, max_attempts=1) as backend:
        for _ in range(2):
            with pytest.raises(UpstreamError):
                await backend.generate(CHAT)
        assert (await backend.generate(CHAT)).text == TEXT


async def test_an_environment_proxy_is_used_and_its_answers_are_capped_too(
    upstream: FaultUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{upstream.port}")
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{upstream.port}")
    upstream.script(ok(), oversized(LIMIT * 2, declare=False))
    settings = OpenAIBackendSettings(
        base_url="http://upstream.invalid/v1", model="fake-large", max_attempts=1, max_response_bytes=LIMIT
    )
    backend = OpenAIBackend("large", settings, timeout_s=5)
    await backend.start()
    try:
        assert (await backend.generate(CHAT)).text == TEXT
        with pytest.raises(UpstreamError, match="refused"):
            await backend.generate(CHAT)
    finally:
        await backend.close()
    assert upstream.requests[0].path == "http://upstream.invalid/v1/chat/completions"  # sent through the proxy


@pytest.mark.slow
async def test_a_body_that_stalls_mid_way_is_bounded_by_the_deadline(upstream: FaultUpstream) -> None:
    upstream.script(stalled_body())
    async with backend_for(upstream) as backend:
        started = time.monotonic()
        with pytest.raises(DeadlineError):
            await backend.generate(CHAT.with_(deadline=time.monotonic() + 0.5))
        assert time.monotonic() - started < 1.0
    assert len(upstream.requests) == 1


async def test_a_header_flood_is_a_failed_attempt(upstream: FaultUpstream) -> None:
    upstream.script(raw(200, chat_body(), headers={"X-Junk": "a" * 200_000}))
    async with backend_for(upstream) as backend:
        gen = await backend.generate(CHAT)
    assert gen.text == TEXT
    assert len(upstream.requests) == 2


async def test_a_number_too_long_to_convert_is_a_malformed_answer(upstream: FaultUpstream) -> None:
    body = chat_body(usage={"prompt_tokens": 7, "completion_tokens": 4}).replace(
        b'"prompt_tokens": 7', b'"prompt_tokens": 1' + b"0" * 5000
    )
    upstream.script(raw(200, body))
    async with backend_for(upstream) as backend:
        gen = await backend.generate(CHAT)
    assert (gen.text, gen.prompt_tokens) == (TEXT, PROMPT_TOKENS)
    assert len(upstream.requests) == 2


async def test_n_choices_without_usage_are_each_counted(upstream: FaultUpstream) -> None:
    # A server that reports no usage: every choice is estimated and billed, not choice 0 alone
    # (which under-billed an `n: 8` request about eightfold).
    long = "word " * 200
    choices = [
        {"index": i, "message": {"content": TEXT if i == 0 else long}, "finish_reason": "stop"} for i in range(3)
    ]
    upstream.script(raw(200, chat_body(choices=choices, usage=None)))
    async with backend_for(upstream, logprobs=False) as backend:
        gen = await backend.generate(CHAT.with_(n=3, max_tokens=512))
    assert len(gen.others) == 2
    each = gen.others[0].completion_tokens
    assert each > 100  # 200 words, estimated
    assert gen.completion_tokens >= 2 * each  # the two long choices are in the request's count
