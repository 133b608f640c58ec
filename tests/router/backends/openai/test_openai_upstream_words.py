"""What a hostile upstream can make a client read, through the HTTP API: an error names the tier
and the upstream's status, never words the upstream chose (they may carry an internal hostname,
a key, or text meant to mislead the client). The upstream's words go to the operator's log.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.support.accounting import chat, running
from tests.support.config import write_config
from tests.support.fault_upstream import FaultUpstream, raw, status

PLANTED = "db-7.corp.internal"  # what an upstream tries to show a client


def _config(tmp_path: Path, port: int) -> Path:
    text = (
        f'[server]\nallow_unauthenticated = true\n[ledger]\npath = "{tmp_path / "ledger.sqlite3"}"\n'
        '[[tiers]]\nname = "large"\nbackend = "openai"\nmax_tokens = 8\ntimeout_s = 5\n'
        "[tiers.price]\nusd_per_1m_input_tokens = 1.0\nusd_per_1m_output_tokens = 2.0\n"
        f'[tiers.openai]\nmodel = "m"\nmax_attempts = 1\nbase_url = "http://127.0.0.1:{port}/v1"\n'
    )
    return write_config(tmp_path / "config.toml", text)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_refused_answer_does_not_repeat_the_upstreams_content_encoding(
    tmp_path: Path, upstream: FaultUpstream, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    # an answer refused for its Content-Encoding (compressed: identity was asked for) told the
    # client that header's first 32 characters, whatever the upstream put there
    upstream.default = raw(200, b"{}", headers={"Content-Encoding": PLANTED})
    caplog.set_level(logging.WARNING)
    async with running(_config(tmp_path, upstream.port)) as client:
        response = await client.post("/v1/chat/completions", json=chat("Hello?", stream=stream))
    assert response.status_code >= 500, response.text
    message = response.json()["error"]["message"]
    assert message.startswith("tier large") and "compressed" in message, message
    assert PLANTED not in response.text
    assert PLANTED in "\n".join(r.getMessage() for r in caplog.records)  # the operator still reads it


@pytest.mark.parametrize(
    ("param", "code", "shown"),
    [
        ("10.0.7.12", "db-7.corp.internal", (None, None)),  # an address and a hostname: identifiers to the old rule
        ("corp.internal", "Internal-Host", (None, None)),
        ("messages[0].content", "invalid_value", ("messages[0].content", "invalid_value")),
        (
            "response_format.json_schema",
            "invalid_request_error",
            ("response_format.json_schema", "invalid_request_error"),
        ),
    ],
)
async def test_a_rejections_param_and_code_pass_only_as_openais_own_names(
    tmp_path: Path, upstream: FaultUpstream, param: str, code: str, shown: tuple[str | None, str | None]
) -> None:
    # a 400's `param` and `code` were passed on when they looked like identifiers (letters,
    # digits, '.', '-', '[]'), which an address or a hostname does; now a param must start with a
    # field of an OpenAI request and a code be lower-case snake_case, as OpenAI's are
    upstream.default = status(400, "rejected", param=param, code_name=code)
    async with running(_config(tmp_path, upstream.port)) as client:
        response = await client.post("/v1/chat/completions", json=chat("Hello?"))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == shown
