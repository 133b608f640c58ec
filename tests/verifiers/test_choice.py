"""The `choice` verifier: exact arithmetic on written alternatives, abstentions, and real SmolLM2
output through the service's own cascade (which must ask the tier for the alternatives)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from evals.suites.mmlu import messages_for
from router.engine import Engine
from router.generation import Generation, GenerationRequest, TokenLogprob
from router.plugins import VerifierRegistry
from router.verification import SharedVerifier, VerifierContext, VerifierSet, WeightedVerifier, wanted_top_logprobs
from tests.support.config import smol_settings
from verifiers.choice import ChoiceVerifier, option_letter

REQ = GenerationRequest(prompt="Which? A. x B. y C. z D. w\nAnswer:")
L = math.log


def gen(*tokens: TokenLogprob) -> Generation:
    return Generation(
        text="".join(t.token for t in tokens),
        finish_reason="stop",
        prompt_tokens=10,
        completion_tokens=len(tokens),
        token_logprobs=tuple(t.logprob for t in tokens),
        latency_s=0.1,
        top_logprobs=tokens,
    )


def tok(piece: str, p: float, *alts: tuple[str, float]) -> TokenLogprob:
    return TokenLogprob(piece, L(p), tuple((a, L(q)) for a, q in alts))


async def test_share_of_the_option_letters_sums_spellings() -> None:
    at = tok(" B", 0.4, (" B", 0.4), ("B", 0.1), (" A", 0.2), (" the", 0.2), ("(C", 0.05))
    s = await ChoiceVerifier().score(REQ, gen(tok("The", 0.9, ("The", 0.9)), tok(" answer", 0.5), at))
    # B = 0.4 + 0.1, A = 0.2, C = 0.05, D absent (0); " the" is not a letter
    assert s.value == pytest.approx(0.5 / 0.75)
    assert s.details["letter"] == "B" and s.details["position"] == 2
    assert s.details["letters_mass"] == pytest.approx(0.75)
    m = await ChoiceVerifier(stat="margin").score(REQ, gen(at))
    assert m.value == pytest.approx((0.5 - 0.2) / 0.75)


async def test_a_sampled_letter_below_the_runner_up_has_no_margin() -> None:
    at = tok("C", 0.1, ("A", 0.6), ("B", 0.2), ("C", 0.1))
    s = await ChoiceVerifier(stat="margin").score(REQ, gen(at))
    assert s.value == 0.0
    assert s.details["margin"] == pytest.approx((0.1 - 0.6) / 0.9)
    p = await ChoiceVerifier().score(REQ, gen(at))
    assert p.value == pytest.approx(0.1 / 0.9)


async def test_a_letter_sampled_from_outside_the_top_k_still_counts() -> None:
    at = tok(" D", 0.01, (" A", 0.5), (" B", 0.3))
    s = await ChoiceVerifier().score(REQ, gen(at))
    assert s.value == pytest.approx(0.01 / 0.81)


async def test_five_options() -> None:
    at = tok("E", 0.5, ("E", 0.5), ("A", 0.5))
    assert (await ChoiceVerifier().score(REQ, gen(at))).abstained  # E is no option of ABCD
    s = await ChoiceVerifier(letters="ABCDE").score(REQ, gen(at))
    assert s.value == pytest.approx(0.5)


async def test_abstains_without_alternatives_or_a_letter() -> None:
    plain = Generation("B", "stop", 10, 1, (L(0.5),), 0.1)
    assert (await ChoiceVerifier().score(REQ, plain)).abstained  # the backend gave no top-k
    no_letter = gen(tok("I", 0.5, ("I", 0.5)), tok(" think", 0.5, (" think", 0.5)))
    s = await ChoiceVerifier().score(REQ, no_letter)
    assert s.abstained and "option letter" in s.reason
    no_alts = gen(tok("B", 0.5))
    assert (await ChoiceVerifier().score(REQ, no_alts)).abstained
    nothing = gen()
    assert (await ChoiceVerifier().score(REQ, nothing)).abstained


def test_option_letter_spellings() -> None:
    for piece in ("B", " B", "(B", " (B", "B)", "B.", "B:", "(B)"):
        assert option_letter(piece, "ABCD") == "B", piece
    for piece in ("b", "BC", " Be", "", " ", "E", "A-"):
        assert option_letter(piece, "ABCD") is None, piece


@pytest.mark.parametrize(
    "params",
    [
        {"stat": "max"},
        {"letters": "A"},
        {"letters": "abcd"},
        {"letters": "AAB"},
        {"top_logprobs": 1},
        {"top_logprobs": 21},
    ],
)
def test_bad_params_are_refused(params: dict[str, object]) -> None:
    with pytest.raises((TypeError, ValueError)):
        ChoiceVerifier(**params)  # type: ignore[arg-type]


def test_a_tier_asks_for_what_its_verifiers_read() -> None:
    choice = SharedVerifier(ChoiceVerifier(top_logprobs=7))
    assert wanted_top_logprobs(choice) == 7
    reg = VerifierRegistry.from_entry_points()
    confidence = reg.create("confidence", {}, VerifierContext(tier="t"))
    assert wanted_top_logprobs(confidence) == 0
    assert VerifierSet([WeightedVerifier(confidence, 1.0)]).top_logprobs == 0
    both = VerifierSet([WeightedVerifier(confidence, 1.0), WeightedVerifier(choice, 1.0)])
    assert both.top_logprobs == 7


@pytest.mark.slow
async def test_scores_real_output_through_the_cascade(tmp_path: Path) -> None:
    """SmolLM2 answers an MMLU-style question; the cascade asks the small tier for the top 5 at
    every token because its `choice` verifier needs them, and the verifier reads the letter."""
    verifiers = '[[tiers.verifiers]]\nname = "choice"\nparams = { top_logprobs = 5 }\n'
    engine = Engine.from_settings(smol_settings(tmp_path, threshold=0.99, verifiers=verifiers))
    await engine.start()
    try:
        messages = messages_for(
            topic="geography", question="What is the capital of France?", a="Paris", b="Rome", c="Berlin", d="Madrid"
        )
        request = GenerationRequest(messages=messages, max_tokens=8)
        result = await engine.cascade.run(request, "auto")
        small = result.attempts[0]
        assert small.tier == "small" and small.generation is not None
        tops = small.generation.top_logprobs
        assert tops is not None and tops and all(len(t.top) == 5 for t in tops)
        score = small.scores["choice"]
        assert not score.abstained, (small.generation.text, score.reason)
        assert score.details["letter"] == small.generation.text.strip()[:1]
        assert 0.0 < score.value <= 1.0  # type: ignore[operator]
        # SmolLM2's letters carry most of its mass here, and the share is its own arithmetic
        at = tops[score.details["position"]]
        mass = {}
        for piece, lp in at.top:
            letter = option_letter(piece, "ABCD")
            if letter:
                mass[letter] = mass.get(letter, 0.0) + math.exp(lp)
        assert score.value == pytest.approx(mass[score.details["letter"]] / sum(mass.values()))
    finally:
        await engine.close()
