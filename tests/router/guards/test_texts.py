"""The places of a request a guard reads and rewrites (router.guards.texts): JSON stays JSON, a
value split over two messages is found in the joined text and redacted in both parts."""

from __future__ import annotations

import json

from router.generation import GenerationRequest, Message, ToolCall, ToolSpec
from router.guards.normalise import scan
from router.guards.redaction import Redaction, replaced
from router.guards.secrets import SecretsDetector
from router.guards.texts import Places, rewritten

KEY = "AKIAIOSFODNN7EXAMPLE"


def test_every_place_is_read_and_json_is_rewritten_as_json() -> None:
    request = GenerationRequest(
        messages=(
            Message("system", f"ops key {KEY}"),
            Message("assistant", "", tool_calls=(ToolCall("c1", "f", json.dumps({"k": KEY, "n": 1})),)),
            Message("tool", f"got {KEY}", tool_call_id="c1"),
        ),
        tools=(ToolSpec("f", f"uses {KEY}", json.dumps({"type": "object", "description": KEY})),),
    )
    places = Places(request)
    found = scan(places.joined, SecretsDetector().detect)
    assert len(found) == 5
    edits: dict[int, list[tuple[int, int, str]]] = {}
    for f in found:
        for i, s, e in places.split(f.start, f.end):
            edits.setdefault(i, []).append((s, e, "<K>"))
    new = rewritten(request, {places.items[i].where: replaced(places.items[i].text, sp) for i, sp in edits.items()})
    assert KEY not in repr(new)
    assert json.loads(new.messages[1].tool_calls[0].arguments) == {"k": "<K>", "n": 1}  # type: ignore[index]
    assert json.loads(new.tools[0].parameters_json or "")["description"] == "<K>"


def test_a_card_split_over_two_messages_is_found_and_both_parts_replaced() -> None:
    from router.guards.pii import PiiDetector

    request = GenerationRequest(messages=(Message("user", "my card is 4111 1111"), Message("user", "1111 1111 thanks")))
    places = Places(request)
    found = scan(places.joined, PiiDetector(frozenset({"CREDIT_CARD"})).detect)
    assert [f.kind for f in found] == ["CREDIT_CARD"]
    assert [(i, places.items[i].text[s:e]) for i, s, e in places.split(found[0].start, found[0].end)] == [
        (0, "4111 1111"),
        (1, "1111 1111"),
    ]


def test_the_same_value_is_the_same_placeholder_and_restores() -> None:
    r = Redaction()
    a, b, c = (
        r.placeholder("EMAIL_ADDRESS", "x@y.com"),
        r.placeholder("EMAIL_ADDRESS", "z@y.com"),
        r.placeholder("EMAIL_ADDRESS", "x@y.com"),
    )
    assert (a, b, c) == ("<EMAIL_ADDRESS_1>", "<EMAIL_ADDRESS_2>", "<EMAIL_ADDRESS_1>")
    text, n = r.restore("to <EMAIL_ADDRESS_1>, cc EMAIL_ADDRESS_2 and [EMAIL_ADDRESS_1]")
    assert text == "to x@y.com, cc z@y.com and x@y.com" and n["EMAIL_ADDRESS"] == 3
