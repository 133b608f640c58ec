"""IFEval's grader (`evals.ifeval_checks`) against the published grading, and on answers built to fool it.

The reference is a third party's strict grading of GPT-4's published answers with the authors'
checkers (`eval_results_strict.jsonl`, 540 prompts, `follow_instruction_list`). Our checks are
written from the paper's definitions, not copied, so they part from it where its code and the
instruction's meaning part; each such answer is listed in `KNOWN` with who is wrong and why, and a
disagreement not listed fails the test, as does any kind falling below its threshold.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from evals.ifeval_agreement import grading_agreement, rows
from evals.ifeval_checks import KINDS, InstructionError, follows
from evals.suites.ifeval import IFEval
from verifiers.instructions import text as units
from verifiers.instructions.language import detect

DATA = Path(__file__).resolve().parents[2] / "evals" / "data" / "ifeval"

# (prompt key, kind): why we and the published grading disagree on GPT-4's answer
KNOWN = {
    (2341, "change_case:english_capital"): "theirs: langdetect does not call the one-word answer 'YES' English",
    (2571, "change_case:english_capital"): "theirs: langdetect does not call the answer 'A' English",
    (1843, "change_case:english_lowercase"): "theirs: langdetect on three words ('coastal elegance properties')",
    (202, "change_case:english_lowercase"): "theirs: langdetect on one word ('etchings')",
    (2359, "combination:repeat_prompt"): "ours is stricter: the answer repeats the request and never answers it",
    (1122, "keywords:letter_frequency"): "theirs: their checker replaces the asked character '#' by a random letter",
    (1129, "keywords:letter_frequency"): "theirs: their checker replaces the asked character '!' by a random letter",
    (1954, "length_constraints:nth_paragraph_first_word"): "theirs: 'Summary:' is read as the word 'summary:'",
}
# per kind: the share of instructions that must agree (every other kind: all of them)
THRESHOLDS = {
    "change_case:english_capital": 23 / 25,
    "change_case:english_lowercase": 37 / 39,
    "combination:repeat_prompt": 40 / 41,
    "keywords:letter_frequency": 31 / 33,
    "length_constraints:nth_paragraph_first_word": 11 / 12,
}


def _rows(name: str) -> list[dict]:
    return rows(name)


def test_agreement_with_the_published_strict_grading_per_kind() -> None:
    measured = grading_agreement()
    total, agree, differ = measured.total, measured.agree, measured.differ
    assert set(total) == set(KINDS)  # all 25 kinds are graded
    assert sum(total.values()) == 832
    for kind in total:
        share = agree[kind] / total[kind]
        assert share >= THRESHOLDS.get(kind, 1.0), f"{kind}: {agree[kind]}/{total[kind]} agree"
    unexplained = set(differ) - set(KNOWN)
    assert not unexplained, f"disagreements nobody explained: {sorted(unexplained)}"
    assert sum(agree.values()) / sum(total.values()) >= 0.98  # 824 of 832 (99.0%)


def test_gpt4_prompt_level_strict_accuracy_is_the_published_one_within_a_point() -> None:
    items = {r["prompt"]: r for r in _rows("input_data.jsonl")}
    graded = _rows("eval_results_strict.jsonl")
    ours = [
        all(follows(k, a, g["response"], prompt=g["prompt"]) for k, a in zip(*_key(items[g["prompt"]]), strict=True))
        for g in graded
    ]
    published = sum(g["follow_all_instructions"] for g in graded) / len(graded)
    assert published == pytest.approx(0.7685, abs=1e-4)
    assert abs(sum(ours) / len(ours) - published) <= 0.012  # ours 0.7796: the answers listed in KNOWN


def _key(item: dict) -> tuple[list[str], list[dict]]:
    return item["instruction_id_list"], item["kwargs"]


# --- known answers, kind by kind ------------------------------------------------------------------

CASES = [
    ("punctuation:no_comma", {}, "No commas here.", True),
    ("punctuation:no_comma", {}, "One, two.", False),
    ("punctuation:no_comma", {}, "中文，逗号", False),
    ("change_case:english_lowercase", {}, "the dog is in the house and it is happy.", True),
    ("change_case:english_lowercase", {}, "The dog is in the house.", False),
    ("change_case:english_lowercase", {}, "der hund ist in dem haus und will nicht raus.", False),
    ("change_case:english_capital", {}, "THE DOG IS IN THE HOUSE.", True),
    ("change_case:english_capital", {}, "THE DOG IS In THE HOUSE.", False),
    (
        "change_case:capital_word_frequency",
        {"capital_relation": "at least", "capital_frequency": 3},
        "I LOVE NASA",
        True,
    ),
    (
        "change_case:capital_word_frequency",
        {"capital_relation": "less than", "capital_frequency": 2},
        "DON'T go",
        False,
    ),
    ("language:response_language", {"language": "hi"}, "कुत्ता घर में है और बाहर नहीं जाना चाहता है।", True),
    ("language:response_language", {"language": "mr"}, "कुत्ता घर में है और बाहर नहीं जाना चाहता है।", False),
    ("language:response_language", {"language": "de"}, "The dog is in the house.", False),
    ("length_constraints:number_words", {"relation": "at least", "num_words": 3}, "one two three", True),
    ("length_constraints:number_words", {"relation": "less than", "num_words": 3}, "one two three", False),
    ("length_constraints:number_sentences", {"relation": "less than", "num_sentences": 3}, "One. Two. Three.", False),
    (
        "length_constraints:number_sentences",
        {"relation": "at least", "num_sentences": 2},
        "Dr. Smith came. He sat.",
        True,
    ),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First.\n***\nSecond.", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First.\n***\n***\nSecond.", False),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "summary"},
        "Intro.\n\n**Summary:** done.",
        True,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "summary"},
        "Intro.\n\nIn summary, done.",
        False,
    ),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], at [address].", True),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name,\nat] home.", False),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\n\nP.S. bye", True),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\n\nP.S. bye", False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two\n- three", False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n---\n* two", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and **two**", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and ** **", False),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "SECTION 1\na\nSECTION 2\nb",
        True,
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "Section 1\na\nSection 2",
        False,
    ),
    ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', True),
    ("detectable_format:json_format", {}, '{"a": 1} and some words after', False),
    ("detectable_format:title", {}, "<<A Title>>\nbody", True),
    ("detectable_format:title", {}, "<< >> body", False),
    ("detectable_format:constrained_response", {}, "My answer is maybe.", True),
    ("detectable_format:constrained_response", {}, "Maybe.", False),
    ("combination:two_responses", {}, "One.\n******\nTwo.", True),
    ("combination:two_responses", {}, "Same.\n******\nSame.", False),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "say hi. Hi!", True),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "Say hi.", False),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "Sure! Say hi. Hi!", False),
    ("keywords:existence", {"keywords": ["riddle", "lion"]}, "Riddles of the lion.", True),
    ("keywords:existence", {"keywords": ["cat"]}, "A category of dogs.", False),
    ("keywords:forbidden_words", {"forbidden_words": ["bad"]}, "Not good at all.", True),
    ("keywords:forbidden_words", {"forbidden_words": ["bad"]}, "That was BAD.", False),
    ("keywords:frequency", {"keyword": "war", "relation": "at least", "frequency": 2}, "war and wars", True),
    ("keywords:frequency", {"keyword": "war", "relation": "less than", "frequency": 2}, "war, war", False),
    ("keywords:letter_frequency", {"letter": "#", "let_relation": "at least", "let_frequency": 2}, "#a #b", True),
    ("keywords:letter_frequency", {"letter": "q", "let_relation": "less than", "let_frequency": 1}, "Quiet", False),
    ("startend:end_checker", {"end_phrase": "Any questions?"}, 'Done. Any questions?"', True),
    ("startend:end_checker", {"end_phrase": "Any questions?"}, "Any questions? Bye.", False),
    ("startend:quotation", {}, '"All of it."', True),
    ("startend:quotation", {}, '"Half of it.', False),
]


@pytest.mark.parametrize(("kind", "kwargs", "answer", "expected"), CASES)
def test_known_answers(kind: str, kwargs: dict, answer: str, expected: bool) -> None:
    assert follows(kind, kwargs, answer) is expected


def test_every_kind_has_a_right_and_a_wrong_known_answer() -> None:
    for kind in KINDS:
        outcomes = {expected for k, _, _, expected in CASES if k == kind}
        assert outcomes == {True, False}, kind


@pytest.mark.parametrize("answer", ["", "   \n\t "])
def test_an_empty_answer_follows_no_instruction(answer: str) -> None:
    # even those an absence satisfies: no commas, fewer than 5 sentences, no forbidden word
    for kind, kwargs, _, _ in CASES:
        assert follows(kind, kwargs, answer) is False, kind


def test_arguments_are_checked() -> None:
    with pytest.raises(InstructionError, match="unknown instruction kind"):
        follows("punctuation:no_semicolon", {}, "x")
    with pytest.raises(InstructionError, match="num_words"):
        follows("length_constraints:number_words", {"relation": "at least"}, "x")
    with pytest.raises(InstructionError, match="relation"):
        follows("length_constraints:number_words", {"relation": "exactly", "num_words": 3}, "x")
    with pytest.raises(InstructionError, match="num_bullets"):
        follows("detectable_format:number_bullet_lists", {"num_bullets": True}, "x")
    with pytest.raises(InstructionError, match="num_bullets"):
        follows("detectable_format:number_bullet_lists", {"num_bullets": True}, "")  # empty answers too
    with pytest.raises(InstructionError, match="must be a string"):
        follows("punctuation:no_comma", {}, None)  # type: ignore[arg-type]


# --- how words, sentences and languages are counted ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("One sentence. Another one!", 2),
        ("Is it? Yes.", 2),
        ("Dr. Smith met Mr. Jones in the U.S. yesterday.", 1),
        ("We use tools, e.g. hammers. They help.", 2),
        ("It was cheap etc. The end.", 2),
        ("J. R. R. Tolkien wrote it.", 1),
        ("Pi is 3.14 exactly. Right.", 2),
        ("Wait... then it happened. I... am here.", 2),
        ("A heading\nwithout a stop\n\nthen text.", 1),  # a line break alone ends nothing
        ("1. First item\n2. Second item", 3),  # "1." before a capitalised item ends one, as in Punkt
        ('He said "Go." Then left.', 2),
        ("", 0),
    ],
)
def test_sentences_are_counted_as_documented(text: str, n: int) -> None:
    assert len(units.sentences(text)) == n


def test_words_and_capital_words() -> None:
    assert units.words("don't stop-now 3.5") == 6
    # I, LOVE, NASA ('s is lowercase), DO, N'T, USA, COVID-19
    assert units.capital_words("I LOVE NASA's DON'T (USA) COVID-19 Hello") == 7
    assert units.first_word('"**Hello,** world"') == "hello"


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("El perro come la comida en la casa y no quiere salir.", "es"),
        ("Le chat est sur la table et il ne veut pas descendre.", "fr"),
        ("Der Hund ist in dem Haus und will nicht raus.", "de"),
        ("Il cane è nella casa e non vuole uscire.", "it"),
        ("O cão está em casa e não quer sair.", "pt"),
        ("Koira on talossa eikä se halua lähteä ulos.", "fi"),
        ("Mbwa yuko ndani ya nyumba na hataki kutoka.", "sw"),
        ("Con chó đang ở trong nhà và không muốn ra ngoài.", "vi"),
        ("Собака в доме и не хочет выходить.", "ru"),
        ("Кучето е в къщата и не иска да излезе.", "bg"),
        ("कुत्ता घर में है और बाहर नहीं जाना चाहता है।", "hi"),
        ("कुत्रा घरात आहे आणि त्याला बाहेर जायचे नाही.", "mr"),
        ("कुकुर घरमा छ र बाहिर जान चाहँदैन।", "ne"),
        ("الكلب في المنزل ولا يريد الخروج.", "ar"),
        ("سگ در خانه است و نمی‌خواهد بیرون برود.", "fa"),
        ("کتا گھر میں ہے اور باہر نہیں جانا چاہتا۔", "ur"),
        ("犬は家の中にいて、外に出たくない。", "ja"),
        ("狗在房子里，不想出去。", "zh"),
        ("개가 집에 있고 밖에 나가고 싶지 않아요.", "ko"),
        ("ನಾಯಿ ಮನೆಯಲ್ಲಿದೆ.", "kn"),
        ("สุนัขอยู่ในบ้าน", "th"),
        ("The dog is in the house and does not want to go out.", "en"),
        ("YES", "en"),
        ("12345 !!!", None),
    ],
)
def test_languages(text: str, language: str | None) -> None:
    assert detect(text) == language


# --- the suite's grade on answers built to fool it -------------------------------------------------


@pytest.fixture(scope="module")
def suite_items() -> tuple[IFEval, dict[int, object], dict[int, str]]:
    suite = IFEval()
    items = {int(i.id.split("/")[1]): i for i in suite.load()}
    answers = [
        json.loads(line)["response"] for line in (DATA / "input_response_data_gpt4_20231107_145030.jsonl").open()
    ]
    keys = [json.loads(line)["key"] for line in (DATA / "input_data.jsonl").open()]
    return suite, items, dict(zip(keys, answers, strict=True))


async def test_right_wrong_empty_and_truncated_answers(suite_items) -> None:
    suite, items, gpt4 = suite_items
    item = items[1943]  # 5 steps separated by ***, ending with "Let me know how it works. ..."
    answer = gpt4[1943]
    assert (await suite.grade(item, answer)).correct
    assert not (await suite.grade(item, answer.replace("***", "", 1))).correct  # wrong: 4 parts
    assert not (await suite.grade(item, "")).correct  # empty
    cut = await suite.grade(item, answer[: len(answer) // 2])  # cut off at max_tokens
    assert not cut.correct
    assert json.loads(cut.detail) == {"length_constraints:number_paragraphs": False, "startend:end_checker": False}


async def test_an_answer_that_quotes_the_instructions_is_wrong(suite_items) -> None:
    """IFEval's checks pass a quoted "include the keywords X": 118 of the 541 prompts would be
    followed by answering with the prompt itself. A restated prompt follows nothing here."""
    suite, items, gpt4 = suite_items
    for item in items.values():
        prompt = item.answer_key.reference["prompt"]
        assert not (await suite.grade(item, prompt)).correct, item.id
        assert not (await suite.grade(item, f"Sure! You asked: {prompt}\n\n{prompt}")).correct, item.id
    # a requested repetition is not a restatement: GPT-4's answers to these repeat, then answer
    for key in (1139, 1281, 1546, 16):
        assert (await suite.grade(items[key], gpt4[key])).correct, key


N = 250_000  # a quadratic check takes hours on this; a linear one, a fraction of a second
ADVERSARIAL = {
    "brackets": "[" * N,  # a lazy "\\[.*?\\]" retries every "[" to the end of the line
    "asterisks": "*" * N,
    "periods": "a." * (N // 2),
    "dots": "." * N + "a",  # a nested quantifier over this took exponential time
    "sentence ends": ". " * (N // 2),
    "angles": "<<" * (N // 2),  # as "<<(.+?)>>" does every "<<"
    "sections": "SECTION " * (N // 8),
    "dividers": "***\n" * (N // 4),
    "letters": "x" * N,
    "quotes": '"' * N,
}

ARGS = {kind: kwargs for kind, kwargs, _, _ in CASES}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_huge_answers_are_graded_in_linear_time(name: str) -> None:
    text = ADVERSARIAL[name]
    started = time.process_time()
    for kind, kwargs in ARGS.items():
        follows(kind, kwargs, text)
    assert time.process_time() - started < 10  # all 25 checks on 250 kB: about a second at most


def test_json_nested_past_the_recursion_limit_is_not_json() -> None:
    deep = "[" * 200_000 + "]" * 200_000
    assert follows("detectable_format:json_format", {}, deep) is False
    assert follows("detectable_format:json_format", {}, "```json\n" + deep + "\n```") is False
    assert follows("detectable_format:json_format", {}, "[" * 50 + "]" * 50) is True
