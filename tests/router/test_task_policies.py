"""One service, mixed traffic: each request judged by its tier's policy for its detected task, end to
end through the official client against a real server with the real SmolLM2 model; the task and
why in the `tierroute` object, the ledger and /metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from router.api.app import create_app
from router.config import load_settings
from tests.support.accounting import read_ledger
from tests.support.config import smol_config
from tests.support.metrics import samples, value
from tests.support.servers import UvicornThread

# The small tier's own policy can never pass (mean confidence is below 1): every task without a
# policy of its own escalates. Open-ended requests are judged by degeneration alone and accepted
# whatever it finds (threshold 0); structured ones are accepted unverified.
POLICIES = """
[[tiers.verifiers]]
name = "confidence"
[tiers.tasks.open_ended]
threshold = 0.0
[[tiers.tasks.open_ended.verifiers]]
name = "degeneration"
[tiers.tasks.structured]
verifiers = []
"""
CHOICE = "Which planet is closest to the Sun?\nA. Venus\nB. Mercury\nC. Earth\nD. Mars"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Iterator[tuple[UvicornThread, Path]]:
    tmp = tmp_path_factory.mktemp("tasks")
    cfg = smol_config(tmp, threshold=1.0, verifiers=POLICIES)
    with UvicornThread(create_app(load_settings(cfg))) as srv:
        yield srv, tmp / "ledger.sqlite3"


@pytest.fixture(scope="module")
def client(served: tuple[UvicornThread, Path]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served[0].url}/v1", api_key="unused", max_retries=0)


def ask(client: openai.OpenAI, text: str, **extra: object) -> dict:
    r = client.chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": text}],
        max_tokens=16,
        **extra,  # type: ignore[arg-type]
    )
    return r.model_extra["tierroute"]


def test_each_task_is_judged_by_its_own_policy(client: openai.OpenAI, served: tuple[UvicornThread, Path]) -> None:
    chat = ask(client, "Write a haiku about autumn rain.")
    # no rule claims a haiku; the committed classifier (on by default) is sure it is open-ended
    assert chat["task"] == "open_ended" and chat["task_why"].startswith("classifier ")
    assert chat["tier"] == "small" and not chat["escalated"]
    first = chat["attempts"][0]
    assert first["threshold"] == 0.0 and list(first["scores"]) == ["degeneration"]

    choice = ask(client, CHOICE)
    assert (choice["task"], choice["task_why"]) == ("choice", "option list A-D")
    assert choice["tier"] == "large" and choice["escalated"]
    first = choice["attempts"][0]
    assert first["threshold"] == 1.0 and list(first["scores"]) == ["confidence"]  # the tier's own

    structured = ask(client, CHOICE, response_format={"type": "json_object"})
    assert (structured["task"], structured["task_why"]) == ("structured", "response_format json_object")
    assert structured["tier"] == "small" and structured["attempts"][0]["reason"] == "no verifiers"

    # a forced tier reports the task too
    forced = client.chat.completions.create(model="large", messages=[{"role": "user", "content": CHOICE}], max_tokens=4)
    assert forced.model_extra["tierroute"]["task"] == "choice"

    entries = sorted(read_ledger(served[1]).values(), key=lambda e: e.ts)
    assert [(e.task, e.tier) for e in entries] == [
        ("open_ended", "small"),
        ("choice", "large"),
        ("structured", "small"),
        ("choice", "large"),
    ]
    assert entries[1].task_why == "option list A-D"

    m = samples(httpx.get(f"{served[0].url}/metrics").text)
    assert value(m, "tierroute_requests_total", task="open_ended", tier="small", outcome="accepted") == 1
    assert value(m, "tierroute_requests_total", task="choice", tier="large") == 2
    assert value(m, "tierroute_requests_total", task="structured") == 1


def test_a_streamed_answer_carries_its_task(served: tuple[UvicornThread, Path]) -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "What is 12 * 7?"}], "max_tokens": 8}
    with httpx.stream("POST", f"{served[0].url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    ext = events[-1]["tierroute"]
    assert (ext["task"], ext["task_why"], ext["tier"]) == ("maths", "arithmetic expression", "large")


def test_a_malformed_response_format_is_a_400(served: tuple[UvicornThread, Path]) -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "yaml"}}
    r = httpx.post(f"{served[0].url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
