"""Each guard action from outside, on a served `tierroute serve` (tests/support/guards.py: a local
SmolLM2 tier under a remote recording upstream, guards scoped per key): block's 400 in each
surface's shape naming the kind and not the data; redact's placeholders and their restoration in
the answer; keep_local's note when the local tier rejected, and its refusal when configured; the
output check on an answer the model produced, plain and streamed; the `tierroute` object and
/metrics saying which guard acted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.fault_upstream import FaultUpstream, ok
from tests.support.guards import guard_stages, served_config
from tests.support.servers import serve_process

ROOT = Path(__file__).resolve().parents[3]
EMAIL = "maria.lopez.77@example.com"
KEY = "sk-proj-" + "Ab3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5oQ7s"
REFUSE = '\n[[stages]]\nname = "pii"\nparams = { action = "keep_local", on_local_reject = "refuse", keys = ["log"], label = "pii_strict" }\n'


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, smol_path: Path
) -> Iterator[tuple[str, dict[str, str], FaultUpstream]]:
    tmp = tmp_path_factory.mktemp("actions")
    with FaultUpstream() as upstream:
        # the `log` key's personal-data guard is the strict keep_local one here
        stages = guard_stages().replace(
            '\n[[stages]]\nname = "pii"\nparams = { action = "log_only", keys = ["log"], label = "pii_log" }\n', ""
        )
        cfg, keys = served_config(tmp, upstream.base_url, stages=stages + REFUSE)
        with serve_process(cfg, log_path=tmp / "serve.log", env={"PYTHONPATH": str(ROOT)}) as (_, url, _):
            yield url, keys, upstream


def _chat(url: str, key: str, content: str, *, model: str = "auto", stream: bool = False) -> httpx.Response:
    body = {
        "model": model,
        "max_tokens": 4,
        "temperature": 0,
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=120)


def _streamed_text(raw: str) -> tuple[str, dict]:  # type: ignore[type-arg]
    text, ext = "", {}
    for line in raw.splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            for c in chunk.get("choices", []):
                text += c.get("delta", {}).get("content") or ""
            ext = chunk.get("tierroute") or ext
    return text, ext


def test_block_refuses_in_each_surfaces_shape_naming_the_kind_not_the_data(served) -> None:  # type: ignore[no-untyped-def]
    url, keys, upstream = served
    before = len(upstream.requests)
    r = _chat(url, keys["block"], f"write to {EMAIL}")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "refused_by_pii_block" and "EMAIL_ADDRESS" in err["message"]
    assert EMAIL not in r.text
    r = httpx.post(
        f"{url}/v1/messages",
        json={"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": f"my key is {KEY}"}]},
        headers={"x-api-key": keys["block"], "anthropic-version": "2023-06-01"},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "OPENAI_API_KEY" in r.json()["error"]["message"] and KEY not in r.text
    # a clean request of the same key goes through
    assert _chat(url, keys["block"], "Say ok.").status_code == 200
    assert len(upstream.requests) == before + 1  # only the clean one escalated


def test_redact_sends_placeholders_and_restores_them_in_the_answer(served) -> None:  # type: ignore[no-untyped-def]
    url, keys, upstream = served
    upstream.script(ok(("I will write to ", "<EMAIL_ADDRESS_1>", " today.")))
    r = _chat(url, keys["redact"], f"Please email {EMAIL} and {EMAIL} again.", model="large")
    assert r.status_code == 200, r.text
    sent = upstream.requests[-1].body["messages"][-1]["content"]
    assert sent == "Please email <EMAIL_ADDRESS_1> and <EMAIL_ADDRESS_1> again."  # one value, one placeholder
    body = r.json()
    assert body["choices"][0]["message"]["content"] == f"I will write to {EMAIL} today."
    note = body["tierroute"]["stages"]["pii_redact"]
    assert (
        note["action"] == "redact"
        and note["found"] == {"EMAIL_ADDRESS": 2}
        and note["restored"] == {"EMAIL_ADDRESS": 1}
    )
    assert EMAIL not in json.dumps(note)


def test_keep_local_notes_a_local_rejection_or_refuses_as_configured(served) -> None:  # type: ignore[no-untyped-def]
    url, keys, upstream = served
    before = len(upstream.requests)
    r = _chat(url, keys["keep"], f"My email is {EMAIL}. Say ok.", stream=True)
    assert r.status_code == 200
    _, ext = _streamed_text(r.text)
    note = ext["stages"]["pii_keep"]
    assert note["action"] == "keep_local" and note["tiers"] == ["small"] and note["local_rejected"] is True
    assert ext["tier"] == "small"
    # the `log` key's guard refuses instead: the answer is withheld, and nothing went up either
    r = _chat(url, keys["log"], f"My email is {EMAIL}. Say ok.")
    assert r.status_code == 400 and r.json()["error"]["code"] == "refused_by_pii_strict", r.text
    assert len(upstream.requests) == before


def test_output_check_redacts_an_answer_the_model_wrote_plain_and_streamed(served) -> None:  # type: ignore[no-untyped-def]
    url, keys, upstream = served
    leaked = "john.smith.42@example.org"
    for stream in (False, True):
        upstream.script(ok(("Contact ", leaked, " or call 415-555-2671.")))
        r = _chat(url, keys["out"], "Who do I contact?", model="large", stream=stream)
        assert r.status_code == 200, r.text
        if stream:
            text, ext = _streamed_text(r.text)
        else:
            text, ext = r.json()["choices"][0]["message"]["content"], r.json()["tierroute"]
        assert leaked not in r.text and "415-555-2671" not in r.text
        assert text == "Contact <EMAIL_ADDRESS> or call <PHONE_NUMBER>."
        assert ext["stages"]["pii_out"]["answer"] == {
            "action": "redact",
            "found": {"EMAIL_ADDRESS": 1, "PHONE_NUMBER": 1},
        }
    metrics = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {keys['admin']}"}).text
    assert (
        'tierroute_stage_actions_total{action="redact",kind="EMAIL_ADDRESS",stage="pii_out",where="answer"} 2.0'
        in metrics
    )
    assert 'stage="pii_block"' in metrics and 'action="restore"' in metrics
