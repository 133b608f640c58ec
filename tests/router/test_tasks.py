"""Task detection on real prompts, and the policies per task: config, fallback, the engine's wiring."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from evals.suites import get_suite
from router import policy
from router import tasks as tasks_module
from router.bench.workload import PROMPTS
from router.config import load_settings
from router.engine import Engine
from router.errors import ConfigError
from router.generation import GenerationRequest, Message
from router.tasks import TASKS, TaskLabel, detect_task, task_of_suite
from tests.support.config import write_config
from tests.support.model import SMOL


def chat(text: str, **metadata: object) -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", text),), metadata=dict(metadata))


# The everyday prompts the issue measured with (a new user's first requests), as a user writes them.
EVERYDAY = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "How does a hash map work?",
    "Give me some tips for writing maintainable code.",
    "Explain the water cycle to a seven-year-old.",
    "Compare SQL and NoSQL databases: when would you choose each?",
    "Outline the plot of a heist film set in a museum.",
    "How do I make a good cup of tea?",
    "I think option A is better than option B here. What do you think about the trade-offs?",
]


@pytest.mark.slow
@pytest.mark.parametrize("suite_name", ["gsm8k", "humaneval", "mmlu"])
def test_the_rules_label_every_suite_item_as_its_suites_task(suite_name: str) -> None:
    suite = get_suite(suite_name)
    items = suite.load()
    if suite_name == "mmlu":
        items = suite.select(items, 600, 0)
    want = task_of_suite(suite.task)
    got = Counter(detect_task(GenerationRequest(messages=it.messages)).task for it in items)
    assert got == {want: len(items)}, got


@pytest.mark.slow
def test_gsm8k_questions_without_the_suites_instruction_are_still_maths() -> None:
    items = get_suite("gsm8k").load()
    bare = [it.messages[-1].content.split("\n\n", 1)[1] for it in items]
    maths = sum(detect_task(chat(q)).task == "maths" for q in bare)
    assert maths / len(bare) >= 0.99


@pytest.mark.parametrize("text", EVERYDAY)
def test_everyday_chat_is_open_ended(text: str) -> None:
    label = detect_task(chat(text))
    assert label == TaskLabel("open_ended", "no rule applies")


@pytest.mark.parametrize(
    ("text", "task", "why"),
    [
        ("Write a Python function that checks whether a string is a palindrome.", "code", "asks for code"),
        ("Fix this:\n```python\nprint('hi'\n```", "code", "fenced code"),
        ("def add(a, b):\n    '''Return a + b.'''\n", "code", "code stub"),
        ("Rewrite with a list comprehension:\nresult = []\nfor x in range(10):\n    result.append(x)", "code", "lines"),
        ("What is 17 * 23?", "maths", "arithmetic"),
        ("A train travels 120 km in 1.5 hours. What is its average speed?", "maths", "word problem"),
        ("Which is a prime?\nA. 4\nB. 6\nC. 7\nD. 9", "choice", "option list A-D"),
        ("Pick one:\n(a) red\n(b) blue", "choice", "option list A-B"),
        ("Is the sky green? Reply with the letter of the correct option only.", "choice", "asks for a letter"),
    ],
)
def test_rules_and_their_reasons(text: str, task: str, why: str) -> None:
    label = detect_task(chat(text))
    assert label.task == task and why in label.why, label


def test_structured_comes_from_the_requests_fields_first() -> None:
    options = "Which?\nA. x\nB. y"  # a rule on the text would say choice; the fields say more
    assert detect_task(chat(options, response_format="json_schema")) == TaskLabel(
        "structured", "response_format json_schema"
    )
    assert detect_task(chat("Hi", tools=2)) == TaskLabel("structured", "2 tool(s)")


def test_mentions_of_options_or_one_lettered_line_are_not_a_choice() -> None:
    assert detect_task(chat("Plan A. Leave early.\nWhat do you think?")).task == "open_ended"
    assert detect_task(chat("Options:\nB. second\nC. third")).task == "open_ended"  # no A: not a list from A


def test_the_last_user_message_decides() -> None:
    request = GenerationRequest(
        messages=(
            Message("user", "What is 2 + 2?"),
            Message("assistant", "4"),
            Message("user", "Thanks! Now tell me a story about a cat."),
        )
    )
    assert detect_task(request).task == "open_ended"


def test_a_huge_request_is_read_in_bounded_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every rule's pattern is handed the clipped text, never the whole 4 MB (asserted on what the
    # patterns read, not on a wall-clock time).
    read: list[int] = []

    class Recording:
        def __init__(self, pattern: re.Pattern[str]) -> None:
            self.pattern = pattern

        def __getattr__(self, name: str) -> Any:
            method = getattr(self.pattern, name)

            def call(text: str, *args: Any, **kwargs: Any) -> Any:
                read.append(len(text))
                return method(text, *args, **kwargs)

            return call

    for name, value in list(vars(tasks_module).items()):
        if isinstance(value, re.Pattern):
            monkeypatch.setattr(tasks_module, name, Recording(value))
    blob = ("lorem ipsum dolor sit amet " * 40 + "\n") * 3700  # ~4 MB, the API's largest request
    label = detect_task(chat(blob + "\nWhich is right?\nA. one\nB. two"))
    assert label.task == "choice"  # the tail, where the question sits, is read
    assert read and max(read) <= 2 * (tasks_module._HEAD_CHARS + tasks_module._TAIL_CHARS + 1)


class Scripted:
    def __init__(self, label: str, probability: float) -> None:
        self.answer = (label, probability)
        self.seen: list[str] = []

    def predict(self, text: str) -> tuple[str, float]:
        self.seen.append(text)
        return self.answer


def test_the_classifier_decides_only_what_no_rule_claims_and_only_when_sure() -> None:
    sure = Scripted("maths", 0.97)
    assert detect_task(chat("Tell me about Gauss."), sure) == TaskLabel("maths", "classifier 0.97")
    assert detect_task(chat("What is 3 * 4?"), sure).why == "arithmetic expression"
    assert len(sure.seen) == 1  # a rule's request never reaches the classifier
    unsure = detect_task(chat("Tell me about Gauss."), Scripted("maths", 0.4))
    assert unsure.task == "open_ended" and "unsure" in unsure.why
    assert detect_task(chat("Hi"), Scripted("poetry", 0.99)).task == "open_ended"  # not a task name


def test_suite_tasks_map_onto_the_five() -> None:
    assert [task_of_suite(k) for k in ("math", "code", "choice", "text", "other")] == [
        "maths",
        "code",
        "choice",
        "open_ended",
        "open_ended",
    ]
    assert set(TASKS) == {"structured", "choice", "code", "maths", "open_ended"}


TIER = """
[[tiers]]
name = "small"
backend = "llamacpp"
threshold = 0.8
combine = "min"
[tiers.llamacpp]
model = "{model}"
[tiers.price]
usd_per_hour = 0.1
[[tiers.verifiers]]
name = "confidence"
{tasks}
"""


def config(tmp_path: Path, tasks: str) -> Path:
    return write_config(tmp_path / "config.toml", TIER.format(model=SMOL, tasks=tasks))


def test_a_task_policy_falls_back_field_by_field_to_the_tier(tmp_path: Path) -> None:
    tasks = """
