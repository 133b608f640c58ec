"""vLLM's own refusals, each mapped to the client's error and none taken as the deployment failing:
a prompt over `--max-model-len`, `max_tokens` over it, `top_logprobs` over `--max-logprobs`, a
sampling value vLLM refuses. Each is sent more times than the breaker's limit; the breaker stays
closed, the parameters later requests carry are unchanged (the tier's own logprobs are still sent
and returned), and a normal request after them is answered at once."""

from __future__ import annotations

import pytest

from router.errors import ContextLengthError, RequestError
from router.generation import GenerationRequest, Message
from tests.support.vllm_server import VllmServer, backend

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

OK = GenerationRequest(messages=(Message("user", "Say hello."),), max_tokens=8, temperature=0.0)
BREAKER = 2  # failures that would open it: each refusal below is sent BREAKER + 1 times


@pytest.mark.parametrize(
    ("request_", "error", "param"),
    [
        # 4096 tokens in vLLM's context (--max-model-len), each "hello " a token
        (OK.with_(messages=(Message("user", "hello " * 5000),)), ContextLengthError, None),
        (OK.with_(max_tokens=5000), RequestError, "max_tokens"),
        (OK.with_(top_logprobs=20), None, None),  # at the limit: answered
    ],
    ids=["prompt-over-context", "max-tokens-over-context", "top-logprobs-at-limit"],
)
async def test_a_refusal_is_the_requests_fault(
    vllm: VllmServer, request_: GenerationRequest, error: type[Exception] | None, param: str | None
) -> None:
    async with backend(vllm, breaker_failures=BREAKER, max_attempts=3) as b:
        for _ in range(BREAKER + 1):
            if error is None:
                g = await b.generate(request_)
                assert g.top_logprobs is not None and all(len(t.top) == 20 for t in g.top_logprobs)
                continue
            with pytest.raises(error) as caught:
                await b.generate(request_)
            if param is not None:
                assert getattr(caught.value, "param", param) == param
        stats = b.stats()
        after = await b.generate(OK)
    assert stats["breaker_open"] == 0 and stats["breaker_opens_total"] == 0
    assert stats["consecutive_failures"] == 0
    assert stats["upstream_retries_total"] == 0  # a 400 is not retried: any deployment would say the same
    assert after.text and after.token_logprobs  # the tier's own logprobs still asked for and given


async def test_over_max_logprobs_is_refused_and_changes_nothing(vllm: VllmServer) -> None:
    """`top_logprobs` 20 is OpenAI's bound and the server's --max-logprobs (scripts/vllm/env.sh):
    the router admits no more. A scoring request past vLLM's limit cannot be made through the
    router either; sent here straight to vLLM, it is a 400 naming the parameter, which the router
    maps, unretried, to the client's error: the deployment stays trusted."""
    import openai

    client = openai.AsyncOpenAI(base_url=vllm.base_url, api_key=vllm.key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=vllm.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=1,
            extra_body={"prompt_logprobs": 21},
        )
    await client.close()
    assert "max allowed: 20" in str(caught.value)
    async with backend(vllm, breaker_failures=BREAKER) as b:
        for _ in range(BREAKER + 1):
            with pytest.raises(RequestError):
                await b.generate(OK.with_(temperature=0.0, top_p=0.0))  # vLLM: top_p must be in (0, 1]
        stats = b.stats()
        after = await b.generate(OK)
    assert stats["breaker_opens_total"] == 0 and stats["consecutive_failures"] == 0
    assert after.text and after.token_logprobs
