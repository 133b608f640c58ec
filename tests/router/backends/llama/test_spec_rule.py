"""The speculative rejection rule keeps the target's distribution, checked statistically.

The pure rule first, on synthetic target (p) and draft (q) distributions whose supports differ,
with a chi-square test of the tokens it puts out against p. Then the real SmolLM2-135M under
sampling, with a fixed one-token draft (a rejected answer's first token): the first tokens it
answers with follow the model's own distribution (read from its top logprobs), not the draft.
Seeded generators: the tests are deterministic, and a wrong rule fails them by a wide margin.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare

from router.backends.llama.backend import LlamaCppBackend
from router.backends.llama.drafting import speculative_accept
from router.config import LlamaCppSettings
from router.generation import GenerationRequest, Message

P = (np.asarray([3, 5, 7, 9, 11]), np.asarray([0.35, 0.25, 0.2, 0.15, 0.05]))
# the draft favours what p does not: token 1 (p = 0) and token 7, and never proposes 9 or 11
Q = (np.asarray([1, 3, 5, 7]), np.asarray([0.3, 0.1, 0.2, 0.4]))


def _run(q: tuple[np.ndarray, np.ndarray] | None, fixed: int | None, n: int, seed: int) -> tuple[Counter[int], int]:
    rng = np.random.default_rng(seed)
    out: Counter[int] = Counter()
    kept = 0
    for _ in range(n):
        x = fixed if fixed is not None else int(Q[0][rng.choice(4, p=Q[1])])
        ok, token = speculative_accept(P, q, x, rng)
        kept += ok
        out[token] += 1
    return out, kept


def _fits_p(out: Counter[int], n: int) -> float:
    assert set(out) <= set(P[0].tolist()), f"a token p gives no probability came out: {out}"
    observed = [out[int(t)] for t in P[0]]
    return float(chisquare(observed, [n * float(p) for p in P[1]]).pvalue)


@pytest.mark.slow
def test_sampled_drafts_come_out_distributed_as_the_target() -> None:
    n = 10_000
    out, kept = _run(Q, None, n, seed=1)
    assert _fits_p(out, n) > 1e-3
    # and the rule keeps a draft as often as the theory says: sum over x of min(p(x), q(x))
    p = dict(zip(P[0].tolist(), P[1].tolist(), strict=True))
    expected = sum(min(p.get(int(t), 0.0), float(v)) for t, v in zip(*Q, strict=True))
    assert kept / n == pytest.approx(expected, abs=0.02)


def test_the_draft_distribution_alone_would_fail_the_same_check() -> None:
    """The check has teeth: the draft's own tokens, kept without the rule, are far from p."""
    rng = np.random.default_rng(2)
    out = Counter(int(Q[0][rng.choice(4, p=Q[1])]) for _ in range(10_000))
    observed = [out[int(t)] for t in P[0]]
    assert float(chisquare(observed, [sum(observed) * float(p) for p in P[1]]).pvalue) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("fixed", [3, 9, 1])
def test_a_fixed_draft_token_comes_out_distributed_as_the_target(fixed: int) -> None:
    """A rejected answer's token is a point-mass draft: kept with probability p(x) (never when
    p(x) = 0), and the output is still p."""
    n = 10_000
    out, kept = _run(None, fixed, n, seed=fixed)
    assert _fits_p(out, n) > 1e-3
    p = dict(zip(P[0].tolist(), P[1].tolist(), strict=True)).get(fixed, 0.0)
    assert kept / n == pytest.approx(p, abs=0.02)


def test_identical_distributions_keep_every_draft() -> None:
    rng = np.random.default_rng(3)
    for _ in range(500):
        x = int(P[0][rng.choice(5, p=P[1])])
        assert speculative_accept(P, P, x, rng) == (True, x)


async def test_the_real_model_answers_from_its_own_distribution_with_a_fixed_draft(smol_path: Path) -> None:
    b = LlamaCppBackend(
        "rule", smol_path, LlamaCppSettings(model=str(smol_path), n_ctx=1024, n_threads=1, n_parallel=16), 512
    )
    await b.start()
    try:
        ask = GenerationRequest(messages=(Message("user", "Name one colour."),), max_tokens=2, top_logprobs=20)
        probe = await b.generate(ask)
        assert probe.top_logprobs is not None
        dist = {piece: math.exp(lp) for piece, lp in probe.top_logprobs[0].top}
        # the model's second choice as the draft: kept sometimes, refused more often
        second = sorted(dist, key=lambda k: -dist[k])[1]
        assert b.engine.tokenize(second, add_special=False, parse_special=False) != []
        n = 192
        seen: Counter[str] = Counter()
        drafted = 0
        for start in range(0, n, 16):
            reqs = [ask.with_(temperature=1.0, seed=1000 + start + i, top_logprobs=1) for i in range(16)]
            gens = await asyncio.gather(*(b.generate_reusing(r, second) for r in reqs))
            for g in gens:
                assert g.top_logprobs
                seen[g.top_logprobs[0].token] += 1
                drafted += sum(t for s, t, _ in g.drafts if s == "rejected")
        assert drafted == n  # every answer had the one-token draft
        top = [k for k in sorted(dist, key=lambda k: -dist[k]) if dist[k] * n >= 8]
        assert second in top
        observed = [seen[k] for k in top]
        expected = [dist[k] * n for k in top]
        if n - sum(expected) >= 5:  # the rest, when it is worth a category of its own
            observed.append(n - sum(observed))
            expected.append(n - sum(expected))
        else:  # else the named tokens alone, expected in proportion
            expected = [e * sum(observed) / sum(expected) for e in expected]
        assert float(chisquare(observed, expected).pvalue) > 1e-3, (observed, expected)
    finally:
        await b.close()
