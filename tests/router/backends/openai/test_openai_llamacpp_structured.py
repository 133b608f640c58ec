"""response_format passed through to a real remote tier: llama-cpp-python's server on SmolLM2
enforces the JSON mode it is sent, so the answer relayed by the `openai` backend is a JSON object.
(That server takes `json_object` only, and answers a `json_schema` with a 500 of its own; vLLM and
OpenAI take both. The scripted upstream's tests show both are sent as given.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from router.backends.openai import OpenAIBackend
from router.config import OpenAIBackendSettings
from router.generation import GenerationRequest, Message, ResponseFormat
from tests.support.servers import llama_cpp_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server_url(smol_path: Path) -> Iterator[str]:
    with llama_cpp_server(smol_path) as url:
        yield url


async def test_a_real_upstream_enforces_the_json_mode_it_is_sent(server_url: str) -> None:
    """SmolLM2 under that server's JSON grammar (whose whitespace is unbounded) may not finish its
    object within a few tokens; that its answer is JSON at all, where the same request without
    the parameter is prose, shows the parameter reached the server and was enforced there."""
    backend = OpenAIBackend("large", OpenAIBackendSettings(base_url=server_url, model="smol"), timeout_s=120)
    await backend.start()
    ask = GenerationRequest(messages=(Message("user", "Pick a colour and a number."),), max_tokens=24)
    try:
        constrained = await backend.generate(ask.with_(response_format=ResponseFormat("json_object")))
        free = await backend.generate(ask)
    finally:
        await backend.close()
    assert constrained.text.lstrip().startswith("{"), constrained.text
    assert not free.text.lstrip().startswith("{"), free.text
    assert constrained.constrained is None and free.constrained is False  # the upstream's grammar, not ours
