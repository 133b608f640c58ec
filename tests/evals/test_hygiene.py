"""A verifier never sees what the grader sees: not the reference answer, not HumanEval's tests.

A spy verifier and a scripted backend record every request the runner sends them, on real
HumanEval and GSM8K items and on a JSONL suite with a marked reference, and none of it may carry
any part of the answer key."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from evals.data import GSM8K_TEST, HUMANEVAL, fetch, read_jsonl
from evals.runner import EvalPlan, run_eval
from evals.store import RunStore
from evals.suites import get_suite
from router.backends.base import ContinuationScore
from router.config import VerifierSpec, load_settings
from router.generation import Generation, GenerationRequest
from tests.support.evals import Calls, ScriptedBackend, registry, write_config
from verifiers.base import Score
from verifiers.code_tests import CodeTestsVerifier
from verifiers.code_tests.stated import stated_examples


def everything_in(request: GenerationRequest) -> str:
    return repr(request) + json.dumps(request.metadata, default=str)


@dataclass
class RecordingCodeTests:
    """The real `code_tests`, keeping what it was given and what it scored."""

    seen: list[tuple[GenerationRequest, Score]] = field(default_factory=list)
    name: str = "code_tests"

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        score = await CodeTestsVerifier().score(request, candidate)
        self.seen.append((request, score))
        return score


async def run_suite(tmp_path: Path, suite_name: str, n: int, specs: list[VerifierSpec], reg, backends) -> list:
    """The first `n` items of the suite through the eval runner, every tier scored with `specs`."""
    suite = get_suite(suite_name)
    items = suite.select(suite.load(), n, 0)
    plan = EvalPlan(
        suite=suite,
        items=items,
        settings=load_settings(write_config(tmp_path)),
        tiers=["small", "large"],
        verifiers=specs,
    )
    with RunStore(tmp_path / "runs" / suite.name) as store:
        summary = await run_eval(plan, store, registry=reg, backends=backends)
    assert summary.failed == []
    return items


async def spy_run(
    tmp_path: Path, suite_name: str, reply, n: int, code_tests: RecordingCodeTests | None = None
) -> tuple[Calls, dict[str, ScriptedBackend], list]:
    calls = Calls()
    reg = registry(calls)
    specs = [VerifierSpec(name="spy")]
    if code_tests is not None:
        reg.register("code_tests", lambda params, ctx: code_tests)
        specs.append(VerifierSpec(name="code_tests"))
    backends = {"small": ScriptedBackend("small", reply), "large": ScriptedBackend("large", reply)}
    items = await run_suite(tmp_path, suite_name, n, specs, reg, backends)
    return calls, backends, items


@pytest.mark.slow
async def test_humaneval_tests_never_reach_a_verifier(tmp_path: Path) -> None:
    rows = {r["task_id"]: r for r in read_jsonl(fetch(HUMANEVAL))}

    def reply(request: GenerationRequest) -> str:
        prompt = next(r for r in rows.values() if r["prompt"] in request.last_user_text())
        return "```python\n" + prompt["prompt"] + prompt["canonical_solution"] + "```"

    # 8 items: HumanEval/149 and /121 have no >>>, /121 states its examples in prose
    code_tests = RecordingCodeTests()
    calls, backends, items = await spy_run(tmp_path, "humaneval", reply, 8, code_tests)
    seen = [(req, cand) for spy in calls.spies for req, cand in spy.seen]
    requests = [req for req, _ in seen] + [req for req, _ in code_tests.seen]
    requests += [r for b in backends.values() for r in b.requests]
    assert len(seen) == len(code_tests.seen) == 16
    for req in requests:
        text = everything_in(req)
        row = next(r for r in rows.values() if r["prompt"] in req.last_user_text())
        assert row["test"].strip() not in text
        assert "def check(candidate)" not in text
        assert row["canonical_solution"].strip() not in text
        assert set(req.metadata) == {"task", "client_code"} and "tests" not in req.metadata
    # code_tests ran the examples it read from the prompt (in prose where there is no >>>), and the
    # reference solutions pass them
    for req, score in code_tests.seen:
        row = next(r for r in rows.values() if r["prompt"] in req.last_user_text())
        assert stated_examples(req.last_user_text()) == stated_examples(row["prompt"])
        assert score.value == (0.5 if score.reason == "no_tests" else 1.0)  # HumanEval/149: none to read
    prose = [s for req, s in code_tests.seen if ">>>" not in req.last_user_text() and s.reason != "no_tests"]
    assert [s.details["total"] for s in prose] == [3, 3]  # HumanEval/121 on both tiers
    # the grader did see the tests: canonical solutions pass them
    store = RunStore(tmp_path / "runs" / "humaneval")
    assert all(g.correct for g in store.grades.records.values())


async def test_gsm8k_solutions_never_reach_a_verifier(tmp_path: Path) -> None:
    rows = list(read_jsonl(fetch(GSM8K_TEST)))
    calls, backends, items = await spy_run(tmp_path, "gsm8k", lambda r: "\\boxed{1}", 4)
    for spy in calls.spies:
        for req, _ in spy.seen:
            text = everything_in(req)
            assert "####" not in text
            row = next(r for r in rows if r["question"].strip() in req.last_user_text())
            assert row["answer"].split("####")[0].strip()[:60] not in text


async def test_jsonl_reference_never_reaches_a_verifier(tmp_path: Path) -> None:
    path = tmp_path / "secret.jsonl"
    path.write_text(
        "\n".join(
            json.dumps({"id": f"s{i}", "prompt": f"Say hi {i}", "reference": f"SECRET-{i}", "grader": "exact"})
            for i in range(3)
        )
        + "\n"
    )
    calls, backends, _ = await spy_run(tmp_path, str(path), lambda r: "hi", 3)
    seen = [req for spy in calls.spies for req, _ in spy.seen]
    assert len(seen) == 6
    for req in seen + [r for b in backends.values() for r in b.requests]:
        assert "SECRET" not in everything_in(req)


async def test_structured_reference_never_reaches_a_verifier(tmp_path: Path) -> None:
    rows = {r["id"]: r for r in read_jsonl(Path(__file__).parents[2] / "evals" / "data" / "structured.jsonl")}
    calls, backends, items = await spy_run(tmp_path, "structured", lambda r: "{}", 6)
    seen = [req for spy in calls.spies for req, _ in spy.seen]
    assert len(seen) == 12
    for req in seen + [r for b in backends.values() for r in b.requests]:
        text = everything_in(req)
        row = next(r for r in rows.values() if r["text"] in req.last_user_text())
        # the schema is the caller's (in the message and as the response_format); the object is not
        assert req.response_format is not None and req.response_format.schema == row["schema"]
        assert set(req.metadata) == {"task", "client_code", "response_format"}
        for form in (json.dumps(row["reference"]), json.dumps(row["reference"], ensure_ascii=False)):
            assert form not in text
        assert "reference" not in json.dumps(req.metadata)


class ReadingBackend(ScriptedBackend):
    """A scripted tier that can also read a given answer (what `cross_tier` asks of the next tier),
    keeping every request and answer it was given to read."""

    def __init__(self, name: str, reply) -> None:
        super().__init__(name, reply)
        self.read: list[tuple[GenerationRequest, str]] = []

    async def score_continuation(self, request: GenerationRequest, continuation: str) -> ContinuationScore:
        self.read.append((request, continuation))
        n = max(1, len(continuation.split()))
        return ContinuationScore((-0.1,) * n, (True,) * n, prompt_tokens=n + 10, continuation_tokens=n, seconds=0.0)


async def model_using_run(tmp_path: Path, suite_name: str, reply, specs: list[VerifierSpec]):
    """The real verifiers that ask a tier's model for work, on real items, through the runner: what
    they were handed, and everything their own requests to the tiers carried."""
    from router.plugins import VerifierRegistry

    seen: list[GenerationRequest] = []
    builtins = VerifierRegistry.from_entry_points()
    reg = registry()
    for spec in specs:
        make = builtins.get(spec.name)

        def recording(params, ctx, make=make):
            inner = make(params, ctx)

            class Recording:
                name = inner.name

                async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
                    seen.append(request)
                    return await inner.score(request, candidate)

            return Recording()

        reg.register(spec.name, recording)
    backends = {"small": ReadingBackend("small", reply), "large": ReadingBackend("large", reply)}
    items = await run_suite(tmp_path, suite_name, 3, specs, reg, backends)
    asked = [r for b in backends.values() for r in b.requests]
    read = [r for b in backends.values() for r, _ in b.read]
    return items, seen, asked, read


async def test_gsm8k_solutions_never_reach_the_verifiers_that_ask_a_model(tmp_path: Path) -> None:
    """self_consistency's samples and cross_tier's reading by the next tier carry the request a
    caller would send, never the solution."""
    specs = [
        VerifierSpec(name="self_consistency", params={"k": 2}),
        VerifierSpec(name="cross_tier", params={"tier": "large"}),
    ]
    items, seen, asked, read = await model_using_run(tmp_path, "gsm8k", lambda r: "\\boxed{1}", specs)
    assert len(seen) >= 2 * 3 * 2  # both verifiers, every answer of both tiers
    assert len(asked) > 2 * 3 and read  # the samples were asked, the answers were read
    rows = list(read_jsonl(fetch(GSM8K_TEST)))
    for req in seen + asked + read:
        text = everything_in(req)
        assert "####" not in text
        row = next(r for r in rows if r["question"].strip() in req.last_user_text())
        assert row["answer"].split("####")[0].strip()[:60] not in text


@pytest.mark.slow
async def test_mmlu_answer_key_never_reaches_choice_or_cross_tier(tmp_path: Path) -> None:
    specs = [VerifierSpec(name="choice"), VerifierSpec(name="cross_tier", params={"tier": "large"})]
    items, seen, asked, read = await model_using_run(tmp_path, "mmlu", lambda r: "A", specs)
    assert len(seen) == 2 * 3 * 2 and read
    for req in seen + asked + read:
        assert not {"reference", "answer_key", "correct_answer", "letters"} & set(req.metadata)
        text = everything_in(req)
        assert "AnswerKey" not in text and "correct_answer" not in text


async def test_ifeval_answer_key_never_reaches_the_instructions_verifier(tmp_path: Path) -> None:
    """The `instructions` verifier reads constraints from the prompt; IFEval's key (the ids and
    arguments of each item's instructions) stays with the grader."""
    specs = [VerifierSpec(name="instructions")]
    items, seen, asked, _ = await model_using_run(tmp_path, "ifeval", lambda r: "a short answer", specs)
    assert len(seen) == 2 * 3  # both tiers' answers to 3 items
    for req in seen + asked:
        assert set(req.metadata) == {"task", "client_code"}
        text = everything_in(req)
        item = next(i for i in items if i.messages[0].content == req.last_user_text())
        for instruction in item.answer_key.reference["instructions"]:
            assert instruction["id"] not in text  # "punctuation:no_comma", ...
        assert "AnswerKey" not in text and "instruction_id_list" not in text


