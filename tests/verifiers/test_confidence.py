from __future__ import annotations

import math

import pytest

from router.generation import GenerationRequest
from tests.support.scripted import gen
from verifiers.confidence import ConfidenceVerifier, quantile

REQ = GenerationRequest(prompt="2 + 2 =")
LPS = (math.log(0.9), math.log(0.8), math.log(0.5), math.log(0.99), math.log(0.1))


async def test_mean_is_the_geometric_mean_token_probability() -> None:
    s = await ConfidenceVerifier().score(REQ, gen(" 4", LPS))
    geo = math.prod(math.exp(lp) for lp in LPS) ** (1 / len(LPS))
    assert s.value == pytest.approx(geo)
    assert s.details["n"] == 5
    assert s.details["mean"] == pytest.approx(sum(LPS) / 5)
    assert s.details["min"] == pytest.approx(math.log(0.1))
    assert "p10" in s.details
    alias = await ConfidenceVerifier(stat="geomean_prob").score(REQ, gen(" 4", LPS))
    assert alias.value == pytest.approx(s.value)


async def test_min_quantile_and_mean_prob() -> None:
    lo = await ConfidenceVerifier(stat="min").score(REQ, gen(" 4", LPS))
    assert lo.value == pytest.approx(0.1)
    q0 = await ConfidenceVerifier(stat="quantile", q=0.0).score(REQ, gen(" 4", LPS))
    assert q0.value == pytest.approx(0.1)
    q = await ConfidenceVerifier(stat="quantile", q=0.5).score(REQ, gen(" 4", LPS))
    assert q.value == pytest.approx(0.8)  # the median token
    mp = await ConfidenceVerifier(stat="mean_prob").score(REQ, gen(" 4", LPS))
    assert mp.value == pytest.approx((0.9 + 0.8 + 0.5 + 0.99 + 0.1) / 5)


async def test_length_normalised_and_ordered() -> None:
    sure = await ConfidenceVerifier().score(REQ, gen("x", (math.log(0.95),) * 200))
    short_unsure = await ConfidenceVerifier().score(REQ, gen("x", (math.log(0.4),) * 3))
    assert sure.value == pytest.approx(0.95)  # 200 tokens do not drag it down
    assert sure.value > short_unsure.value


async def test_missing_logprobs_score_the_configured_value() -> None:
    s = await ConfidenceVerifier().score(REQ, gen(" 4", None))
    assert s.value == 0.0
    assert "no logprobs" in s.reason
    s = await ConfidenceVerifier(missing=0.5).score(REQ, gen(" 4", None))
    assert s.value == 0.5
    s = await ConfidenceVerifier(missing=0.5).score(REQ, gen("", ()))
    assert s.value == 0.5


async def test_degenerate_logprobs_stay_in_range() -> None:
    s = await ConfidenceVerifier(stat="quantile", q=0.3).score(REQ, gen("x", (float("-inf"), 0.0, 1e-9, float("nan"))))
    assert 0.0 <= s.value <= 1.0
    assert all(math.isfinite(v) for v in s.details.values())
    top = await ConfidenceVerifier().score(REQ, gen("x", (0.0, 0.0)))
    assert top.value == 1.0


def test_quantile() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([1.0, 2.0], 0.25) == pytest.approx(1.25)
    assert quantile([5.0], 0.9) == 5.0
    with pytest.raises(ValueError):
        quantile([], 0.5)


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"stat": "median"}, ValueError),
        ({"q": 1.5}, ValueError),
        ({"missing": "0"}, TypeError),
        ({"bogus": 1}, TypeError),
    ],
)
def test_bad_params(params: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        ConfidenceVerifier(**params)
