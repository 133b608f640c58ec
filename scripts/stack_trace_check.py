"""Check one traced request of the compose stack against what its client was told (`make stack-test`).

    python3 scripts/stack_trace_check.py RESPONSE.json SPANS.jsonl TRACEPARENT

RESPONSE.json is the chat completion the client got, SPANS.jsonl what the stack's OTLP receiver
wrote (tests/support/otlp_receiver.py: one JSON line per span), TRACEPARENT the header the client
sent. The request must be one trace, the client's: its server span a child of the client's span,
and under it a span per tier attempt the response's `tierroute` object lists, each with that
attempt's tokens and cost, a `verify {name}` span per verifier score it lists (same score, or
abstained), a decision per attempt, an upstream call per attempt of an OpenAI-compatible tier,
and the ledger write; the server span's totals are the response's. Prints what it found; exits 1
with every mismatch listed.

Standard library only: it runs on the host, outside the images.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

Span = dict[str, Any]


def close(a: object, b: object) -> bool:
    """Equal, as floats to a relative 1e-9 (the costs are the same float, sent through protobuf)."""
    if not isinstance(a, int | float) or not isinstance(b, int | float):
        return False
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-15)


def check(reply: dict[str, Any], spans: list[Span], traceparent: str) -> tuple[list[str], list[str]]:
    """(what was found, what is wrong) for `reply`'s request among `spans`."""
    found: list[str] = []
    wrong: list[str] = []
    _, trace_id, parent_id, _ = traceparent.split("-")
    tr = reply["tierroute"]
    servers = [
        s
        for s in spans
        if s["kind"] == 2 and s["attributes"].get("tierroute.request_id") == tr["request_id"]  # 2: SERVER
    ]
    if len(servers) != 1:
        return found, [f"{len(servers)} server spans carry request id {tr['request_id']}, not 1"]
    server = servers[0]
    if server["trace_id"] != trace_id or server["parent_span_id"] != parent_id:
        wrong.append(f"server span in trace {server['trace_id']} under {server['parent_span_id']}: not the client's")
    trace = [s for s in spans if s["trace_id"] == server["trace_id"]]
    found.append(f"trace {server['trace_id']} (the client's: {server['trace_id'] == trace_id}): {len(trace)} spans")
    children: dict[str | None, list[Span]] = {}
    for s in trace:
        children.setdefault(s["parent_span_id"], []).append(s)

    # the server span's totals are the response's
    attempts = tr["attempts"]
    sa = server["attributes"]
    expect = {
        "tierroute.tiers_tried": [a["tier"] for a in attempts],
        "tierroute.final_tier": tr["tier"],
        "tierroute.escalated": tr["escalated"],
        "gen_ai.usage.input_tokens": sum(a["prompt_tokens"] for a in attempts),
        "gen_ai.usage.output_tokens": sum(a["completion_tokens"] for a in attempts),
    }
    for key, want in expect.items():
        if sa.get(key) != want:
            wrong.append(f"server span {key} = {sa.get(key)!r}, the response says {want!r}")
    if not close(sa.get("tierroute.cost_usd"), tr["cost_usd"]):
        wrong.append(f"server span cost {sa.get('tierroute.cost_usd')!r}, the response says {tr['cost_usd']!r}")

    under_server = children.get(server["span_id"], [])
    attempt_spans = [s for s in under_server if s["attributes"].get("gen_ai.operation.name")]
    if len(attempt_spans) != len(attempts):
        wrong.append(f"{len(attempt_spans)} attempt spans under the server span for {len(attempts)} attempts")
    for attempt, span in zip(attempts, sorted(attempt_spans, key=lambda s: s["start_ns"]), strict=False):
        wrong += _attempt(attempt, span, children.get(span["span_id"], []), found)
    ledger = [s for s in under_server if s["name"] == "tierroute.ledger.write"]
    if len(ledger) != 1:
        wrong.append(f"{len(ledger)} ledger write spans under the server span, not 1")
    else:
        found.append("tierroute.ledger.write")
    return found, wrong


def _attempt(attempt: dict[str, Any], span: Span, under: list[Span], found: list[str]) -> list[str]:
    wrong = []
    tier, a = attempt["tier"], span["attributes"]
    if a.get("gen_ai.request.model") != tier:
        return [f"attempt span {span['name']!r} for tier {tier!r}: out of order or missing"]
    pairs = (
        ("gen_ai.usage.input_tokens", attempt["prompt_tokens"]),
        ("gen_ai.usage.output_tokens", attempt["completion_tokens"]),
    )
    wrong += [f"{span['name']}: {k} = {a.get(k)!r}, the response says {v!r}" for k, v in pairs if a.get(k) != v]
    for key, field in (("tierroute.cost_usd", "cost_usd"), ("tierroute.verifier_cost_usd", "verifier_cost_usd")):
        if not close(a.get(key), attempt[field]):
            wrong.append(f"{span['name']}: {key} = {a.get(key)!r}, the response says {attempt[field]!r}")
    if a.get("tierroute.accepted") != attempt["accepted"]:
        wrong.append(
            f"{span['name']}: accepted {a.get('tierroute.accepted')!r}, the response says {attempt['accepted']}"
        )
    found.append(
        f"{span['name']}: {a.get('gen_ai.usage.input_tokens')} in, {a.get('gen_ai.usage.output_tokens')} out, "
        f"${a.get('tierroute.cost_usd')}, accepted {a.get('tierroute.accepted')}"
    )
    verifies = {s["name"].removeprefix("verify "): s for s in under if s["name"].startswith("verify ")}
    for name, score in attempt["scores"].items():
        vs = verifies.get(name)
        if vs is None:
            wrong.append(f"{span['name']}: no span for verifier {name!r}")
            continue
        got = vs["attributes"].get("gen_ai.evaluation.score.value")
        want = score["score"]
        if want is None:
            ok = vs["attributes"].get("tierroute.verifier.abstained") is True
        else:  # the response rounds scores to 6 places
            ok = isinstance(got, int | float) and close(round(got, 6), want)
        if not ok:
            wrong.append(f"{span['name']}: verify {name} score {got!r}, the response says {want!r}")
        found.append(f"  verify {name}: {got}")
    if sorted(verifies) != sorted(attempt["scores"]):
        wrong.append(
            f"{span['name']}: verifier spans {sorted(verifies)}, the response lists {sorted(attempt['scores'])}"
        )
    decisions = [s for s in under if s["name"] == "tierroute.decision"]
    if len(decisions) != 1:
        wrong.append(f"{span['name']}: {len(decisions)} decision spans, not 1")
    else:
        found.append(f"  tierroute.decision: {decisions[0]['attributes'].get('tierroute.decision')}")
    if a.get("gen_ai.provider.name") == "openai":
        calls = [s for s in under if s["kind"] == 3]  # 3: CLIENT
        if len(calls) != 1:
            wrong.append(f"{span['name']}: {len(calls)} upstream call spans, not 1")
        else:
            found.append(
                f"  {calls[0]['name']}: {calls[0]['attributes'].get('tierroute.upstream.attempts')} attempt(s)"
            )
    return wrong


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    reply = json.loads(Path(argv[0]).read_text())
    spans = [json.loads(line) for line in Path(argv[1]).read_text().splitlines() if line.strip()]
    found, wrong = check(reply, spans, argv[2])
    print("\n".join(found))
    for w in wrong:
        print(f"mismatch: {w}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
