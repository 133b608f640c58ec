"""POST /v1/feedback through the real app: a key labels its own requests only (an admin key any
request), an unknown and a foreign request get the same 404, bad bodies get OpenAI-shaped 400s, and every label is kept in
the order it arrived, in the ledger file, tied to its request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from router.api.routes_feedback import MAX_LABELS_PER_REQUEST
from router.backends.instant import InstantBackend
from router.ledger.store import SQLiteStore
from tests.support.accounting import MARK, auth, chat, config_with_keys, running, tierroute_of

pytestmark = pytest.mark.slow  # an app with its ledger, in process

BACKENDS = {"small": InstantBackend("small", "4"), "large": InstantBackend("large", "4")}


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Any, dict[str, str], Path]]:
    cfg, keys = config_with_keys(
        tmp_path,
        {"alice": {"roles": ["client", "metrics"]}, "bob": {}, "root": {"roles": ["admin"]}},
        verifiers='[[tiers.verifiers]]\nname = "escalate_marked"\n',
    )
    async with running(cfg, backends=dict(BACKENDS)) as client:
        yield client, keys, tmp_path / "ledger.sqlite3"


async def ask(client: Any, key: str, content: str = "2+2?", *, stream: bool = False) -> str:
    r = await client.post("/v1/chat/completions", json=chat(content, stream=stream), headers=auth(key))
    assert r.status_code == 200, r.text
    ext = tierroute_of(r.text, stream)
    assert ext is not None
    return str(ext["request_id"])


async def label(client: Any, key: str, **body: Any) -> Any:
    return await client.post("/v1/feedback", json=body, headers=auth(key))


def stored(path: Path) -> list[tuple[str, str, float, str | None, str | None]]:
    s = SQLiteStore(path, read_only=True)
    s.open()
    try:
        return [(f.request_id, f.key_id, f.score, f.label, f.comment) for f in s.feedback()]
    finally:
        s.close()


async def test_a_foreign_request_and_an_unknown_one_get_the_same_404(
    served: tuple[Any, dict[str, str], Path],
) -> None:
    client, keys, ledger = served
    mine = await ask(client, keys["alice"])
    unknown = "chatcmpl-" + "0" * 24  # the same shape as a real id
    foreign = await label(client, keys["bob"], request_id=mine, score=0)
    missing = await label(client, keys["bob"], request_id=unknown, score=0)
    assert foreign.status_code == missing.status_code == 404
    # word for word the same once the id the caller sent is taken out: nothing tells them apart
    assert foreign.text.replace(mine, "ID") == missing.text.replace(unknown, "ID")
    assert {k: v for k, v in foreign.headers.items() if k != "content-length"} == {
        k: v for k, v in missing.headers.items() if k != "content-length"
    }
    assert foreign.json()["error"] == {
        "message": f"No request '{mine}' was found for this API key.",
        "type": "invalid_request_error",
        "param": "request_id",
        "code": "request_not_found",
    }
    # an answer escalated to the large tier is the caller's too; the shadow's own rows are nobody's
    assert (await label(client, keys["alice"], request_id=mine, score=True)).status_code == 200
    assert stored(ledger) == [(mine, "alice", 1.0, None, None)]
    # no key, no label
    r = await client.post("/v1/feedback", json={"request_id": mine, "score": 1})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


async def test_an_admin_key_labels_any_request_and_learns_nothing_of_unknown_ids(
    served: tuple[Any, dict[str, str], Path],
) -> None:
    # the admin key holds no client role: it sends no completions, yet it may label what clients sent
    client, keys, ledger = served
    alices = await ask(client, keys["alice"])
    unknown = "chatcmpl-" + "f" * 24
    r = await label(client, keys["root"], request_id=alices, score=0, label="reviewed", comment="wrong unit")
    assert r.status_code == 200, r.text
    assert r.json()["request_id"] == alices and r.json()["labels"] == 1
    # stored under the name of the key that labelled it, not the one that asked
    assert stored(ledger) == [(alices, "root", 0.0, "reviewed", "wrong unit")]
    # an unknown id: the same 404 a client key gets for an unknown or a foreign request
    missing = await label(client, keys["root"], request_id=unknown, score=1)
    foreign = await label(client, keys["bob"], request_id=alices, score=1)
    assert missing.status_code == foreign.status_code == 404
    assert missing.text.replace(unknown, "ID") == foreign.text.replace(alices, "ID")
    assert missing.json()["error"]["code"] == "request_not_found"
    # the admin's label does not open the request to other client keys
    assert stored(ledger) == [(alices, "root", 0.0, "reviewed", "wrong unit")]
    refused = await client.post("/v1/chat/completions", json=chat("2+2?"), headers=auth(keys["root"]))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "not_a_client_key"


BAD = [
    ({"score": 1.5}, "score"),
    ({"score": -0.1}, "score"),
    ({"score": "0.5"}, "score"),
    ({"score": None}, "score"),
    ({}, "score"),
    ({"score": [1]}, "score"),
    ({"score": 1, "label": "x" * 65}, "label"),
    ({"score": 1, "label": ""}, "label"),
    ({"score": 1, "label": "bad\x00label"}, "label"),
    ({"score": 1, "comment": "c" * 2001}, "comment"),
    ({"score": 1, "comment": "nul\x00here"}, "comment"),
    ({"score": 1, "socre": 1}, "socre"),
    ({"score": 1, "request_id": "x" * 129}, "request_id"),
    ({"score": 1, "request_id": 7}, "request_id"),
    ({"score": 1, "request_id": "a\nb"}, "request_id"),
]


async def test_a_bad_body_is_a_400_in_openais_shape(served: tuple[Any, dict[str, str], Path]) -> None:
    client, keys, ledger = served
    rid = await ask(client, keys["alice"])
    for body, param in BAD:
        r = await label(client, keys["alice"], **{"request_id": rid, **body})
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"], body
    raw = '{"request_id": "' + rid + '", "score": NaN}'  # refused before any route reads it
    headers = {**auth(keys["alice"]), "content-type": "application/json"}
    r = await client.post("/v1/feedback", content=raw, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_body"
    assert stored(ledger) == []


async def test_many_labels_are_kept_in_the_order_they_arrived(served: tuple[Any, dict[str, str], Path]) -> None:
    client, keys, ledger = served
    plain = await ask(client, keys["alice"])
    streamed = await ask(client, keys["alice"], f"{MARK} 2+2?", stream=True)  # escalated, and streamed
    sent = [
        (plain, True, "thumbs_up", None),
        (plain, 0.25, "tests_failed", "2 of 8 tests failed"),
        (streamed, 0, None, "line one\nline two"),
        (plain, 1, "tests_passed", None),
        (plain, 0.5, None, None),
    ]
    counts = []
    for rid, score, name, comment in sent:
        r = await label(client, keys["alice"], request_id=rid, score=score, label=name, comment=comment)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["object"] == "feedback" and got["id"].startswith("fb-") and got["request_id"] == rid
        assert got["score"] == float(score) and got["label"] == name and got["comment"] == comment
        counts.append(got["labels"])
    assert counts == [1, 2, 1, 3, 4]
    assert stored(ledger) == [(rid, "alice", float(s), n, c) for rid, s, n, c in sent]
    # the first label of each answered-by-a-threshold request reached the live drift detector, once
    drift = client.app.state.services.shadow.drift
    fed = {key: stream.n for key, stream in drift.streams.items() if key[2] == "feedback"}
    assert sum(fed.values()) == 2 and {tier for tier, _, _ in fed} == {"small", "large"}


async def test_without_a_ledger_feedback_says_why(tmp_path: Path) -> None:
    cfg, keys = config_with_keys(tmp_path, {"alice": {}})
    cfg.write_text(cfg.read_text().replace("[ledger]\n", "[ledger]\nenabled = false\n", 1))
    async with running(cfg, backends=dict(BACKENDS)) as client:
        rid = await ask(client, keys["alice"])
        r = await label(client, keys["alice"], request_id=rid, score=1)
    assert r.status_code == 400 and json.loads(r.text)["error"]["code"] == "feedback_unavailable"


async def test_the_drift_detector_watches_labels_once_enough_have_arrived(tmp_path: Path) -> None:
    shadow = "[tiers.shadow]\nrate = 0.0\nusd_per_day = 0.0\nbaseline_n = 20\n"  # no shadow work: labels only
    cfg, keys = config_with_keys(tmp_path, {"alice": {"roles": ["client", "metrics"]}}, verifiers=shadow)
    async with running(cfg, backends=dict(BACKENDS)) as client:
        drift = client.app.state.services.shadow.drift

        async def labelled(n: int, score: float) -> None:
            for _ in range(n):
                rid = await ask(client, keys["alice"], "What is 2 + 2?")
                assert (await label(client, keys["alice"], request_id=rid, score=score)).status_code == 200

        await labelled(19, 1.0)
        assert not drift.streams[("small", "maths", "feedback")].armed  # fewer labels than a baseline needs
        await labelled(1, 1.0)
        assert drift.streams[("small", "maths", "feedback")].armed and not drift.alarms
        await labelled(15, 0.0)
        alarms = [(a.tier, a.task, a.signal, a.direction) for a in drift.alarms]
        assert alarms == [("small", "maths", "feedback", "down")]
        metrics = (await client.get("/metrics", headers=auth(keys["alice"]))).text
        assert (
            'tierroute_shadow_drift_alarm{direction="down",signal="feedback",task="maths",tier="small"} 1.0' in metrics
        )


async def test_labels_raced_at_once_stop_at_the_cap_and_reach_drift_once(
    served: tuple[Any, dict[str, str], Path],
) -> None:
    # an attacker fires 150 labels for one request at once: counting and writing in two ledger
    # turns let every one of them see fewer than the cap (147 stored, 60 'first' labels fed to
    # drift, measured against `tierroute serve`); the cap and 'first' must hold under a burst
    client, keys, ledger = served
    rid = await ask(client, keys["alice"])
    sent = await asyncio.gather(*(label(client, keys["alice"], request_id=rid, score=0) for _ in range(150)))
    codes = sorted(r.status_code for r in sent)
    assert codes == [200] * MAX_LABELS_PER_REQUEST + [400] * (150 - MAX_LABELS_PER_REQUEST)
    assert len(stored(ledger)) == MAX_LABELS_PER_REQUEST
    assert sorted(r.json()["labels"] for r in sent if r.status_code == 200) == list(range(1, 101))
    drift = client.app.state.services.shadow.drift
    assert sum(s.n for key, s in drift.streams.items() if key[2] == "feedback") == 1
