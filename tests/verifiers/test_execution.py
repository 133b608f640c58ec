"""The `execution` verifier: committed GSM8K answers, abstentions, the sandbox boundary, the second
opinion, and hygiene.

The GSM8K answers are copied verbatim from the committed runs (evals/results/gsm8k): real output
of the default tiers (Qwen2.5-Coder 0.5B "small", 1.5B "large").
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from evals.data import GSM8K_TEST, fetch, read_jsonl
from evals.runner import EvalPlan, run_eval
from evals.store import RunStore
from evals.suites import get_suite
from router.config import VerifierSpec, load_settings
from router.errors import OverloadedError
from router.generation import Generation, GenerationRequest, Message
from tests.support.evals import ScriptedBackend, write_config
from tests.support.scripted import ScriptedBackend as ReplyBackend
from tests.support.scripted import gen
from verifiers.base import Registry, Score, VerifierContext, VerifierError
from verifiers.builtins import CHECKS, register_verifiers
from verifiers.execution import SECOND_OPINION_PROMPT, ExecutionVerifier, agrees, only_defines, program_blocks, runnable
from verifiers.extract import outside_fences

pytestmark = pytest.mark.timeout(120)

# large gsm8k/1036 (right): 10 packs; its program prints 10.0
LARGE_1036 = "To solve this problem, we need to follow these steps:\n\n1. Calculate the total number of apples in the two boxes.\n2. Determine how many packs of eight apples can be made from the total number of apples.\n\nLet's break it down and solve it step by step using Python code.\n```python\n# Step 1: Calculate the total number of apples in the two boxes\napples_per_box = 40\nnumber_of_boxes = 2\ntotal_apples = apples_per_box * number_of_boxes\n\n# Step 2: Determine how many packs of eight apples can be made from the total number of apples\napples_per_pack = 8\nnumber_of_packs = total_apples // apples_per_pack\n\nprint(number_of_packs)\n```\n```output\n10\n```\nThe total number of packs of apples that Uncle Franky can make with the two boxes of apples is \\(\\boxed{10}\\)."
# small gsm8k/591 (right): 220 pounds; its program prints 220.0
SMALL_591 = "To solve this problem, we need to determine the weight of the Mastiff based on the given information. Let's break it down step by step:\n\n1. The Affenpinscher weighs 10 pounds.\n2. The Dachshund weighs twice as much as the Affenpinscher, so \\( D = 2 \\times 10 = 20 \\) pounds.\n3. The Papillon weighs one-fourth as much as the Dachshund, so \\( P = \\frac{1}{4} \\times 20 = 5 \\) pounds.\n4. The Mastiff weighs 44 times the weight of the Papillon, so \\( M = 44 \\times 5 = 220 \\) pounds.\n\nLet's confirm this with Python code.\n```python\n# Given weights\naffenpinscher_weight = 10\ndachshund_weight = 2 * affenpinscher_weight\npapillon_weight = dachshund_weight / 4\nmastiff_weight = 44 * papillon_weight\n\nprint(mastiff_weight)\n```\n```output\n220.0\n```\nThe weight of the Mastiff is \\(\\boxed{220}\\) pounds."
# small gsm8k/28 (wrong): states 5 miles; its program prints -5
SMALL_28 = "To solve this problem, we need to determine the distance Henry traveled between his first and second stops. Let's break it down step by step:\n\n1. Identify the distance Henry traveled after his first stop.\n2. Identify the distance Henry traveled before his second stop.\n3. Subtract the distance traveled after his first stop from the distance traveled before his second stop to find the distance traveled between his first and second stops.\n\nLet's use Python to perform these calculations.\n```python\n# Given distances\ndistance_after_first_stop = 20  # miles\ndistance_before_second_stop = 15  # miles\n\n# Calculate the distance between the first and second stops\ndistance_between_stops = distance_before_second_stop - distance_after_first_stop\nprint(distance_between_stops)\n```\n```output\n5\n```\nHenry traveled \\(\\boxed{5}\\) miles between his first and second stops."
# large gsm8k/600 (right): a sympy program, which the sandbox cannot import
LARGE_600 = "To solve this problem, we need to follow these steps:\n\n1. Determine the new weight after Jamaal increases the original weight by 50%.\n2. Subtract 2 pounds from the new weight to get the final weight.\n\nLet's break it down and implement it in Python using sympy.\n\n```python\nimport sympy as sp\n\n# Define the original weight\noriginal_weight = 8\n\n# Calculate the new weight after increasing by 50%\nnew_weight = original_weight * 1.5\n\n# Calculate the final weight after subtracting 2 pounds\nfinal_weight = new_weight - 2\n\n# Print the final weight\nprint(final_weight)\n```\n```output\n10.0\n```\nThe weight that Jamaal now uses is \\(\\boxed{10}\\) pounds."
# small gsm8k/970 (right): its program misspells a name and raises NameError; its "output" was made up
SMALL_970 = "To solve this problem, we need to follow these steps:\n\n1. Determine the number of players in Carlton's team.\n2. Calculate the number of players in Zeke's team.\n3. Add the number of players from Carlton's and Zeke's teams to get the combined number of players.\n\nLet's break it down step by step:\n\n1. Carlton's team has 13 players.\n2. Zeke's team has 7 more players than Carlton's team. So, Zeke's team has \\(13 + 7 = 20\\) players.\n3. The combined number of players in both teams is the sum of the number of players in Carlton's and Zeke's teams. So, \\(13 + 20 = 33\\).\n\nNow, let's implement this in Python to verify our solution.\n```python\n# Number of players in Carlton's team\ncarlton_players = 13\n\n# Number of players in Zeke's team\nzeke_players = Carlton_players + 7\n\n# Combined number of players in both teams\ncombined_players = Carlton_players + zeke_players\nprint(combined_players)\n```\n```output\n33\n```\nThe combined number of players in both teams is \\(\\boxed{33}\\)."

ASKED = GenerationRequest(messages=(Message("user", "Solve the following math problem."),))


def verifier(**params: Any) -> ExecutionVerifier:
    return ExecutionVerifier(**params)


def program(code: str, after: str = "The answer is \\boxed{42}.") -> str:
    return f"Let me compute it.\n```python\n{code}\n```\n```output\n42\n```\n{after}"


# ---- committed model output ------------------------------------------------------------------


@pytest.mark.slow
async def test_a_program_that_prints_the_stated_answer_agrees() -> None:
    for text, printed, stated in ((LARGE_1036, 10.0, "10"), (SMALL_591, 220.0, "220")):
        s = await verifier().score(ASKED, gen(text))
        assert s.value == 1.0, s
        assert s.details["outcome"] == "agree" and s.details["source"] == "answer"
        assert s.details["result"] == printed and s.details["stated"] == stated
        assert s.details["exit_status"] == 0 and s.details["blocks"] == 1 and s.details["sandbox_s"] > 0


@pytest.mark.slow
async def test_a_program_that_prints_something_else_disagrees() -> None:
    s = await verifier().score(ASKED, gen(SMALL_28))
    assert s.value == 0.0
    assert s.details["outcome"] == "disagree"
    assert s.details["result"] == -5.0 and s.details["stated"] == "5"
    # the answer's own output block claims 5: it is never read as the program's result
    assert "```output\n5\n```" in SMALL_28


@pytest.mark.slow
async def test_a_program_that_does_not_run_scores_crash_score() -> None:
    s = await verifier().score(ASKED, gen(SMALL_970))
    assert s.value == 0.0 and s.details["outcome"] == "exception" and s.details["error"] == "NameError"
    assert s.details["exit_status"] == 1 and s.details["result"] is None
    s = await verifier(crash_score=0.3).score(ASKED, gen(SMALL_970))
    assert s.value == 0.3


@pytest.mark.slow
async def test_a_module_the_sandbox_lacks_abstains() -> None:
    s = await verifier().score(ASKED, gen(LARGE_600))
    assert s.abstained and s.details["outcome"] == "module_unavailable"
    assert s.details["error"] == "ModuleNotFoundError"


# ---- abstentions -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "outcome"),
    [
        ("5 + 3 = 8, so she has \\boxed{8} apples.", "no_program"),
        ("Answer: B", "no_program"),
        # an output block is a claim, and an unlabelled block of a number is one too
        ("```output\n8\n```\nSo \\boxed{8}.", "no_program"),
        ("```\n8.0\n```\nSo \\boxed{8}.", "no_program"),
        # a code answer that only defines a function prints nothing
        ("```python\ndef add(a, b):\n    return a + b\n```", "no_result"),
        # ... or prints an example, and states no final answer
        (
            "```python\ndef add(a, b):\n    return a + b\n\nprint(add(2, 3))\n```\nThis adds two numbers.",
            "no_stated_answer",
        ),
        (program("print(42)", "The answer is \\boxed{forty-two}."), "stated_not_a_number"),
        (program("x = None\nx"), "no_result"),
        # it runs, and prints no number
        (program("def add(a, b):\n    return a + b\n\nadd(2, 3)\nprint('done')"), "no_result"),
    ],
)
async def test_abstains_where_it_does_not_apply(text: str, outcome: str) -> None:
    s = await verifier().score(ASKED, gen(text))
    assert s.abstained, s
    assert s.details["outcome"] == outcome
    assert s.reason.startswith(outcome)


async def test_an_answer_cut_off_inside_its_program_abstains_but_a_broken_one_does_not() -> None:
    text = "```python\ndef f(x):\n    return x + 1\n\nprint(f(3\n```\nSo the answer is \\boxed{4}."
    s = await verifier().score(ASKED, gen(text, finish_reason="length"))
    assert s.abstained and s.details["outcome"] == "cut_off"
    s = await verifier().score(ASKED, gen(text))
    assert s.value == 0.0 and s.details["outcome"] == "syntax_error"


async def test_oversized_programs_are_not_run() -> None:
    s = await verifier().score(ASKED, gen(program("x = 1\n" * 5000 + "print(42)")))
    assert s.abstained and s.details["outcome"] == "too_large" and "exit_status" not in s.details
    s = await verifier().score(ASKED, gen(program("print(42)") + " " * 100_000))
    assert s.abstained and s.details["outcome"] == "too_large"


# ---- reading the program and its result ------------------------------------------------------


def test_program_blocks_and_the_text_outside_them() -> None:
    text = "Intro.\n```python\na = 1\n```\n```output\n1\n```\n```\nprint(a + 1)\n```\n```\n2\n```\nSo \\boxed{2}."
    assert program_blocks(text) == ["a = 1\n", "print(a + 1)\n"]
    assert "a = 1" not in outside_fences(text) and "\\boxed{2}" in outside_fences(text)


def test_only_definitions_are_not_run() -> None:
    assert only_defines('from typing import List\n\ndef f(x: List[int], k=3) -> int:\n    """Doc."""\n    return k\n')
    assert not only_defines("def f():\n    return 1\n\nprint(f())")
    assert not only_defines("@decorate\ndef f():\n    return 1")
    assert not only_defines("def f(x=print(1)):\n    return 1")
    assert not only_defines("class A:\n    print(1)")
    assert not only_defines("def f(:")


def test_a_trailing_expression_is_shown_as_a_notebook_shows_it() -> None:
    shown = runnable("x = 6 * 7\nx")
    assert shown is not None and shown != "x = 6 * 7\nx" and "print(repr(" in shown
    assert runnable("x = 1\nprint(x)") == "x = 1\nprint(x)"
    assert runnable("print(1") is None


@pytest.mark.parametrize(
    ("result", "stated", "agree"),
    [
        ("50.0", "50", True),
        ("33.333333333333336", "33.33", True),
        ("33.333333333333336", "33", False),
        ("-5", "5", False),
    ],
)
def test_agrees(result: str, stated: str, agree: bool) -> None:
    assert agrees(result, stated) is agree


@pytest.mark.slow
async def test_several_blocks_run_as_notebook_cells_and_the_last_number_printed_counts() -> None:
    text = "```python\nprice = 4\nprint(price)\n```\nThen:\n```python\ntotal = price * 3\ntotal\n```\nSo \\boxed{12}."
    s = await verifier().score(ASKED, gen(text))
    assert s.value == 1.0 and s.details["blocks"] == 2 and s.details["result"] == 12.0


@pytest.mark.slow
async def test_a_program_that_never_ends_times_out() -> None:
    t0 = time.monotonic()
    s = await verifier(timeout_s=1.0).score(ASKED, gen(program("while True:\n    pass")))
    assert s.value == 0.0 and s.details["outcome"] == "timeout"
    assert time.monotonic() - t0 < 10


# ---- the sandbox boundary --------------------------------------------------------------------


@pytest.mark.slow
async def test_a_program_cannot_read_or_write_host_files(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("731\n")
    code = f"print(open({str(secret)!r}).read())"
    s = await verifier().score(ASKED, gen(program(code, "The answer is \\boxed{731}.")))
    assert s.value == 0.0 and s.details["outcome"] == "exception" and s.details["result"] is None
    marker = tmp_path / "written"
    code = f"open({str(marker)!r}, 'w').write('x')\nprint(42)"
    s = await verifier().score(ASKED, gen(program(code)))
    assert s.value == 0.0 and s.details["outcome"] == "exception"
    assert not marker.exists()


@pytest.mark.slow
async def test_a_program_cannot_reach_the_network() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint(42)"
        s = await verifier().score(ASKED, gen(program(code)))
    finally:
        stop.set()
        thread.join(2)
        server.close()
    assert s.value == 0.0 and s.details["outcome"] == "exception" and s.details["result"] is None
    assert accepted == []


@pytest.mark.slow
async def test_what_a_program_prints_never_reaches_the_score_text() -> None:
    code = "import sys\nprint('LEAKED-SECRET', file=sys.stderr)\nprint('LEAKED-SECRET 42')\nraise KeyError('LEAKED-SECRET')"
    for text in (program(code), program(code.rsplit("\n", 1)[0])):
        s = await verifier().score(ASKED, gen(text))
        assert "LEAKED" not in s.reason and "LEAKED" not in json.dumps(s.details)
    assert s.value == 1.0  # the second ran without raising, and printed 42


@pytest.mark.slow
async def test_at_most_max_concurrency_sandboxes_then_a_bounded_queue() -> None:
    v = verifier(max_concurrency=1, max_queue=1)
    slow = gen(program("import time\ntime.sleep(1.0)\nprint(42)"))
    first = asyncio.create_task(v.score(ASKED, slow))
    second = asyncio.create_task(v.score(ASKED, slow))
    await asyncio.sleep(0.3)
    with pytest.raises(OverloadedError):
        await v.score(ASKED, slow)
    assert [s.value for s in await asyncio.gather(first, second)] == [1.0, 1.0]


# ---- the second opinion ----------------------------------------------------------------------


def second(reply: str) -> tuple[ExecutionVerifier, ReplyBackend]:
    backend = ReplyBackend("small", lambda r: reply, prompt_tokens=40, completion_tokens=20, busy_s=0.5)
    return ExecutionVerifier(second_opinion=True, ctx=VerifierContext(tier="small", backend=backend)), backend


QUESTION = GenerationRequest(messages=(Message("user", "Tom has 3 apples and buys 4 more. How many now?"),))


@pytest.mark.slow
async def test_second_opinion_agreeing_and_its_cost() -> None:
    v, backend = second("```python\napples = 3 + 4\nprint(apples)\n```")
    s = await v.score(QUESTION, gen("He has \\boxed{7} apples."))
    assert s.value == 1.0 and s.details["source"] == "second_opinion" and s.details["outcome"] == "agree"
    assert s.cost.prompt_tokens == 40 and s.cost.completion_tokens == 20 and s.cost.seconds > 0
    assert s.cost.tier == "small"
    [asked] = backend.requests
    assert "Tom has 3 apples" in asked.last_user_text() and "single number" in asked.last_user_text()
    assert asked.last_user_text() == SECOND_OPINION_PROMPT.format(problem=QUESTION.last_user_text())


@pytest.mark.slow
async def test_second_opinion_disagreeing() -> None:
    v, _ = second("```python\nprint(3 * 4)\n```")
    s = await v.score(QUESTION, gen("He has \\boxed{7} apples."))
    assert s.value == 0.0 and s.details["outcome"] == "disagree" and s.details["result"] == 12.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reply", "outcome"),
    [("Seven.", "no_second_program"), ("```python\nprint(undefined)\n```", "exception")],
)
async def test_second_opinion_that_gives_nothing_abstains_but_is_charged(reply: str, outcome: str) -> None:
    v, _ = second(reply)
    s = await v.score(QUESTION, gen("He has \\boxed{7} apples."))
    assert s.abstained and s.details["outcome"] == outcome
    assert s.cost.completion_tokens == 20


@pytest.mark.slow
async def test_second_opinion_is_not_asked_without_a_numeric_answer_or_when_off() -> None:
    v, backend = second("```python\nprint(7)\n```")
    for text in ("He has some apples.", "Answer: B"):
        s = await v.score(QUESTION, gen(text))
        assert s.abstained and s.cost.completion_tokens == 0
    off = ExecutionVerifier(ctx=v.ctx)
    s = await off.score(QUESTION, gen("He has \\boxed{7} apples."))
    assert s.abstained and s.details["outcome"] == "no_program"
    # an answer with its own program is checked by that program, not a second one
    s = await v.score(QUESTION, gen(program("print(42)")))
    assert s.value == 1.0 and s.details["source"] == "answer"
    assert backend.requests == []


# ---- real SmolLM2 output --------------------------------------------------------------------


@pytest.fixture(scope="module")
async def smol(smol_path: Path):
    from router.backends.llama.backend import LlamaCppBackend
    from router.config import LlamaCppSettings

    b = LlamaCppBackend(
        "small",
        smol_path,
        LlamaCppSettings(model=str(smol_path), n_ctx=1024, n_threads=1, n_parallel=2, max_queue=8),
        512,
    )
    await b.start()
    yield b
    await b.close()


@pytest.mark.timeout(900)
async def test_second_opinion_from_smollm2(smol: Any) -> None:
    """The test model writes the second program; whatever it writes, the verdict follows from
    running it, and its generation is charged."""
    # a generous deadline: on a shared two-core machine 64 tokens can take minutes
    v = ExecutionVerifier(
        second_opinion=True, max_tokens=64, generation_timeout_s=800, ctx=VerifierContext(tier="small", backend=smol)
    )
    s = await v.score(QUESTION, gen("He has \\boxed{7} apples."))
    assert s.details["source"] == "second_opinion"
    assert 0 < s.cost.completion_tokens <= 64 and s.cost.prompt_tokens > 20 and s.cost.seconds > 0
    assert s.cost.tier == "small"
    outcome = s.details["outcome"]
    if outcome == "agree":
        assert s.value == 1.0 and s.details["result"] == 7.0
    elif outcome == "disagree":
        assert s.value == 0.0 and s.details["result"] != 7.0
    else:
        assert s.abstained, s
        assert outcome in ("no_second_program", "no_result", "exception", "syntax_error", "timeout", "crashed")
    if outcome != "no_second_program":
        assert s.details["blocks"] >= 1 and s.details["code_chars"] > 0
        # it ran in the sandbox, unless it only defines functions (then it could print nothing)
        assert "exit_status" in s.details or "only defines" in s.reason


# ---- registration and params -----------------------------------------------------------------


def test_registered_as_a_builtin_with_its_sandbox_check() -> None:
    reg = Registry()
    register_verifiers(reg.register)
    made = reg.create("execution", {"second_opinion": True, "timeout_s": 5}, VerifierContext(tier="small"))
    assert isinstance(made, ExecutionVerifier) and made.second_opinion and made.timeout_s == 5
    assert CHECKS["execution"]() is None  # the sandbox works here
    for bad in ({"second_opinion": "yes"}, {"timeout_s": 0}, {"crash_score": 2.0}, {"nope": 1}, {"ctx": None}):
        with pytest.raises(VerifierError):
            reg.create("execution", bad, VerifierContext(tier="small"))


# ---- hygiene: the grader's reference never reaches the verifier ------------------------------


class Recording:
    """The real execution verifier, recording what it is given."""

    def __init__(self, inner: ExecutionVerifier, seen: list[tuple[GenerationRequest, Generation]]) -> None:
        self.inner, self.seen, self.name = inner, seen, inner.name

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        self.seen.append((request, candidate))
        return await self.inner.score(request, candidate)


@pytest.mark.slow
async def test_gsm8k_reference_never_reaches_the_verifier_nor_its_second_opinion(tmp_path: Path) -> None:
    seen: list[tuple[GenerationRequest, Generation]] = []
    reg = Registry()

    def make(params: dict[str, Any], ctx: VerifierContext) -> Recording:
        return Recording(ExecutionVerifier(**params, ctx=ctx), seen)

    reg.register("execution", make)

    def reply(request: GenerationRequest) -> str:
        if request.last_user_text().startswith("Write a short Python program"):
            return "```python\nprint(1)\n```"
        return "The answer is \\boxed{1}."

    suite = get_suite("gsm8k")
    items = suite.select(suite.load(), 3, 0)
    plan = EvalPlan(
        suite=suite,
        items=items,
        settings=load_settings(
            write_config(tmp_path, verifier='name = "execution"\nparams = { second_opinion = true }')
        ),
        tiers=["small", "large"],
        verifiers=[VerifierSpec(name="execution", params={"second_opinion": True})],
    )
    backends = {"small": ScriptedBackend("small", reply), "large": ScriptedBackend("large", reply)}
    with RunStore(tmp_path / "runs" / "gsm8k") as store:
        summary = await run_eval(plan, store, registry=reg, backends=backends)
    assert summary.failed == []
    assert len(seen) >= 6  # every answer of both tiers
    asked = [r for b in backends.values() for r in b.requests]
    second_opinions = [r for r in asked if r.last_user_text().startswith("Write a short Python program")]
    assert len(second_opinions) == len(seen)  # the verifier did ask its tier, once per answer it scored
    rows = list(read_jsonl(fetch(GSM8K_TEST)))
    for req in [r for r, _ in seen] + asked:
        text = repr(req) + json.dumps(req.metadata, default=str)
        assert "####" not in text
        row = next(r for r in rows if r["question"].strip() in req.last_user_text())
        assert row["answer"].split("####")[0].strip()[:60] not in text
