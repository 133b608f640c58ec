"""The response cache on the Responses and Messages surfaces: a repeat is a hit served in the
surface's own shape (streamed too), nothing generated again, and a surface's entry is its own: the
chat twin of a Responses request does not read it (tests/support/cache.py's `Counting` tier
answers each generation differently, so a generation shows)."""

from __future__ import annotations

from pathlib import Path

from tests.support.accounting import auth, read_ledger, running
from tests.support.cache import Counting, cache_config
from tests.support.surfaces import named_events

ASK = "Name a colour."


async def test_repeats_are_hits_in_each_surface_shape(tmp_path: Path) -> None:
    cfg, raw = cache_config(tmp_path, {"ana": {}})
    backend = Counting("small")
    headers = auth(raw["ana"])
    responses = {"model": "small", "input": ASK, "temperature": 0}
    messages = {"model": "small", "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": ASK}]}
    chat = {"model": "small", "temperature": 0, "messages": [{"role": "user", "content": ASK}]}
    async with running(cfg, backends={"small": backend}) as client:
        cache = client.app.state.services.cache  # type: ignore[attr-defined]
        first = await client.post("/v1/responses", json=responses, headers=headers)
        await cache.close()  # its store is in
        again = await client.post("/v1/responses", json=responses, headers=headers)
        streamed = await client.post("/v1/responses", json={**responses, "stream": True}, headers=headers)
        twin = await client.post("/v1/chat/completions", json=chat, headers=headers)
        said = await client.post("/v1/messages", json=messages, headers=headers)
        await cache.close()
        repeated = await client.post("/v1/messages", json=messages, headers=headers)
    assert backend.calls == 3  # the Responses request, its chat twin, the Messages request
    assert first.headers["x-tierroute-cache"] == "miss" and again.headers["x-tierroute-cache"] == "hit"
    hit = again.json()
    assert hit["object"] == "response" and hit["output"][0]["content"][0]["text"] == "answer 1 here"
    assert hit["output"][0]["id"] == f"msg_{hit['id'].removeprefix('resp_')}" and hit["usage"] == first.json()["usage"]
    assert hit["tierroute"]["cached_request_id"] == first.json()["id"]
    events = named_events(streamed.text)
    assert events[-1][0] == "response.completed" and events[-1][1]["response"]["output"] == [
        {**hit["output"][0], "id": f"msg_{events[0][1]['response']['id'].removeprefix('resp_')}"}
    ]
    assert twin.json()["choices"][0]["message"]["content"] == "answer 2 here"  # not the Responses entry
    assert repeated.headers["x-tierroute-cache"] == "hit" and repeated.json()["content"] == said.json()["content"]
    assert said.json()["content"] == [{"type": "text", "text": "answer 3 here"}]
    rows = read_ledger(tmp_path / "ledger.sqlite3")
    assert sorted(r.surface for r in rows.values()) == ["chat.completions", *["messages"] * 2, *["responses"] * 3]