[tiers.tasks.maths]
threshold = 0.6
[tiers.tasks.open_ended]
combine = "mean"
[[tiers.tasks.open_ended.verifiers]]
name = "degeneration"
[tiers.tasks.code]
verifiers = []
"""
    tier = load_settings(config(tmp_path, tasks)).tiers[0]
    maths = policy.task_policy(tier, "maths")
    assert (maths.threshold, maths.combine, [v.name for v in maths.verifiers], maths.task) == (
        0.6,
        "min",
        ["confidence"],
        "maths",
    )
    chat_policy = policy.task_policy(tier, "open_ended")
    assert (chat_policy.threshold, chat_policy.combine, [v.name for v in chat_policy.verifiers]) == (
        0.8,
        "mean",
        ["degeneration"],
    )
    assert policy.task_policy(tier, "code").verifiers == ()  # an empty list is a choice: accept all
    own = policy.task_policy(tier, "choice")  # no policy: the tier's own
    assert (own.threshold, own.combine, [v.name for v in own.verifiers], own.task) == (0.8, "min", ["confidence"], None)
    assert policy.task_policy(tier, None) == own


@pytest.mark.parametrize(
    ("tasks", "key"),
    [
        ("[tiers.tasks.poetry]\nthreshold = 0.5", "tasks.poetry"),
        ("[tiers.tasks.maths]\nthreshold = 1.5", "tasks.maths.threshold"),
        ("[tiers.tasks.maths]\nthreshhold = 0.5", "tasks.maths.threshhold"),
        ('[tiers.tasks.maths]\ncombine = "max"', "tasks.maths.combine"),
    ],
)
def test_bad_task_policies_are_refused_naming_the_key(tmp_path: Path, tasks: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_settings(config(tmp_path, tasks))


def test_an_unknown_verifier_in_a_task_policy_stops_the_start(tmp_path: Path) -> None:
    settings = load_settings(config(tmp_path, '[[tiers.tasks.code.verifiers]]\nname = "nosuch"'))
    with pytest.raises(ConfigError, match=r"tasks\.code\.verifiers\[0\]\.name: unknown verifier 'nosuch'"):
        Engine.from_settings(settings)


def test_the_engine_builds_each_tiers_policies(tmp_path: Path, smol_path: Path) -> None:
    tasks = '[tiers.tasks.maths]\nthreshold = 0.6\n[[tiers.tasks.open_ended.verifiers]]\nname = "degeneration"\n'
    engine = Engine.from_settings(load_settings(config(tmp_path, tasks)))
    tier = engine.cascade.tiers[0]
    maths, chat_judge, own = tier.judge("maths"), tier.judge("open_ended"), tier.judge("choice")
    assert (maths.threshold, maths.task, maths.verifiers.combine) == (0.6, "maths", "min")
    assert maths.verifiers.members == tier.verifiers.members  # the tier's own verifiers, shared
    assert [m.verifier.name for m in chat_judge.verifiers.members] == ["degeneration"]
    assert (own.threshold, own.task, own.verifiers) == (0.8, None, tier.verifiers)


def test_the_shipped_config_judges_open_ended_answers_by_their_constraints_else_degeneration() -> None:
    small = load_settings().tier("small")
    chat_policy = policy.task_policy(small, "open_ended")
    # docs/eval/open-ended-policy.md: where the prompt states no constraint, degeneration alone at 0.5
    assert [v.name for v in chat_policy.verifiers] == ["instructions", "degeneration"] and chat_policy.threshold == 0.5
    assert policy.task_policy(small, "maths").threshold == small.threshold  # calibrated on GSM8K


def test_bench_prompts_cover_every_rule_task() -> None:
    tasks = Counter(detect_task(GenerationRequest(prompt=p)).task for p in PROMPTS)
    assert set(tasks) == {"code", "maths", "open_ended"}


def test_the_readmes_escalate_all_policy_rejects_every_answer(tmp_path: Path, smol_path: Path) -> None:
    import asyncio

    from router.generation import Generation

    readme = (Path(__file__).resolve().parents[2] / "docs" / "task-policies.md").read_text()
    snippet = readme.split("# escalate every open-ended request: a check no answer passes\n", 1)[1].split("```", 1)[0]
    engine = Engine.from_settings(load_settings(config(tmp_path, snippet)))
    judge = engine.cascade.tiers[0].judge("open_ended")
    answer = Generation("A fine answer.", "stop", 5, 4, None, 0.1)
    verdict = asyncio.run(judge.verifiers.score(chat("Tell me a story."), answer))
    assert judge.threshold == 1.0 and not policy.accepts(verdict.score, judge.threshold)


def test_the_overhead_bench_without_verifiers_drops_the_task_policies_too(tmp_path: Path) -> None:
    from router.bench.instant_server import instant_settings

    served = instant_settings(load_settings(), verifiers="none", ledger_path=tmp_path / "l.sqlite3")
    assert all(not t.verifiers and not t.tasks for t in served.tiers)


def test_the_engine_labels_what_no_rule_claims_with_the_committed_classifier(tmp_path: Path, smol_path: Path) -> None:
    engine = Engine.from_settings(load_settings(config(tmp_path, "")))
    asked = GenerationRequest(messages=(Message("user", "Tell me a joke about penguins"),))
    assert engine.cascade.classifier is not None
    assert engine.cascade.detect(asked).why.startswith("classifier")  # no rule claims it
    (tmp_path / "off").mkdir()
    path = write_config(
        tmp_path / "off" / "config.toml", TIER.format(model=SMOL, tasks="") + "[cascade]\ntask_classifier = false\n"
    )
    off = Engine.from_settings(load_settings(path))
    assert off.cascade.classifier is None
    assert off.cascade.detect(asked) == TaskLabel("open_ended", "no rule applies")
