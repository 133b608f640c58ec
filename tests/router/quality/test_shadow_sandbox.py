"""A shadow comparison of code runs the caller's tests in the sandbox: it takes one of the host's
sandbox slots, as a verifier's run does, so `[sandbox] max_concurrency` bounds the whole process."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from router.admission.slots import Slots
from router.cascade import Cascade, Tier
from router.config import CascadeSettings
from router.generation import GenerationRequest, Message
from router.metrics import Metrics
from router.quality.shadow import ShadowService
from router.verification import VerifierContext, VerifierSet, WeightedVerifier
from tests.support.scripted import ScriptedBackend
from tests.support.shadow import drain, settings
from verifiers import sandbox
from verifiers.format import make_format

pytestmark = pytest.mark.timeout(60)

CODE = "Write a Python function add(a, b) that returns their sum."
ANSWER = "```python\ndef add(a, b):\n    return a + b\n```"


@pytest.mark.slow
async def test_a_code_comparison_waits_for_a_host_sandbox_slot(tmp_path: Path) -> None:
    if sandbox.available() is not None:
        pytest.skip(f"no sandbox here: {sandbox.available()}")
    s = settings(tmp_path, rate=1.0)
    host = Slots("the host's sandboxes", 1, 0)
    fmt = WeightedVerifier(make_format({"regex": "def "}, VerifierContext(tier="small")), 1.0)
    tiers = [
        Tier(s.tier("small"), ScriptedBackend("small", lambda r: ANSWER), VerifierSet([fmt])),
        Tier(s.tier("large"), ScriptedBackend("large", lambda r: ANSWER), VerifierSet([])),
    ]
    svc = ShadowService(
        s, Cascade(tiers, CascadeSettings(task_classifier=False)), None, Metrics(lambda: {}), sandboxes=host
    )
    svc.rng = random.Random(0)
    pairs = []
    svc.observe_pair = pairs.append  # type: ignore[method-assign]
    request = GenerationRequest(
        messages=(Message("user", CODE),), metadata={"tests": ["assert add(1, 2) == 3"], "client_code": True}
    )
    await svc.start()
    try:
        result = await svc.cascade.run(request)
        assert result.task is not None and result.task.task == "code"
        async with host.hold():  # every host slot busy: the comparison waits, it is not refused
            svc.offer("r1", request, result)
            await asyncio.sleep(1.0)
            assert pairs == []
        await drain(svc)
        assert [(p.rule, p.agree) for p in pairs] == [("code_tests", True)]
    finally:
        await svc.close()


async def test_a_waiting_shadow_comparison_takes_no_place_in_the_hosts_queue() -> None:
    """Shadow work waits for a host slot without taking a client's place in the queue: with the one
    slot busy and a shadow comparison waiting, a client's run still gets the one queue place."""
    host = Slots("the host's sandboxes", 1, 1)
    order: list[str] = []

    async def take(who: str, *, wait: bool) -> None:
        async with host.hold(wait=wait):
            order.append(who)

    async with host.hold():
        shadow = asyncio.create_task(take("shadow", wait=True))
        await asyncio.sleep(0.05)
        client = asyncio.create_task(take("client", wait=False))  # the queue's one place is still free
        await asyncio.sleep(0.05)
        assert not client.done()  # waiting, not refused
    await asyncio.gather(shadow, client)
    assert sorted(order) == ["client", "shadow"]
