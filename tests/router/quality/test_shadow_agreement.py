"""The shadow text comparison costs milliseconds whatever the answers are, and the event loop keeps
answering while it runs: two models can be made to echo long, repetitive text (difflib, used
before, took seconds on such pairs and minutes on some, on the loop)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from router.generation import GenerationRequest, Message
from router.quality.agreement import AgreementRegistry, common_subsequence, normalise, similarity, text_agreement

Q = GenerationRequest(messages=(Message("user", "Say it again."),))


def lcs_table(a: str, b: str) -> int:
    """The textbook dynamic programme, to check the bit-parallel one against."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def test_the_common_subsequence_is_the_longest() -> None:
    rng = random.Random(7)
    for _ in range(500):
        a = "".join(rng.choice("abc é") for _ in range(rng.randint(0, 40)))
        b = "".join(rng.choice("abcd é") for _ in range(rng.randint(0, 40)))
        assert common_subsequence(a, b) == lcs_table(a, b), (a, b)
    assert similarity("", "") == 1.0 and similarity("abc", "") == 0.0
    assert similarity("abcd", "abxd") == pytest.approx(0.75)
    assert text_agreement("Paris is the capital.", "paris is the capital").agree


def test_the_common_subsequence_holds_for_any_code_points() -> None:
    # what a model or an upstream can send: astral characters, combining marks, a lone surrogate
    # (a stream cut inside a pair), NUL, letters that case-fold to more than one
    alphabet = ["a", "\u0301", "e\u0301", "\U0001f600", "\U0010ffff", "\ud800", "\x00", "\u00df", "\u0130", " "]
    rng = random.Random(11)
    for _ in range(300):
        a = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        b = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert common_subsequence(a, b) == lcs_table(a, b), (a, b)
    assert text_agreement("\u00df \ufb03", "SS ffi").agree  # compared case-folded


def test_normalising_strips_the_punctuation_around_words_only() -> None:
    assert normalise("  Hello,\tWORLD!!\n") == "hello world"
    assert normalise('(a) ... b.c!d "e\'s" ?!') == "a b.c!d e's"  # inside a word it stays
    assert normalise("!!! ,,, ...") == ""  # a word of nothing but punctuation goes
    assert normalise("\u00a1Hola! \u00c9T\u00c9\u3000\u00df") == "\u00a1hola \u00e9t\u00e9 ss"  # ASCII punctuation only


def hostile_pairs() -> dict[str, tuple[str, str]]:
    rng = random.Random(1)
    words = "the a of to and is in it that".split()
    return {
        "short words": (
            " ".join(rng.choice(words) for _ in range(2000)),
            " ".join(rng.choice(words) for _ in range(2000)),
        ),
        "alternating": ("ab " * 1400, "ba " * 1400),
        "spacing": ("a " * 2000, "a  " * 1333),  # difflib: about twelve minutes
        # a bit mask per distinct character: 4,000 of them, each 4,000 bits wide
        "distinct code points": (
            "".join(chr(0x20000 + i) for i in range(4000)),
            "".join(chr(0x20000 + 3999 - i) for i in range(4000)),
        ),
        "casefold expands": ("\ufb03" * 4000, "ffi" * 4000),
        # a run of punctuation inside a word: the old regex took quadratic time in it (26 s here)
        "punctuation inside a word": ("a" + "!" * 40_000 + "a", "b" + "?" * 40_000 + "b"),
        "two letters": (
            "".join(rng.choice("ab ") for _ in range(4000)),
            "".join(rng.choice("ab ") for _ in range(4000)),
        ),
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pair", list(hostile_pairs()))
async def test_a_hostile_text_pair_does_not_stall_the_loop(pair: str) -> None:
    answer, shadow = hostile_pairs()[pair]
    rules = AgreementRegistry()  # no task rules: text decides
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    t0 = time.monotonic()
    found = await rules.compare(None, Q, answer, shadow)
    took = time.monotonic() - t0
    done.set()
    await ticker
    assert found.rule == "text"
    # generous for a loaded two-core machine: the comparison itself takes milliseconds
    assert took < 5.0, f"the comparison took {took:.1f} s"
    assert max(gaps) < 0.5, f"the event loop stalled {max(gaps):.2f} s"
