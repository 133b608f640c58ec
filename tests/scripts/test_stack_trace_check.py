"""scripts/stack_trace_check.py, the stack test's check of one traced request: it passes the trace
of an escalated request as the receiver writes it, and names each way a trace can disagree with
the response (another trace, a missing verifier, tokens or cost off, a span too few). A served
process's real spans pass it too (tests/router/telemetry/test_otlp_export.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scripts.stack_trace_check import check

TRACE, CLIENT_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE}-{CLIENT_SPAN}-01"


def attempt(tier: str, accepted: bool, tokens: tuple[int, int], cost: float, scores: dict[str, Any]) -> dict[str, Any]:
    return {
        "tier": tier,
        "accepted": accepted,
        "prompt_tokens": tokens[0],
        "completion_tokens": tokens[1],
        "cost_usd": cost,
        "verifier_cost_usd": 0.0,
        "scores": {name: {"score": value, "reason": "", "details": {}} for name, value in scores.items()},
    }


REPLY = {
    "tierroute": {
        "request_id": "chatcmpl-1",
        "tier": "large",
        "escalated": True,
        "cost_usd": 3.1e-05,
        "attempts": [
            attempt("small", False, (40, 16), 1.0e-06, {"code_tests": 0.0, "degeneration": None}),
            attempt("large", True, (40, 12), 3.0e-05, {"code_tests": 0.0}),
        ],
    }
}


def span(name: str, sid: str, parent: str | None, kind: int = 1, **attributes: Any) -> dict[str, Any]:
    return {
        "trace_id": TRACE,
        "span_id": sid,
        "parent_span_id": parent,
        "name": name,
        "kind": kind,
        "start_ns": int(sid, 16),
        "attributes": attributes,
    }


def trace() -> list[dict[str, Any]]:
    """The spans the receiver wrote for REPLY's request."""
    tiers = REPLY["tierroute"]
    out = [
        span(
            "POST /v1/chat/completions",
            "01",
            CLIENT_SPAN,
            kind=2,
            **{
                "tierroute.request_id": "chatcmpl-1",
                "tierroute.tiers_tried": ["small", "large"],
                "tierroute.final_tier": "large",
                "tierroute.escalated": True,
                "tierroute.cost_usd": 3.1e-05,
                "gen_ai.usage.input_tokens": 80,
                "gen_ai.usage.output_tokens": 28,
            },
        )
    ]
    for i, a in enumerate(tiers["attempts"]):
        sid = f"{i + 2:02x}"
        backend = "llamacpp" if a["tier"] == "small" else "openai"
        out.append(
            span(
                f"chat {a['tier']}",
                sid,
                "01",
                **{
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": a["tier"],
                    "gen_ai.provider.name": backend,
                    "gen_ai.usage.input_tokens": a["prompt_tokens"],
                    "gen_ai.usage.output_tokens": a["completion_tokens"],
                    "tierroute.cost_usd": a["cost_usd"],
                    "tierroute.verifier_cost_usd": 0.0,
                    "tierroute.accepted": a["accepted"],
                },
            )
        )
        for j, (name, score) in enumerate(a["scores"].items()):
            value = {"tierroute.verifier.abstained": True} if score["score"] is None else {}
            if score["score"] is not None:
                value["gen_ai.evaluation.score.value"] = score["score"]
            out.append(span(f"verify {name}", f"{sid}{j}0", sid, **value))
        out.append(span("tierroute.decision", f"{sid}f0", sid, **{"tierroute.decision": "x"}))
        if backend == "openai":
            out.append(span("POST large", f"{sid}e0", sid, kind=3, **{"tierroute.upstream.attempts": 1}))
    out.append(span("tierroute.ledger.write", "ff", "01"))
    return out


def test_the_trace_of_an_escalated_request_passes() -> None:
    found, wrong = check(REPLY, trace(), TRACEPARENT)
    assert wrong == []
    assert "chat small: 40 in, 16 out, $1e-06, accepted False" in found
    assert "  verify degeneration: None" in found


def drop(name: str, parent: str) -> list[dict[str, Any]]:
    return [s for s in trace() if not (s["name"] == name and s["parent_span_id"] == parent)]


def retrace(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for s in spans:
        s["trace_id"] = "1" * 32
    return spans


def changed(spans: list[dict[str, Any]], name: str, key: str, value: Any) -> list[dict[str, Any]]:
    for s in spans:
        if s["name"] == name:
            s["attributes"][key] = value
    return spans


@pytest.mark.parametrize(
    ("spans", "says"),
    [
        (retrace(trace()), "not the client's"),
        (drop("verify degeneration", "02"), "no span for verifier 'degeneration'"),
        (drop("chat large", "01"), "1 attempt spans under the server span for 2 attempts"),
        (drop("tierroute.ledger.write", "01"), "0 ledger write spans"),
        (drop("tierroute.decision", "03"), "chat large: 0 decision spans"),
        (drop("POST large", "03"), "chat large: 0 upstream call spans"),
        (changed(trace(), "chat small", "gen_ai.usage.output_tokens", 15), "output_tokens = 15"),
        (changed(trace(), "chat large", "tierroute.cost_usd", 3.0e-04), "tierroute.cost_usd = 0.0003"),
        (changed(trace(), "verify code_tests", "gen_ai.evaluation.score.value", 0.5), "verify code_tests score 0.5"),
        (changed(trace(), "POST /v1/chat/completions", "tierroute.cost_usd", 0.0), "server span cost 0.0"),
        (
            changed(trace(), "POST /v1/chat/completions", "tierroute.tiers_tried", ["large"]),
            "tierroute.tiers_tried = ['large']",
        ),
        ([], "0 server spans"),
    ],
)
def test_each_disagreement_is_named(spans: list[dict[str, Any]], says: str) -> None:
    _, wrong = check(copy.deepcopy(REPLY), spans, TRACEPARENT)
    assert any(says in w for w in wrong), wrong
