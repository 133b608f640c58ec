"""The `instructions` verifier: its reader of constraints measured against IFEval's answer key, and
its score on answers that follow, miss, restate or overwhelm what the request asked.

The measurement reads the key (`instruction_id_list`, `kwargs`); the verifier never does: it is
handed a request built from the prompt alone, and tests/evals/test_hygiene.py checks that an eval
run hands it nothing more.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from evals.ifeval_agreement import STATS, reader_accuracy, rows
from evals.ifeval_checks import follows
from evals.measures import auroc
from router.generation import Generation, GenerationRequest, Message
from verifiers.base import VerifierContext
from verifiers.builtins import BUILTINS
from verifiers.instructions import InstructionsVerifier
from verifiers.instructions.parse import read_constraints, request_to_repeat

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "evals" / "data" / "ifeval"

# Floors for the reader's precision and recall, per kind, on IFEval's 541 prompts (kind found;
# kind with the key's exact arguments). Many "false positives" are constraints the prompt states
# and the key omits ("Answer in all caps" in 3221, "include the word 'desert'" in 3025).
OVERALL = {"kind_precision": 0.97, "kind_recall": 0.98, "args_precision": 0.96, "args_recall": 0.97}
FLOORS: dict[str, tuple[float, float, float, float]] = {  # kind P, kind R, args P, args R
    "change_case:capital_word_frequency": (0.92, 1.0, 0.92, 1.0),
    "change_case:english_capital": (0.96, 1.0, 0.96, 1.0),
    "change_case:english_lowercase": (0.92, 1.0, 0.92, 1.0),
    "combination:repeat_prompt": (1.0, 0.97, 1.0, 0.97),
    "detectable_format:number_bullet_lists": (1.0, 0.96, 1.0, 0.96),
    "detectable_format:number_highlighted_sections": (1.0, 0.97, 0.97, 0.95),
    "keywords:existence": (0.83, 0.91, 0.80, 0.89),
    "keywords:forbidden_words": (0.95, 1.0, 0.95, 1.0),
    "keywords:frequency": (0.94, 0.94, 0.92, 0.92),
    "keywords:letter_frequency": (0.96, 1.0, 0.93, 0.96),
    "language:response_language": (0.96, 1.0, 0.96, 1.0),
    "length_constraints:number_paragraphs": (1.0, 0.96, 1.0, 0.96),
    "length_constraints:number_sentences": (1.0, 1.0, 0.96, 0.96),
    "length_constraints:number_words": (0.93, 0.97, 0.92, 0.96),
    "startend:quotation": (1.0, 0.97, 1.0, 0.97),
}  # every other kind: 1.0 throughout


def _rows(name: str) -> list[dict]:
    return rows(name)


def test_the_reader_against_ifevals_answer_key() -> None:
    measured = reader_accuracy()
    for stat, floor in OVERALL.items():
        assert measured[""][stat] >= floor, (stat, measured[""])
    for kind, stats in measured.items():
        if kind:
            floors = FLOORS.get(kind, (1.0, 1.0, 1.0, 1.0))
            for name, floor in zip(STATS, floors, strict=True):
                assert stats[name] >= floor, (kind, name, stats)
    assert len(measured) == 26  # all 25 kinds are read on some prompt


# --- reading the phrases people use ----------------------------------------------------------------

PHRASES = [
    ("Do not use any commas in your response.", "punctuation:no_comma", {}),
    ("Write at least 300 words.", "length_constraints:number_words", {"relation": "at least", "num_words": 300}),
    ("Keep it 100 words or less.", "length_constraints:number_words", {"relation": "less than", "num_words": 101}),
    ("Wrap your entire response with double quotation marks.", "startend:quotation", {}),
    ("Your answer must be in all lowercase letters.", "change_case:english_lowercase", {}),
    ("Answer in English, in all capital letters.", "change_case:english_capital", {}),
    ("Include exactly 3 bullet points in markdown.", "detectable_format:number_bullet_lists", {"num_bullets": 3}),
    (
        'End your response with the exact phrase "Any other questions?"',
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
    ),
    ("Include the keywords 'alpha' and 'beta'.", "keywords:existence", {"keywords": ["alpha", "beta"]}),
    ("Please respond only in Hindi, no other language is allowed.", "language:response_language", {"language": "hi"}),
    ("Wrap the entire output in JSON format.", "detectable_format:json_format", {}),
    (
        "Your response must have 3 sections. Mark the beginning of each section with SECTION X.",
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 3},
    ),
    (
        "Include at least 2 placeholders represented by square brackets, such as [address].",
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
    ),
    ("At the end, add a postscript starting with P.S.", "detectable_content:postscript", {"postscript_marker": "P.S."}),
    (
        "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>.",
        "detectable_format:title",
        {},
    ),
    (
        "Highlight at least 2 sections with markdown, i.e. *highlighted section*.",
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
    ),
    ("Do not include the words 'sad' or 'bad'.", "keywords:forbidden_words", {"forbidden_words": ["sad", "bad"]}),
    (
        "The word fiesta should appear at least twice.",
        "keywords:frequency",
        {"keyword": "fiesta", "relation": "at least", "frequency": 2},
    ),
    (
        "Make sure the letter q appears less than 5 times.",
        "keywords:letter_frequency",
        {"letter": "q", "let_relation": "less than", "let_frequency": 5},
    ),
    ("Give two different responses separated by 6 asterisk symbols ******.", "combination:two_responses", {}),
    (
        "There should be 2 paragraphs, separated by the markdown divider: ***",
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
    ),
    (
        "Answer with fewer than 5 sentences.",
        "length_constraints:number_sentences",
        {"relation": "less than", "num_sentences": 5},
    ),
    (
        "Answer with one of: My answer is yes. My answer is no. My answer is maybe.",
        "detectable_format:constrained_response",
        {},
    ),
]


@pytest.mark.parametrize(("prompt", "kind", "args"), PHRASES)
def test_phrases_are_read(prompt: str, kind: str, args: dict) -> None:
    found = read_constraints("Write about the sea. " + prompt)
    assert [(c.kind, c.args) for c in found] == [(kind, args)]


def test_the_request_to_repeat_is_read() -> None:
    prompt = "Write a haiku about rain.\nFirst repeat the request word for word without change, then give your answer."
    assert request_to_repeat(prompt) == "Write a haiku about rain."
    before = "Before you answer, repeat the request below exactly.\n\nWrite a haiku about rain."
    assert request_to_repeat(before) == "Write a haiku about rain."
    assert request_to_repeat("Write a haiku about rain.") is None


def test_plain_requests_state_no_constraint() -> None:
    """The verifier abstains on traffic that states nothing checkable: the committed open-ended
    prompts (1 of 1,122 read as constrained: "under 200 words", which it is) and GSM8K-style
    questions."""
    rows = _rows_at(ROOT / "evals" / "data" / "open_ended_prompts.jsonl")
    read = [r["text"] for r in rows if read_constraints(r["text"])]
    assert read == ["Write a flash fiction piece, under 200 words, about the last day of summer."]
    question = (
        "Cars have lined up on the motorway. 5 cars from the line take an exit so they don't have to drive "
        "through the traffic jam. How many cars drove through?"
    )
    assert read_constraints(question) == []


def _rows_at(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- scoring -------------------------------------------------------------------------------------


def answer(text: str, finish: str = "stop") -> Generation:
    return Generation(text, finish, prompt_tokens=10, completion_tokens=10, token_logprobs=None, latency_s=0.0)


def ask(prompt: str, **kwargs: Any) -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", prompt),), **kwargs)


PROMPT = "Write a poem about the sea. Do not use any commas. Wrap your entire response with double quotation marks."


async def test_scores_the_fraction_of_instructions_followed() -> None:
    v = InstructionsVerifier()
    both = await v.score(ask(PROMPT), answer('"The sea is wide and blue"'))
    assert both.value == 1.0 and both.details["total"] == 2
    one = await v.score(ask(PROMPT), answer('"The sea, wide and blue"'))
    assert one.value == 0.5 and "punctuation:no_comma" in one.reason
    assert (await InstructionsVerifier(stat="all").score(ask(PROMPT), answer('"The sea, wide"'))).value == 0.0


async def test_abstains_without_instructions() -> None:
    score = await InstructionsVerifier().score(ask("Write a poem about the sea."), answer("The sea."))
    assert score.abstained


async def test_wrong_empty_and_truncated_answers() -> None:
    v = InstructionsVerifier()
    assert (await v.score(ask(PROMPT), answer("The sea, the sea"))).value == 0.0  # wrong: both missed
    assert (await v.score(ask(PROMPT), answer(""))).value == 0.0  # empty: follows nothing
    cut = await v.score(ask(PROMPT), answer('"The sea is wide and', finish="length"))  # cut before the quote
    assert cut.value == 0.5


async def test_an_answer_that_restates_the_request_scores_zero() -> None:
    prompt = "Write a story about a cat. Include the keywords 'whisker' and 'moon'. Do not use any commas in the story."
    v = InstructionsVerifier()
    quoted = await v.score(ask(prompt), answer(prompt))  # "contains" the keywords and no comma
    assert quoted.value == 0.0 and quoted.details["restates_prompt"]
    real = await v.score(ask(prompt), answer("The cat sat under the moon and cleaned a whisker."))
    assert real.value == 1.0


async def test_reads_the_system_message_and_the_last_user_turn_only() -> None:
    v = InstructionsVerifier()
    request = GenerationRequest(
        messages=(
            Message("system", "Always answer in all lowercase letters."),
            Message("user", "Do not use any commas."),
            Message("assistant", "ok"),
            Message("user", "Name a fruit."),
        )
    )
    score = await v.score(request, answer("an apple, surely"))  # lowercase: yes; the old comma rule is gone
    assert [c["kind"] for c in score.details["constraints"]] == ["change_case:english_lowercase"]
    assert score.value == 1.0


async def test_never_reads_the_request_metadata() -> None:
    """An eval harness (or a client) may put anything in the metadata, an answer key included: the
    score is the same with it and without it."""
    v = InstructionsVerifier()
    key = {"instructions": [{"id": "startend:quotation", "kwargs": {}}], "reference": "SECRET"}
    plain = await v.score(ask("Do not use any commas."), answer("No commas here"))
    poisoned = await v.score(
        ask("Do not use any commas.", metadata={"task": "text", "answer_key": key}), answer("No commas here")
    )
    assert (plain.value, plain.reason, plain.details) == (poisoned.value, poisoned.reason, poisoned.details)


async def test_a_huge_answer_is_checked_off_the_loop_and_an_oversized_one_unread() -> None:
    v = InstructionsVerifier()
    started = time.process_time()
    big = await v.score(ask(PROMPT), answer('"' + "wave " * 30_000 + '"'))
    assert big.value == 1.0 and time.process_time() - started < 10
    over = await InstructionsVerifier(max_chars=1000).score(ask(PROMPT), answer("x" * 1001))
    assert over.value == 0.0 and "max_chars" in over.reason


def test_params_are_checked() -> None:
    with pytest.raises(ValueError, match="stat"):
        InstructionsVerifier(stat="mean")
    with pytest.raises(TypeError, match="max_chars"):
        InstructionsVerifier(max_chars=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        BUILTINS["instructions"]({"threshold": 1}, VerifierContext(tier="small"))
    made = BUILTINS["instructions"]({"stat": "all"}, VerifierContext(tier="small"))
    assert isinstance(made, InstructionsVerifier) and made.stat == "all"


async def test_it_ranks_gpt4s_ifeval_answers_as_the_grader_does() -> None:
    """On GPT-4's 541 published answers (the prompts the reader was written against, so this is
    in-sample): the fraction ranks right answers above wrong ones with AUROC 0.996 (``all``:
    0.994), and ``all`` agrees with the grader on 99.1% of the answers it scores."""
    rows = _rows("input_data.jsonl")
    answers = [r["response"] for r in _rows("input_response_data_gpt4_20231107_145030.jsonl")]
    fraction, strict = InstructionsVerifier(), InstructionsVerifier(stat="all")
    labels, by_fraction, by_all = [], [], []
    for row, text in zip(rows, answers, strict=True):
        request = ask(row["prompt"])
        f = await fraction.score(request, answer(text))
        if f.abstained:
            continue
        labels.append(
            all(
                follows(k, a, text, prompt=row["prompt"])
                for k, a in zip(row["instruction_id_list"], row["kwargs"], strict=True)
            )
        )
        by_fraction.append(f.value)
        by_all.append((await strict.score(request, answer(text))).value)
    assert len(labels) >= 535  # it abstains on 2 of 541
    assert auroc(labels, by_fraction) >= 0.99
    assert auroc(labels, by_all) >= 0.99
    assert sum((s == 1.0) == ok for s, ok in zip(by_all, labels, strict=True)) / len(labels) >= 0.98


HOSTILE_PROMPTS = {
    "forbidden words": "Do not use the word " * 50_000,
    "quotes": '"' * 1_000_000,
    "keyword lists": "include the keywords 'a', " * 40_000,
    "dots": "." * 1_000_000 + "a",
    "sections": "Section 1 and Section 2 " * 40_000,
    "repeats": "repeat the request " * 50_000,
    # each of these took seconds of one core before its reader was bounded (a quantity tried at
    # every position of a long run: 20,000 digits before "placeholder" 15 s, "words 1 ..." 2.7 s)
    "digits": "1" * 1_000_000,
    "counted words": "words 1 " * 125_000,
    "word heads": "word " * 200_000,
    "placeholders": "1 placeholder " * 70_000,
    "between": "between 1 and " * 70_000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE_PROMPTS))
async def test_a_huge_or_hostile_prompt_is_read_in_bounded_time(name: str) -> None:
    started = time.process_time()
    score = await InstructionsVerifier().score(ask(HOSTILE_PROMPTS[name]), answer("A short answer."))
    assert score.value is None or 0.0 <= score.value <= 1.0
    # read on its first and last 10,000 characters, each reader linear in them: CPU time, so a
    # loaded machine does not fail it (the worst of these takes about 0.1 s here)
    assert time.process_time() - started < 1.5