async def test_the_instructions_verifier_scores_the_same_with_the_answer_key_beside_it() -> None:
    """Were it to read the request's metadata, a key placed there would move its score: on 40
    IFEval items, a key that contradicts the prompt (every instruction swapped for another kind)
    changes nothing."""
    from evals.suites.ifeval import IFEval
    from verifiers.instructions import InstructionsVerifier

    verifier = InstructionsVerifier()
    items = IFEval().load()[:40]
    candidate = Generation('"A short answer, in quotes."', "stop", 10, 10, None, 0.0)
    for item in items:
        plain = GenerationRequest(messages=item.messages, metadata={"task": "text", "client_code": False})
        key = {"instructions": [{"id": "startend:quotation", "kwargs": {}}], "reference": item.answer_key.reference}
        poisoned = plain.with_(metadata={**plain.metadata, "answer_key": key, "instructions": key["instructions"]})
        a, b = await verifier.score(plain, candidate), await verifier.score(poisoned, candidate)
        assert (a.value, a.reason, a.details) == (b.value, b.reason, b.details), item.id


def test_the_instructions_verifier_has_no_code_that_reads_grader_fields() -> None:
    """What the verifier may read of a request is its messages and prompt: no file of it names
    the request's metadata or an answer key, so none can start to without this test failing."""
    import ast

    package = Path(__file__).resolve().parents[2] / "verifiers" / "instructions"
    forbidden = {"metadata", "answer_key", "reference", "AnswerKey"}
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {a.name.split(".")[-1] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not names & forbidden, (path.name, names & forbidden)
        assert "evals" not in {
            n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
        }
