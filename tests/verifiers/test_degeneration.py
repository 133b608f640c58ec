"""The `degeneration` verifier on committed loops, on real SmolLM2 output, and on its edges.

The GSM8K excerpts are the small tier's answers in evals/results/gsm8k (copied verbatim, cut to
their looping end); each ran into the 512-token cap while looping.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from router.backends.llama.backend import LlamaCppBackend
from router.config import LlamaCppSettings
from router.generation import Generation, GenerationRequest, Message
from tests.support.model import started
from tests.support.scripted import gen
from verifiers.base import Registry, VerifierContext, VerifierError
from verifiers.builtins import register_verifiers
from verifiers.degeneration import DegenerationVerifier, script_of

pytestmark = pytest.mark.timeout(300)

# gsm8k/656: one line, a 22-token unit written 13 times
GSM8K_656 = "\\text{number of days Mike has already read} = 10 \\text{ pages/day} \\times \\text{number of days Mike has already read} = 10 \\text{ pages/day} \\times \\text{number of days Mike has already read} = 10 \\text{ pages/day} \\times \\text{number of days Mike has already read} = 10 \\text{ pages/day} \\times \\text{number of days Mike has already read} = 10 \\text{ pages/day} \\times \\text{number of days Mike has already read} = 10 \\text{ pages/day} \\times \\text{number of days Mike has already"
# gsm8k/234: the same sentence on every line, under a growing list number
GSM8K_234 = "25. Calculate the total number of vines Steve needs to grow his own cherry tomatoes.\n26. Calculate the total number of vines Steve needs to grow his own cherry tomatoes.\n27. Calculate the total number of vines Steve needs to grow his own cherry tomatoes.\n28. Calculate the total number of vines Steve needs to grow his own cherry tomatoes.\n29. Calculate the total number of vines Steve needs to grow his own cherry tomatoes.\n30. Calculate"
# gsm8k/866: a paragraph of reasoning written twice, the second time cut by the cap
GSM8K_866 = "We can solve this system by elimination. First, we can add the two equations together:\n\\[ (F + 13) + (F - 12) = F + 13 + F - 12 \\]\n\\[ 2F = 2F \\]\n\\[ 0 = 0 \\]\n\nThis is a contradiction, so there is no solution to the system of equations. However, we can still find the value of \\( F \\) by substituting \\( S = F + 13 \\) back into the first equation:\n\\[ F + 13 = A + 25 \\]\n\\[ A = F + 25 - 13 \\]\n\\[ A = F + 12 \\]\n\nNow we have \\( A = F + 12 \\). We can substitute this value back into the second equation to find \\( F \\):\n\\[ F = F + 12 - 12 \\]\n\\[ F = F \\]\n\nThis is a contradiction, so there is no solution to the system of equations. However, we can still find the value of \\( F \\) by substituting \\( S = F + 13 \\) back into the first equation:\n\\[ F + 13 = A + 25 \\]\n\\[ A = F + 25 - 13 \\]\n\\[ A = F + 12 \\]\n\nNow we have \\( A = F + 12 \\). We can substitute this value back into the second equation to find"
# gsm8k/781: a right answer, no loop
GSM8K_781 = "To solve this problem, we need to determine the cost of each of the other two pizzas. Let's break it down step by step.\n\n1. **Identify the total cost of the pizzas:**\n   The total cost of the pizzas is 64 dollars.\n\n2. **Determine the cost of the pizzas that cost 30 dollars:**\n   Since two pizzas cost 30 dollars, the cost of the other two pizzas is:\n   \\[\n   64 - 30 = 34 \\text{ dollars}\n   \\]\n\n3. **Determine the cost of the pizzas that cost the same amount:**\n   Since the other two pizzas cost the same amount, we can divide the cost of the other two pizzas by 2:\n   \\[\n   \\frac{34}{2} = 17 \\text{ dollars}\n   \\]\n\nTherefore, the cost of each of the other two pizzas is \\(\\boxed{17}\\)."

MATHS = GenerationRequest(messages=(Message("user", "Mike reads 10 pages a day. How many pages ...?"),))
CHAT = GenerationRequest(messages=(Message("user", "Explain how a hash map works, please."),))


async def signs(
    text: str, request: GenerationRequest = CHAT, finish_reason: str = "stop", **params: object
) -> list[str]:
    s = await DegenerationVerifier(**params).score(request, gen(text, finish_reason=finish_reason))  # type: ignore[arg-type]
    return list(s.details["signs"])


@pytest.mark.parametrize(("text", "sign"), [(GSM8K_656, "loop"), (GSM8K_234, "repeated_line"), (GSM8K_866, "loop")])
async def test_the_committed_gsm8k_loops_are_found(text: str, sign: str) -> None:
    s = await DegenerationVerifier().score(MATHS, gen(text, finish_reason="length"))
    assert s.details["signs"] == ["truncated", sign]
    assert s.value < 0.25
    assert "cut off" in s.reason


async def test_a_right_committed_answer_shows_no_sign() -> None:
    s = await DegenerationVerifier().score(MATHS, gen(GSM8K_781))
    assert s.value == 1.0
    assert s.reason == "no sign of degeneration"
    assert s.details["signs"] == []


@pytest.mark.slow
async def test_counting_and_data_are_not_loops_but_words_are() -> None:
    assert await signs(", ".join(str(i) for i in range(1, 300))) == []
    assert await signs("[" + ", ".join(["0"] * 200) + "]") == []
    assert await signs("| a | b |\n" + "| --- | --- |\n" * 20) == []
    assert await signs("the " * 30) == ["loop"]
    assert await signs("the the the is fine in a sentence that says so once.") == []
    many = " ".join(f"Step {i}: add {i} to the total." for i in range(1, 40))  # a counter in each unit
    assert "loop" not in await signs(many)


async def test_short_lines_repeat_in_good_answers() -> None:
    text = "\n".join(f"\\[\n{i} + {i} = {2 * i}\n\\]\nreturn False" for i in range(10))
    assert await signs(text) == []


@pytest.mark.parametrize(
    "text",
    [
        "I'm sorry, but I can't help with that.",
        "I cannot assist with this request.",
        "As an AI language model, I do not have personal opinions.",
        "Sure. I won't provide instructions for that, though.",
    ],
)
async def test_refusals(text: str) -> None:
    s = await DegenerationVerifier().score(CHAT, gen(text))
    assert s.details["signs"] == ["refusal"]
    assert s.value == pytest.approx(0.1)


async def test_words_of_refusal_inside_reasoning_are_not_one() -> None:
    text = (
        " ".join(f"Apple {i} costs {i + 1} dollars." for i in range(20))
        + " I cannot solve it this way, so let us try another."
    )
    assert await signs(text) == []
    assert await signs("I can help with that: a hash map stores pairs.") == []


@pytest.mark.parametrize("text", ["", "   \n\t", "...", "```\n```"])
async def test_an_empty_answer_scores_zero(text: str) -> None:
    s = await DegenerationVerifier().score(CHAT, gen(text))
    assert s.value == 0.0
    assert s.details["signs"] == ["empty"]


async def test_a_one_letter_or_one_number_answer_is_not_empty() -> None:
    assert await signs("A") == []
    assert await signs("42") == []


async def test_an_answer_in_another_script() -> None:
    chinese = "哈希表是一种数据结构，它通过哈希函数把键映射到数组中的位置，所以查找很快。"
    s = await DegenerationVerifier().score(CHAT, gen(chinese))
    assert s.details["signs"] == ["script"]
    assert s.details["foreign_script_share"] == 1.0
    assert "Han" in s.reason and "Latin" in s.reason
    asked_in_chinese = GenerationRequest(messages=(Message("user", "请解释哈希表。"),))
    assert await signs(chinese, asked_in_chinese) == []
    translate = GenerationRequest(messages=(Message("user", "Translate 'a hash map is fast' into Chinese."),))
    assert await signs(chinese, translate) == []
    greek_maths = "The area is πr², so with r = 2 it is 4π ≈ 12.57; the angle θ is 30 degrees."
    assert await signs(greek_maths, MATHS) == []
    mixed = "A hash map (哈希表) maps keys to values through a hash function, so lookups are fast."
    assert await signs(mixed) == []
    assert script_of("a") == "Latin" and script_of("я") == "Cyrillic" and script_of("中") == "Han"
    assert script_of("か") == "Kana" and script_of("한") == "Hangul" and script_of("𝔸") == "other"


async def test_truncation_counts_unless_turned_off() -> None:
    s = await DegenerationVerifier().score(CHAT, gen("A hash map stores pairs and", finish_reason="length"))
    assert s.details["signs"] == ["truncated"]
    assert s.value == pytest.approx(0.5)
    assert await signs("A hash map stores pairs and", finish_reason="length", penalties={"truncated": 0}) == []
    s = await DegenerationVerifier(penalties={"truncated": 0.2}).score(CHAT, gen("A map", finish_reason="length"))
    assert s.value == pytest.approx(0.8)


async def test_thresholds_are_params() -> None:
    text = "I love tea. " * 3
    assert await signs(text) == []  # three copies of 4 tokens: under loop_min_tokens
    assert await signs(text, loop_min_tokens=12) == ["loop"]
    assert await signs(GSM8K_234, MATHS, line_max_repeats=10) == []
    assert await signs(GSM8K_866, MATHS, loop_long_tokens=500) == []


def test_params_are_validated() -> None:
    with pytest.raises(TypeError, match="unknown sign"):
        DegenerationVerifier(penalties={"boredom": 0.5})
    with pytest.raises(TypeError):
        DegenerationVerifier(penalties=[("loop", 0.5)])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        DegenerationVerifier(penalties={"loop": 1.5})
    with pytest.raises(ValueError):
        DegenerationVerifier(penalties={"loop": float("nan")})
    with pytest.raises(ValueError):
        DegenerationVerifier(loop_min_copies=1.5)
    with pytest.raises(TypeError):
        DegenerationVerifier(loop_min_tokens=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        DegenerationVerifier(max_chars=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        DegenerationVerifier(script_min_share=2)
    reg = Registry()
    register_verifiers(reg.register)
    with pytest.raises(VerifierError, match="'degeneration'.*no_such"):
        reg.create("degeneration", {"no_such": 1}, VerifierContext(tier="small"))
    v = reg.create("degeneration", {"penalties": {"script": 0}}, VerifierContext(tier="small"))
    assert v.name == "degeneration"


async def test_the_work_is_capped_on_a_huge_answer() -> None:
    words = [f"w{i % 997}x{i % 13}" for i in range(200_000)]
    text = " ".join(words)
    t0 = time.perf_counter()
    s = await DegenerationVerifier().score(CHAT, gen(text))
    assert time.perf_counter() - t0 < 2.0
    assert s.details["tokens"] < 3_000  # only the last max_chars characters were tokenised
    loop = await DegenerationVerifier().score(CHAT, gen("the " * 100_000))
    assert loop.details["signs"] == ["loop"]


# ---- real model output ----------------------------------------------------------------------


@pytest.fixture(scope="module")
async def smol(smol_path: Path):
    settings = LlamaCppSettings(model=str(smol_path), n_ctx=1024, n_threads=1, n_parallel=2, max_queue=8)
    async with started("small", smol_path, settings) as b:
        yield b


async def test_smollm2_counting_is_not_a_loop(smol: LlamaCppBackend) -> None:
    req = GenerationRequest(prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", max_tokens=48)
    g = await smol.generate(req)
    assert "11, 12, 13" in g.text  # greedy SmolLM2 keeps counting
    s = await DegenerationVerifier().score(req, g)
    assert "loop" not in s.details["signs"] and "repeated_line" not in s.details["signs"]


@pytest.mark.parametrize(
    "request_",
    [
        # greedy SmolLM2 names a few French words, then repeats one phrase until the cap
        GenerationRequest(messages=(Message("user", "What is the capital of France?"),), max_tokens=64),
        # ... and repeats the question back, line after line
        GenerationRequest(messages=(Message("user", "请用中文解释什么是哈希表。"),), max_tokens=96),
        GenerationRequest(prompt="I love you. I love you. I love you.", max_tokens=48),
    ],
)
async def test_smollm2_loops_are_found(smol: LlamaCppBackend, request_: GenerationRequest) -> None:
    g = await smol.generate(request_)
    s = await DegenerationVerifier().score(request_, g)
    assert "loop" in s.details["signs"], (g.text, s.details)
    assert s.value < 0.25


async def test_smollm2_answer_in_chinese_to_an_english_question(smol: LlamaCppBackend) -> None:
    asked_in_chinese = GenerationRequest(messages=(Message("user", "请用中文解释什么是哈希表。"),), max_tokens=24)
    g = await smol.generate(asked_in_chinese)
    s = await DegenerationVerifier(penalties={"loop": 0}).score(asked_in_chinese, g)
    assert "script" not in s.details["signs"]
    # the same real answer, as if the question had been asked in English
    s = await DegenerationVerifier(penalties={"loop": 0}).score(CHAT, g)
    assert "script" in s.details["signs"], (g.text, s.details)


async def test_smollm2_plain_answer_shows_no_sign(smol: LlamaCppBackend) -> None:
    req = GenerationRequest(messages=(Message("user", "Write one sentence about tea."),), max_tokens=64)
    g: Generation = await smol.generate(req)
    assert g.finish_reason == "stop"
    s = await DegenerationVerifier().score(req, g)
    assert s.value == 1.0, (g.text, s.details)
