"""The Banking77 suite: its items as the committed data has them, its grader on answers whose verdict
is known (right in the forms a model writes a label, wrong, empty, truncated, and answers that
quote the instructions or list every label), and its stratified selection at any limit."""

from __future__ import annotations

import asyncio
import collections
import time

import pytest

from evals.grading import Grade
from evals.suites import get_suite
from evals.suites.banking77 import Banking77, normalise_label
from evals.suites.base import Item

SUITE = get_suite("banking77")
ITEMS = SUITE.load()
BY_LABEL: dict[str, list[Item]] = collections.defaultdict(list)
for _it in ITEMS:
    BY_LABEL[_it.answer_key.reference].append(_it)


def grade(item: Item, text: str) -> Grade:
    return asyncio.run(SUITE.grade_answer(item, text, cut_off=False))


def test_the_items_are_the_3080_test_messages_40_per_label_under_one_system_prompt() -> None:
    assert isinstance(SUITE, Banking77) and len(ITEMS) == 3080
    labels = SUITE.labels()
    assert len(labels) == 77 and set(BY_LABEL) == set(labels)
    assert {len(v) for v in BY_LABEL.values()} == {40}
    assert len({it.id for it in ITEMS}) == 3080
    systems = {it.messages[0].content for it in ITEMS}  # one text: a tier's prefix cache holds it
    (system,) = systems
    assert all(label in system.splitlines() for label in labels)
    assert all(
        it.messages[1].role == "user" and it.messages[1].content == it.messages[1].content.strip() for it in ITEMS
    )
    assert all(it.group == it.answer_key.reference for it in ITEMS)
    # the grader's reference never reaches the request: only the label list every item shares
    assert all(it.answer_key.reference not in it.messages[1].content for it in ITEMS[:200])


@pytest.mark.parametrize(
    "text",
    [
        "card_arrival",
        " card_arrival\n",
        "Card_Arrival",
        "`card_arrival`",
        '"card_arrival"',
        "'card_arrival'.",
        "card_arrival.",
    ],
)
def test_the_label_alone_is_right_in_the_forms_a_model_writes_it(text: str) -> None:
    g = grade(BY_LABEL["card_arrival"][0], text)
    assert g.correct and g.extracted == "card_arrival" and g.detail == ""


def test_the_one_capitalised_label_can_be_graded_right() -> None:
    # the data's own label is Refund_not_showing_up: compared lower-cased on one side only, the 40
    # items of that label could never be right (suite versions 1 and 2)
    item = BY_LABEL["Refund_not_showing_up"][0]
    for text in ("Refund_not_showing_up", "refund_not_showing_up"):
        g = grade(item, text)
        assert g.correct and g.detail == "", text
    assert grade(BY_LABEL["card_arrival"][0], "Refund_not_showing_up").detail == ""  # a label, the wrong one


def test_another_label_is_wrong_but_a_label() -> None:
    g = grade(BY_LABEL["card_arrival"][0], "card_linking")
    assert not g.correct and g.extracted == "card_linking" and g.detail == ""


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "card_arr",  # cut off by max_tokens
        "The intent is card_arrival",
        "card_arrival\ncard_linking",
        "**card_arrival**",
        "card arrival",
    ],
)
def test_empty_truncated_or_wordy_answers_are_wrong_and_not_a_label(text: str) -> None:
    g = grade(BY_LABEL["card_arrival"][0], text)
    assert not g.correct and g.detail == "not a label"


def test_answers_that_quote_the_instructions_or_list_every_label_are_wrong() -> None:
    item = BY_LABEL["card_arrival"][0]
    system = item.messages[0].content
    for text in (system, "\n".join(SUITE.labels()), item.messages[1].content, "card_arrival " * 10_000):
        g = grade(item, text)
        assert not g.correct and g.detail == "not a label"
        assert g.extracted is not None and len(g.extracted) <= 80


def test_normalise_label_trims_only_the_wrapping_in_one_pass() -> None:
    assert normalise_label("  `'card_arrival'`.  ") == "card_arrival"
    assert normalise_label('"card_arrival".') == normalise_label("`card_arrival`.") == "card_arrival"
    assert normalise_label("card_arrival:") == "card_arrival:"  # not a label: no other punctuation is dropped
    assert normalise_label("beneficiary_not_allowed") == "beneficiary_not_allowed"
    assert all(label == label.strip(" `'\".") for label in SUITE.labels())
    t0 = time.monotonic()
    assert (
        normalise_label("'." * 1_000_000) == ""
    )  # wrapping that a loop trimming one layer at a time takes minutes over
    assert time.monotonic() - t0 < 1


def test_selection_is_stratified_by_label_at_every_limit() -> None:
    for limit in (77, 154, 770):
        picked = SUITE.select(ITEMS, limit, seed=0)
        counts = collections.Counter(it.group for it in picked)
        assert len(picked) == limit and len(counts) == 77 and set(counts.values()) == {limit // 77}
    # a limit between multiples: no label has two more than another
    counts = collections.Counter(it.group for it in SUITE.select(ITEMS, 100, seed=0))
    assert len(counts) == 77 and max(counts.values()) - min(counts.values()) <= 1
    # a limit under 77: that many labels, one item each
    assert len({it.group for it in SUITE.select(ITEMS, 30, seed=0)}) == 30


def test_selection_is_prefix_stable_deterministic_and_seeded() -> None:
    big = SUITE.select(ITEMS, 770, seed=0)
    assert [it.id for it in SUITE.select(ITEMS, 100, seed=0)] == [it.id for it in big[:100]]
    assert [it.id for it in SUITE.select(ITEMS, 770, seed=0)] == [it.id for it in big]  # same seed, same draw
    assert [it.id for it in get_suite("banking77").select(ITEMS, 770, seed=0)] == [it.id for it in big]
    other = SUITE.select(ITEMS, 770, seed=1)
    assert {it.id for it in other} != {it.id for it in big}
    everything = SUITE.select(ITEMS, None, seed=0)
    assert sorted(it.id for it in everything) == sorted(it.id for it in ITEMS)
    assert len({it.id for it in big}) == 770
