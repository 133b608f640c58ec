"""The last line of keep_local, in process: an `openai` tier that is not local refuses a request
marked `local_only` before anything is sent (no upstream is even listening here), whichever way
it is asked: generate, stream, or score another tier's answer; and `tiers[].local` defaults by
backend."""

from __future__ import annotations

import pytest

from router.backends.openai.backend import OpenAIBackend
from router.config import OpenAIBackendSettings, TierSettings
from router.errors import ResidencyError
from router.generation import GenerationRequest, Message
from tests.support.servers import dead_port

KEPT = GenerationRequest(messages=(Message("user", "card 4111 1111 1111 1111"),), local_only=True)


def _backend(local: bool) -> OpenAIBackend:
    config = OpenAIBackendSettings(base_url=f"http://127.0.0.1:{dead_port()}/v1", model="m", max_attempts=1)
    return OpenAIBackend("large", config, local=local)


async def test_a_remote_tier_refuses_a_request_kept_on_the_machine() -> None:
    backend = _backend(local=False)
    with pytest.raises(ResidencyError, match="not local"):
        await backend.generate(KEPT)
    with pytest.raises(ResidencyError):
        async for _ in backend.stream(KEPT):
            pass
    backend.config = backend.config.model_copy(update={"prompt_logprobs": "vllm"})
    with pytest.raises(ResidencyError):
        await backend.score_continuation(KEPT, "an answer")


def test_local_defaults_by_backend_and_can_be_said() -> None:
    price = {"usd_per_hour": 1.0}
    local = TierSettings(name="a", backend="llamacpp", llamacpp={"model": "x"}, price=price)
    remote = TierSettings(name="b", backend="openai", openai={"base_url": "http://h/v1", "model": "m"}, price=price)
    assert local.is_local and not remote.is_local
    assert remote.model_copy(update={"local": True}).is_local
