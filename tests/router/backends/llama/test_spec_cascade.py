"""The speculative cascade (research mode): a deferral rule keeps some drafted tokens unchecked.

The rule is tested on synthetic distributions (its boundaries, its extreme margins, and the output
distribution it gives with the speculative rejection rule, checked statistically), then in the
engine: SmolLM2 drafting for itself shows the wiring and the counters, and where the Qwen2.5-Coder
pair is in the model cache, 0.5B drafting for 1.5B shows what the rule changes: a rule that always
defers gives the 1.5B model's own greedy answer, one that never defers lets the 0.5B model's
choices through where the two disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from router.backends.llama.backend import LlamaCppBackend
from router.backends.llama.drafting import speculative_accept
from router.backends.llama.spec_cascade import cascade_defers, total_variation
from router.config import LlamaCppSettings
from router.errors import ConfigError
from router.generation import Generation, GenerationRequest, Message

Dist = tuple[np.ndarray, np.ndarray]


def _dist(probs: list[float], ids: list[int] | None = None) -> Dist:
    return np.asarray(ids if ids is not None else range(len(probs))), np.asarray(probs, dtype=np.float64)


def _random_dist(rng: np.random.Generator, n: int = 6, concentration: float = 0.5) -> Dist:
    return np.arange(n), rng.dirichlet(np.full(n, concentration))


# ---- the rule on synthetic distributions ------------------------------------------------------


def test_total_variation_over_sparse_supports() -> None:
    assert total_variation(_dist([0.5, 0.5]), _dist([0.5, 0.5])) == pytest.approx(0.0)
    assert total_variation(_dist([1.0], [3]), _dist([1.0], [7])) == pytest.approx(1.0)  # disjoint
    p, q = _dist([0.7, 0.3], [2, 5]), _dist([0.4, 0.6], [5, 9])
    # |0.7-0| + |0.3-0.4| + |0-0.6| = 1.4
    assert total_variation(p, q) == pytest.approx(0.7)
    assert total_variation(q, p) == pytest.approx(0.7)


def test_each_rule_defers_on_its_own_side_of_the_margin() -> None:
    sure_p, unsure_q = _dist([0.9, 0.1]), _dist([0.6, 0.4])
    # chow reads q alone: 0.6 < 1 - 0.3 defers, 0.6 >= 1 - 0.5 keeps
    assert cascade_defers("chow", 0.3, sure_p, unsure_q)
    assert not cascade_defers("chow", 0.5, sure_p, unsure_q)
    # diff: the target is surer by 0.3; a margin below that defers, above keeps
    assert cascade_defers("diff", 0.2, sure_p, unsure_q)
    assert not cascade_defers("diff", 0.4, sure_p, unsure_q)
    # a draft model surer than the target is kept at margin 0
    assert not cascade_defers("diff", 0.0, unsure_q, sure_p)
    # opt scales the margin by TV (0.3 here): 0.6 < 0.9 - 0.5 * 0.3 defers, 0.6 >= 0.9 - 1.0 * 0.3 keeps
    assert total_variation(sure_p, unsure_q) == pytest.approx(0.3)
    assert cascade_defers("opt", 0.5, sure_p, unsure_q)
    assert not cascade_defers("opt", 1.0, sure_p, unsure_q)
    with pytest.raises(ValueError, match="rule"):
        cascade_defers("median", 0.1, sure_p, unsure_q)


def test_extreme_margins_always_or_never_defer() -> None:
    """-1 always defers under every rule (exact speculative decoding); +1 never defers under chow,
    diff and opt (opt: TV(p, q) >= max p - max q, so max p - TV never exceeds max q)."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        p, q = _random_dist(rng, concentration=float(rng.uniform(0.05, 3))), _random_dist(rng)
        assert cascade_defers("diff", -1.0, p, q)
        assert cascade_defers("chow", -1.0, p, q)
        assert not cascade_defers("diff", 1.0, p, q)
        assert not cascade_defers("chow", 1.0, p, q)
        assert not cascade_defers("opt", 1.0, p, q)


