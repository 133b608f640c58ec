"""The cross_tier verifier: another tier reads the answer by prefill (real SmolLM2 tiers)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from router.backends.base import Backend, ContinuationScore
from router.config import load_settings
from router.engine import Engine
from router.generation import Delta, Generation, GenerationRequest, Message
from tests.support.config import smol_config
from verifiers.base import VerifierContext
from verifiers.cross_tier import STATS, CrossTierVerifier, continuation_stats, make_cross_tier

ASK = GenerationRequest(messages=(Message("user", "What is 17 * 3? Answer briefly."),), max_tokens=32)

CROSS_TIER = """
[[tiers.verifiers]]
name = "cross_tier"
params = {{ tier = "large", stat = "{stat}" }}
"""


def _gen(text: str) -> Generation:
    return Generation(text, "stop", 5, 5, None, 0.1)


async def test_two_local_tiers_end_to_end(tmp_path: Path, smol_path: Path) -> None:
    """The small tier answers, the large (the same model here) scores it: its own greedy answer
    is all top choices, and the work is priced as the large tier's input tokens."""
    cfg = smol_config(tmp_path, threshold=0.5, verifiers=CROSS_TIER.format(stat="top1_share"))
    engine = Engine.from_settings(load_settings(cfg))
    await engine.start()
    try:
        result = await engine.cascade.run(ASK)
        first = result.attempts[0]
        assert first.tier == "small" and first.generation is not None
        score = first.scores["cross_tier"]
        assert score.value == 1.0, score  # the same model's greedy answer: every token its argmax
        assert result.final.tier == "small"  # accepted
        for stat in STATS:
            assert 0.0 <= score.details[stat] <= 1.0
        assert score.details["top1_share"] == 1.0
        assert score.cost.tier == "large"
        assert score.cost.prompt_tokens == score.details["prompt_tokens"] > score.details["tokens"] > 0
        assert score.cost.completion_tokens == 0 and score.cost.seconds > 0
        # a wrong answer, read by the large tier, scores lower on every statistic but min's floor
        large = engine.backends["large"]
        v = make_cross_tier({"tier": "large"}, VerifierContext("small", engine.backends["small"], engine.backends))
        good = await v.score(ASK, first.generation)
        bad = await v.score(ASK, _gen("The moon is made of 9 cheeses, so the answer is purple."))
        assert good.value is not None and bad.value is not None and bad.value < good.value
        assert bad.details["top1_share"] < good.details["top1_share"]
        assert large.ready
    finally:
        await engine.close()


class _NoScoring(Backend):
    def stream(self, request: GenerationRequest):  # type: ignore[no-untyped-def]
        async def gen():  # type: ignore[no-untyped-def]
            yield Delta("x")
            yield _gen("x")

        return gen()


class _Scoring(_NoScoring):
    def __init__(self, result: ContinuationScore | Exception) -> None:
        super().__init__("big")
        self.result = result
        self.seen: list[tuple[GenerationRequest, str]] = []

    async def score_continuation(self, request: GenerationRequest, continuation: str) -> ContinuationScore:
        self.seen.append((request, continuation))
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def _verifier(backend: Backend | None, **params: object) -> CrossTierVerifier:
    backends = {"big": backend} if backend is not None else {}
    return make_cross_tier({"tier": "big", **params}, VerifierContext("small", None, backends))


async def test_abstains_when_it_cannot_speak() -> None:
    assert (await _verifier(None).score(ASK, _gen("51"))).abstained  # no such tier
    unsupported = await _verifier(_NoScoring("big")).score(ASK, _gen("51"))
    assert unsupported.abstained and "ScoringUnsupportedError" in unsupported.reason
    assert not unsupported.is_unavailable  # for good: an eval stores it
    failing = await _verifier(_Scoring(TimeoutError("slow"))).score(ASK, _gen("51"))
    assert failing.abstained and "slow" in failing.reason
    assert failing.is_unavailable  # for now: an eval run retries it rather than store it
    assert (await _verifier(_Scoring(TimeoutError())).score(ASK, _gen("  \n"))).abstained  # empty
    own = _Scoring(ContinuationScore((-0.1,), (True,), 5, 1, 0.1))
    mine = make_cross_tier({"tier": "big"}, VerifierContext("big", own, {"big": own}))
    score = await mine.score(ASK, _gen("51"))
    assert score.abstained and "own" in score.reason and not own.seen  # nothing prefilled for nothing


async def test_each_stat_and_the_clip() -> None:
    lps = (-0.1, -2.0, -0.5, -0.01)
    top = (True, False, True, True)
    backend = _Scoring(ContinuationScore(lps, top, 20, 4, 0.25))
    want = continuation_stats(lps, top)
    assert want["mean"] == pytest.approx(math.exp(sum(lps) / 4))
    assert want["min"] == pytest.approx(math.exp(-2.0))
    assert want["top1_share"] == 0.75
    for stat in STATS:
        s = await _verifier(backend, stat=stat, max_chars=10).score(ASK, _gen("x" * 50))
        assert s.value == pytest.approx(want[stat])
        assert s.cost.prompt_tokens == 20 and s.cost.seconds == 0.25 and s.cost.tier == "big"
        assert s.details["clipped_to_chars"] == 10
    assert backend.seen[-1][1] == "x" * 10
    assert backend.seen[-1][0].deadline is not None  # the verifier's own timeout bounds the scoring


@pytest.mark.parametrize(
    "params",
    [{}, {"tier": ""}, {"tier": "big", "stat": "median"}, {"tier": "big", "max_chars": 0}, {"tier": "big", "x": 1}],
)
def test_bad_params_are_refused(params: dict[str, object]) -> None:
    with pytest.raises((TypeError, ValueError)):
        make_cross_tier(params, VerifierContext("small"))


def _check(cfg: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "router.cli", "config", "check", "--config", str(cfg)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_config_check_names_a_tier_that_cannot_score(tmp_path: Path, smol_path: Path) -> None:
    (tmp_path / "local").mkdir()
    (tmp_path / "remote").mkdir()
    local = smol_config(tmp_path / "local", verifiers=CROSS_TIER.format(stat="mean"))
    ok = _check(local)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["tiers"][0]["verifiers"][0]["name"] == "cross_tier"
    remote = smol_config(
        tmp_path / "remote", verifiers=CROSS_TIER.format(stat="mean"), large="remote", base_url="http://127.0.0.1:9/v1"
    )
    bad = _check(remote)
    assert bad.returncode == 1
    assert "tiers[0] (small).verifiers[0] (cross_tier).params.tier: tier 'large' cannot score" in bad.stderr
    assert "prompt_logprobs" in bad.stderr
    remote.write_text(remote.read_text().replace('model = "smol"', 'model = "smol"\nprompt_logprobs = "echo"'))
    half = _check(remote)  # echo without a chat template cannot render the chat requests it will see
    assert half.returncode == 1 and "chat_template" in half.stderr
    remote.write_text(
        remote.read_text().replace('prompt_logprobs = "echo"', 'prompt_logprobs = "echo"\nchat_template = "chatml"')
    )
    fixed = _check(remote)
    assert fixed.returncode == 0, fixed.stderr
    misnamed = remote.read_text().replace('tier = "large"', 'tier = "huge"')
    remote.write_text(misnamed)
    wrong = _check(remote)
    assert wrong.returncode == 1 and "no tier named 'huge'" in wrong.stderr
