"""POST /v1/messages as the official `anthropic` package uses it: `messages.create`,
`messages.stream` (`text_stream` and `get_final_message()`), a tool-use round trip with
`tool_result`, and `messages.count_tokens`, each through `auto` against a served router (SmolLM2
for text, scripted tool-calling tiers for tools: tests/support/surfaces.py)."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.support.accounting import MARK, read_ledger
from tests.support.servers import UvicornThread
from tests.support.surfaces import ANTHROPIC_WEATHER, CAPITAL, QUESTION, assert_no_pending, ledger_of


def client(srv: UvicornThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)


def test_create_escalates_and_is_recorded_as_a_messages_request(smol: UvicornThread) -> None:
    raw = client(smol).messages.with_raw_response.create(
        model="auto",
        max_tokens=48,
        system="Answer in one short sentence.",
        messages=[{"role": "user", "content": [{"type": "text", "text": f"{MARK} {CAPITAL}"}]}],
    )
    m = raw.parse()
    assert raw.headers["x-tierroute-escalated"] == "true"
    assert m.type == "message" and m.role == "assistant" and m.model == "large"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.input_tokens > 0
    ext = m.model_extra["tierroute"]  # type: ignore[index]
    assert ext["request_id"] == m.id and [a["tier"] for a in ext["attempts"]] == ["small", "large"]
    entry = read_ledger(ledger_of(smol))[m.id]
    assert entry.surface == "messages" and entry.escalated and entry.cost_usd == ext["cost_usd"]
    assert m.usage.output_tokens == entry.attempts[-1].completion_tokens


def test_stream_text_and_final_message(smol: UvicornThread) -> None:
    with client(smol).messages.stream(
        model="auto", max_tokens=48, messages=[{"role": "user", "content": CAPITAL}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        tier = stream.response.headers["x-tierroute-tier"]
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0 and tier == "small"


def test_tool_use_round_trip(tools: UvicornThread) -> None:
    c = client(tools)
    turn = [{"role": "user", "content": QUESTION}]
    first = c.messages.create(model="auto", max_tokens=64, messages=turn, tools=[ANTHROPIC_WEATHER])  # type: ignore[arg-type, list-item]
    (use,) = first.content
    assert first.stop_reason == "tool_use" and use.type == "tool_use" and use.name == "get_weather"
    assert use.input == {"city": "Paris"}
    assert first.model_extra["tierroute"]["escalated"]  # type: ignore[index]
    history = [
        *turn,
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C"}]},
    ]
    second = c.messages.create(model="auto", max_tokens=64, messages=history, tools=[ANTHROPIC_WEATHER])  # type: ignore[arg-type, list-item]
    assert second.content[0].type == "text" and second.content[0].text == "It is 21 C in Paris."
    with c.messages.stream(model="auto", max_tokens=64, messages=turn, tools=[ANTHROPIC_WEATHER]) as stream:  # type: ignore[arg-type, list-item]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].input == {"city": "Paris"}  # type: ignore[union-attr]


def test_count_tokens_and_the_x_api_key_header(smol: UvicornThread) -> None:
    counted = client(smol).messages.count_tokens(model="small", messages=[{"role": "user", "content": CAPITAL}])
    m = client(smol).messages.create(model="small", max_tokens=8, messages=[{"role": "user", "content": CAPITAL}])
    assert counted.input_tokens == m.usage.input_tokens  # the local tier's own template and tokenizer
    r = httpx.post(f"{smol.url}/v1/messages/count_tokens", json={"model": "small", "messages": []})
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_a_stream_a_tier_refuses_leaves_no_pending_row(smol: UvicornThread) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        client(smol).messages.create(
            model="small", max_tokens=8, messages=[{"role": "user", "content": "word " * 3000}], stream=True
        )
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert_no_pending(ledger_of(smol))