def _cascade_samples(rule: str, margin: float, p: Dist, q: Dist, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` sampled positions as the engine takes them: x drawn from q by the draft model, kept when
    the rule does not defer, else judged by the rejection rule against p, draw by draw. The rule
    sees (p, q) only, never x, so it is asked once for the pair (the engine asks it per position;
    its answer is the same). Drawing the n x's at once and asking once cut this test from minutes
    to seconds; `speculative_accept`, the part under test, still judges each draw."""
    xs = q[0][rng.choice(q[0].shape[0], size=n, p=q[1])]
    if not cascade_defers(rule, margin, p, q):
        return xs
    return np.asarray([speculative_accept(p, q, int(x), rng)[1] for x in xs])


@pytest.mark.slow
@pytest.mark.parametrize("rule,margin", [("diff", 0.1), ("opt", 0.5), ("chow", 0.3)])
def test_sampled_output_follows_q_where_kept_and_p_where_deferred(rule: str, margin: float) -> None:
    """The rule's decision depends on (p, q) alone, so a position's output is distributed as q
    where it keeps and as p where it defers: checked by the empirical distribution of 10,000
    draws for pairs on both sides (a wrong composition, a decision that peeked at x, or the
    residual drawn wrongly moves some probability by far more than the 0.02 allowed). A cell's
    standard error is at most 0.005 at 10,000 draws, so 0.02 is four of them (the seeded run's
    worst cell is off by 0.014); 20,000 draws cost twice the CPU for a tolerance kept the same."""
    rng = np.random.default_rng(1)
    seen = {True: 0, False: 0}
    for _ in range(30):
        p = _random_dist(rng, concentration=float(rng.uniform(0.1, 2)))
        q = _random_dist(rng, concentration=float(rng.uniform(0.1, 2)))
        defers = cascade_defers(rule, margin, p, q)
        seen[defers] += 1
        n = 10_000
        counts = np.bincount(_cascade_samples(rule, margin, p, q, rng, n), minlength=6) / n
        want = p[1] if defers else q[1]
        assert np.abs(counts - want).max() < 0.02, (rule, margin, defers, counts, want)
    assert seen[True] and seen[False], seen  # both branches were exercised


# ---- configuration ----------------------------------------------------------------------------


def test_spec_cascade_needs_a_draft_model_and_a_known_rule(tmp_path: Path) -> None:
    from router.config import load_settings
    from tests.support.config import smol_config
    from tests.support.model import SMOL

    cfg = smol_config(tmp_path, large="none")
    base = cfg.read_text()

    def check(extra: str) -> str:
        cfg.write_text(base.replace(f'model = "{SMOL}"', f'model = "{SMOL}"\n{extra}', 1))
        with pytest.raises(ConfigError) as err:
            load_settings(cfg)
        return str(err.value)

    msg = check('spec_cascade = { rule = "diff", margin = 0.1 }')
    assert "spec_cascade needs a draft_model" in msg and "tiers[0] (small).llamacpp" in msg
    draft = f'draft_model = "{SMOL}"\n'
    assert "rule" in check(draft + 'spec_cascade = { rule = "median", margin = 0.1 }')
    assert "margin" in check(draft + 'spec_cascade = { rule = "diff", margin = 1.5 }')
    assert "margin" in check(draft + 'spec_cascade = { rule = "diff" }')
    assert "thresold" in check(draft + 'spec_cascade = { rule = "diff", margin = 0.1, thresold = 2 }')
    cfg.write_text(
        base.replace(
            f'model = "{SMOL}"', f'model = "{SMOL}"\n{draft}spec_cascade = {{ rule = "opt", margin = 0.5 }}', 1
        )
    )
    tier = load_settings(cfg).tiers[0].llamacpp
    assert tier is not None and tier.spec_cascade is not None
    assert (tier.spec_cascade.rule, tier.spec_cascade.margin) == ("opt", 0.5)
    # absent: exact speculative decoding, as before
    assert LlamaCppSettings(model="m", draft_model="d").spec_cascade is None


# ---- the engine -------------------------------------------------------------------------------

PROMPT = "List three prime numbers and explain why each is prime."


def _ask(text: str, max_tokens: int = 48, **kw: Any) -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", text),), max_tokens=max_tokens, **kw)


def _settings(path: Path, draft: Path | None = None, **kw: Any) -> LlamaCppSettings:
    extra: dict[str, Any] = {} if draft is None else {"draft_model": str(draft), "draft_max": 6, "draft_p_min": 0.0}
    return LlamaCppSettings(model=str(path), n_ctx=2048, n_threads=1, n_parallel=2, **extra, **kw)


def _counts(g: Generation) -> dict[str, tuple[int, int]]:
    return {s: (t, a) for s, t, a in g.drafts}


async def test_self_draft_counts_kept_and_deferred_tokens(smol_path: Path) -> None:
    """SmolLM2 drafting for itself: a rule that never defers keeps every drafted token unchecked
    (all counted as "cascade", none as "model"); one that always defers counts none, and greedy
    gives the plain answer. The engine's totals (for /metrics) add up the same way. 24 tokens an
    answer: four drafting steps, enough for kept drafts to be most of it."""
    never = LlamaCppBackend(
        "never",
        smol_path,
        _settings(smol_path, smol_path, spec_cascade={"rule": "diff", "margin": 1.0}),
        512,
        smol_path,
    )
    always = LlamaCppBackend(
        "always",
        smol_path,
        _settings(smol_path, smol_path, spec_cascade={"rule": "diff", "margin": -1.0}),
        512,
        smol_path,
    )
    await never.start()
    await always.start()
    try:
        a = await always.generate(_ask(PROMPT, 24))
        n = await never.generate(_ask(PROMPT, 24))
        assert n.text == a.text  # one model: whichever decides, the token is the same argmax
        assert _counts(a).get("cascade", (0, 0)) == (0, 0) and _counts(a)["model"][0] > 0
        kept = _counts(n)["cascade"]
        assert kept[0] == kept[1] > n.completion_tokens // 2
        assert _counts(n).get("model", (0, 0)) == (0, 0)
        assert never.draft_counts()["cascade"] == kept
        assert always.draft_counts()["cascade"] == (0, 0)
        # sampling: the rule reads the job's distributions; never deferring keeps every draft
        s = await never.generate(_ask(PROMPT, 24, temperature=0.8, seed=3))
        assert _counts(s)["cascade"][0] > 0 and _counts(s).get("model", (0, 0))[0] == 0
    finally:
        await never.close()
        await always.close()


@pytest.fixture(scope="module")
def qwen_pair(smol_path: Path) -> tuple[Path, Path]:
    small = smol_path.parent / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    large = smol_path.parent / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    if not (small.exists() and large.exists()):
        pytest.skip("the Qwen2.5-Coder models are not in the model cache")
    return small, large


# a short prompt (a shorter question, a short system prompt in place of Qwen's default: 38 tokens
# against 58) on which the pair part at once: the 1.5B model answers "To determine the total
# cost", the 0.5B model "To find the total cost", so a few tokens show what the rule changes; the
# long question without a system prompt needed 20 (the drafted answers first parted at token 17)
QUESTION = (
    Message("system", "Be brief."),
    Message("user", "Pens cost 3 dollars, notebooks 5. What do 4 pens and 2 notebooks cost?"),
)


async def test_the_rule_decides_between_two_models(qwen_pair: tuple[Path, Path]) -> None:
    """0.5B drafting for 1.5B, greedy. Always deferring is exact speculative decoding: token for
    token the answer of the same pair without the rule. Never deferring keeps the 0.5B model's
    drafted tokens: read back by scoring the answer with each model, its tokens are the argmax
    of one of the two (all but near ties, which llama.cpp's batched passes round either way),
    and some are the 0.5B model's choice where the 1.5B model would have chosen otherwise.

    One pair gives the three answers, its rule set between them (the engine reads it at each
    step; the config's path to it is the self-draft test's), where three pairs loaded in ~2.5
    CPU-seconds each. It keeps no prefix cache, so each answer prefills afresh as the first did.
    The answers are 12 tokens, so no near tie is allowed for: each token must be one model's argmax."""
    small, large = qwen_pair
    pair = LlamaCppBackend(
        "pair",
        large,
        _settings(large, small, spec_cascade={"rule": "diff", "margin": -1.0}, prefix_cache_slots=0),
        512,
        small,
    )
    scorer = LlamaCppBackend("scorer", small, _settings(small), 512)
    backends = (pair, scorer)
    for b in backends:
        await b.start()
    try:
        req = GenerationRequest(messages=QUESTION, max_tokens=12)  # 12 tokens: 0.95 of them is all of them
        pair.engine.spec_cascade = None  # the pair without the rule: exact speculative decoding
        want = await pair.generate(req)
        pair.engine.spec_cascade = ("diff", -1.0)  # always defers
        got = await pair.generate(req)
        assert got.text == want.text
        assert _counts(got)["model"] == _counts(want)["model"] and "cascade" not in _counts(got)
        pair.engine.spec_cascade = ("opt", 1.0)  # never defers
        mixed = await pair.generate(req)
        assert _counts(mixed)["cascade"][1] > 0
        by_large = await pair.score_continuation(req, mixed.text)
        by_small = await scorer.score_continuation(req, mixed.text)
        assert by_large.continuation_tokens == by_small.continuation_tokens == mixed.completion_tokens
        either = [a or b for a, b in zip(by_large.top1, by_small.top1, strict=True)]
        small_only = [b and not a for a, b in zip(by_large.top1, by_small.top1, strict=True)]
        assert sum(either) >= 0.95 * len(either), [i for i, ok in enumerate(either) if not ok]
        assert any(small_only)
        assert mixed.text != want.text
    finally:
        for b in backends:
            await b.close()
