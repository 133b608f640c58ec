"""The disk under the ledger fails while a streamed answer is being delivered.

The failure is real: the running `tierroute serve` process gets a file-size limit of one byte
(RLIMIT_FSIZE, set from outside with prlimit), so every write(2) it makes to a regular file fails
with EFBIG, as writes to a full disk fail with ENOSPC. It works as root and as any user, needs no
mount, and leaves the rest of the machine alone. The upstream is a scripted server in this
process: the stream pauses after a few tokens until the test has failed the disk.

What must hold: the client never receives a finished, unrecorded answer (no final chunk, no
finish_reason, no cost, no [DONE]: an error event in OpenAI's shape instead); the request has a
row all the same (its pending row, written ahead); while the ledger is failing, new requests get
503 with Retry-After before any upstream work; when the disk comes back the settled row is
written; after a kill -9 instead, the pending row is what stands, and it counts against the
key's budget after the restart."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from router.ledger.store import SQLiteStore
from tests.support.accounting import auth
from tests.support.fault_upstream import (
    TOKENS,
    FaultUpstream,
)
from tests.support.paused_upstream import chat_body, config, in_flight, paused_stream
from tests.support.servers import serve_process

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prlimit on another process is Linux's"),
]


@contextlib.contextmanager
def failing_disk(pid: int) -> Iterator[None]:
    """Every write the process makes to a regular file fails (EFBIG) until the block ends."""
    soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, hard))
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))


def events(raw: str) -> list[Any]:
    return [
        line[len("data: ") :] if line == "data: [DONE]" else json.loads(line[len("data: ") :])
        for line in raw.splitlines()
        if line.startswith("data: ")
    ]


def ledger(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    store = SQLiteStore(path)
    store.open()
    try:
        return {e.request_id: e for e in store.entries()}, {p.request_id: p for p in store.pending()}
    finally:
        store.close()


def chats(upstream: FaultUpstream) -> int:
    return sum(r.is_chat for r in upstream.requests)


async def stream_until_text(client: httpx.AsyncClient, key: str) -> tuple[Any, list[str]]:
    """Open a stream and read until the first text has arrived; return the open response."""
    ctx = client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True), headers=auth(key))
    response = await ctx.__aenter__()
    assert response.status_code == 200
    seen: list[str] = []
    pieces = response.aiter_text()
    while not any('"content":"' in s and '"content":""' not in s for s in "".join(seen).split("\n\n")):
        seen.append(await pieces.__anext__())
    return (ctx, pieces), seen


@pytest.mark.timeout(300)
async def test_a_failing_disk_never_lets_an_answer_pass_unrecorded(tmp_path: Path) -> None:
    gate = threading.Event()
    with FaultUpstream() as upstream:
        cfg, keys = config(tmp_path, upstream.base_url, budget=100.0)
        with serve_process(cfg) as (proc, url, log):
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                ok = await client.post("/v1/chat/completions", json=chat_body(), headers=auth(keys["k"]))
                assert ok.status_code == 200

                upstream.script(paused_stream(gate))
                (ctx, pieces), seen = await stream_until_text(client, keys["k"])
                with failing_disk(proc.pid):
                    gate.set()  # the answer completes while nothing can be written
                    seen.extend([piece async for piece in pieces])
                    await ctx.__aexit__(None, None, None)
                    got = events("".join(seen))
                    rid = got[0]["id"]
                    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in got if "choices" in e)
                    assert text == "".join(TOKENS)  # the text streamed live, as it was generated...
                    assert got[-1] == {"error": got[-1]["error"]}  # ...but it ends with an error, not a finish
                    error = got[-1]["error"]
                    assert set(error) == {"message", "type", "param", "code"}
                    assert error["type"] == "server_error" and error["code"] == "service_unavailable"
                    assert "ledger" in error["message"]
                    assert "[DONE]" not in got
                    assert not any(
                        e.get("tierroute") or (e.get("choices") or [{}])[0].get("finish_reason") for e in got[:-1]
                    )

                    # while the ledger cannot write, no new work: 503 before the upstream is asked
                    before = chats(upstream)
                    for stream in (False, True):
                        r = await client.post("/v1/chat/completions", json=chat_body(stream), headers=auth(keys["k"]))
                        assert r.status_code == 503, r.text
                        assert int(r.headers["retry-after"]) >= 1
                        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
                    assert chats(upstream) == before
                    assert in_flight(url, keys["k"]) == 0  # failed requests are released (issue 12)

                # the disk is back: the next request succeeds, and the kept entry is written first
                again = await client.post("/v1/chat/completions", json=chat_body(), headers=auth(keys["k"]))
                assert again.status_code == 200
                assert in_flight(url, keys["k"]) == 0

                # a plain request whose own settling write fails: its work was done, it gets 503
                before = chats(upstream)
                with failing_disk(proc.pid):
                    plain = await client.post("/v1/chat/completions", json=chat_body(), headers=auth(keys["k"]))
                    assert plain.status_code == 503 and "ledger" in plain.json()["error"]["message"]
                assert chats(upstream) == before + 1
                last = await client.post("/v1/chat/completions", json=chat_body(), headers=auth(keys["k"]))
                assert last.status_code == 200
    assert "ledger write failed" in log()
    rows, pending = ledger(tmp_path / "ledger.sqlite3")
    assert not pending  # every request that did work settled into a full row
    # ok, the failed stream, again, the failed plain request, last; the refused ones did nothing
    # and left nothing
    assert len(rows) == 5
    entry = rows[rid]
    assert entry.tier == "large" and entry.completion_tokens == len(TOKENS)
    assert entry.cost_usd > 0


@pytest.mark.timeout(300)
async def test_a_crash_while_the_disk_fails_leaves_the_pending_row_and_it_counts(tmp_path: Path) -> None:
    gate = threading.Event()
    with FaultUpstream() as upstream:
        cfg, keys = config(tmp_path, upstream.base_url, budget=100.0)
        with serve_process(cfg) as (proc, url, _):
            upstream.script(paused_stream(gate))
            oai = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=keys["k"], max_retries=0)
            stream = await oai.chat.completions.create(stream=True, **chat_body())
            text = []
            with failing_disk(proc.pid):
                with pytest.raises(openai.APIError, match="ledger"):  # what the SDK makes of the error event
                    async for chunk in stream:
                        if chunk.choices:
                            assert chunk.choices[0].finish_reason is None
                            text.append(chunk.choices[0].delta.content or "")
                            gate.set()
                assert "".join(text) == "".join(TOKENS)
                os.kill(proc.pid, signal.SIGKILL)  # before the disk comes back: the kept entry is lost
                proc.wait()
        rows, pending = ledger(tmp_path / "ledger.sqlite3")
        assert len(pending) == 1 and not rows  # the request is on record, at its reservation
        (row,) = pending.values()
        assert row.key_id == "k" and row.reserved_usd > 0

        # restarted with a budget that holds that reservation and half another: the pending row
        # counts as spent, so the next request does not fit (the key's budget lives in the
        # database since its first start, docs/keys.md: it is lowered there, as an operator would)
        budget = f"{row.reserved_usd * 1.5:.12f}"
        cli = [sys.executable, "-m", "router.cli", "keys", "update", "k", "--usd-per-day", budget, "--config", str(cfg)]
        subprocess.run(cli, check=True, capture_output=True, timeout=120)
        with serve_process(cfg) as (proc, url, log):
            assert "never settled" in log()
            r = httpx.post(f"{url}/v1/chat/completions", json=chat_body(), headers=auth(keys["k"]), timeout=30)
            assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
