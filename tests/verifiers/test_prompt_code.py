"""A prompt's code runs only for callers with the tests permission (issue 26, item 5).

Every hostile construct below writes a marker to the box's stderr and then raises, if it runs. So
it is seen from outside the box two ways: the verifier's score (a load error, 0) and the run's
stderr, which the verifier logs at DEBUG. Without the permission neither shows; with it, the
prompt's definitions go in as written and the marker shows, as documented.
"""

from __future__ import annotations

import logging

import httpx
import pytest

from router.api.app import create_app
from router.config import load_settings
from router.generation import GenerationRequest, Message
from tests.support.config import smol_config
from tests.support.scripted import ScriptedBackend, gen
from tests.support.servers import UvicornThread
from verifiers.code_tests import CodeTestsVerifier
from verifiers.code_tests.verifier import assemble_program
from verifiers.prompt_code import build_program, safe_definitions
from verifiers.sandbox import available

pytestmark = pytest.mark.timeout(120)
needs_box = pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")

MARK = "PROMPT-CODE-RAN"
RUN = f"(__import__('sys').stderr.write('{MARK}') and 1 / 0)"  # the marker, then a load error

# one construct per way Python runs code when it reaches a definition
HOSTILE = {
    "default": f"def helper(_={RUN}):\n    pass\n",
    "keyword default": f"def helper(*, _={RUN}):\n    pass\n",
    "decorator": f"@(lambda fn: {RUN})\ndef helper():\n    pass\n",
    "decorator from an import": "import atexit\n\n@atexit.register\ndef helper():\n    " + RUN + "\n",
    "annotation": f"def helper(x: {RUN}) -> int:\n    return 1\n",
    "return annotation": f"def helper() -> {RUN}:\n    return 1\n",
    "class body": f"class Helper:\n    x = {RUN}\n",
    "class base": f"class Helper({RUN}):\n    pass\n",
    "metaclass": f"class Helper(metaclass=lambda *a: {RUN}):\n    pass\n",
    "base the prompt defines": (
        f"class Base:\n    def __init_subclass__(cls):\n        {RUN}\n\nclass Helper(Base):\n    pass\n"
    ),
    "decorator the prompt defines": f"def property(fn):\n    {RUN}\n\nclass Helper:\n    @property\n    def x(self):\n        return 1\n",
    "class annotation": f"class Helper:\n    x: {RUN} = 1\n",
    "enum member": f"from enum import Enum\n\nclass Helper(Enum):\n    A = 1\n    def __init__(self, v):\n        {RUN}\n",
    "base through the program itself": (
        f"class Base:\n    def __init_subclass__(cls):\n        {RUN}\n\n"
        "from solution import Base as B\n\nclass Helper(B):\n    pass\n"
    ),
    "annotation through sys.modules": (
        f"from sys import modules\n\nclass T:\n    def __class_getitem__(cls, k):\n        {RUN}\n\n"
        "def helper(x: modules['solution'].T[0]):\n    pass\n"
    ),
    # ast.literal_eval takes set(); in a class body Python calls the method the prompt named set
    "set() in a class body": f"class Helper:\n    def set(*a):\n        {RUN}\n    x = set()\n",
    "set() as a method's default": (
        f"class Helper:\n    def set(*a):\n        {RUN}\n    def m(self, y=set()):\n        return y\n"
    ),
    "top-level statement": f"{RUN}\n",
    "top-level assignment": f"LIMIT = {RUN}\n",
}
ANSWER = "```python\ndef f(x):\n    return 2 * x\n```"
STUB = 'def f(x):\n    """Double x.\n    >>> f(2)\n    4\n    """\n'
BODY = "    return 2 * x\n"


def chat(text: str, **metadata: object) -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", text),), metadata=metadata)


def ask(construct: str) -> str:
    return f"Write f(x) that doubles x. Use this helper:\n```python\n{construct}\n{STUB}```"


# the constructs whose code sits in a function's body: the definition may be kept, not run
IN_A_BODY = {
    "decorator from an import",
    "base the prompt defines",
    "decorator the prompt defines",
    "enum member",
    "base through the program itself",
    "annotation through sys.modules",
}


@pytest.mark.parametrize("name", sorted(set(HOSTILE) - IN_A_BODY))
def test_no_hostile_construct_reaches_the_program_without_the_permission(name: str) -> None:
    program = assemble_program(chat(ask(HOSTILE[name])), ANSWER)
    assert MARK not in program
    completion = assemble_program(GenerationRequest(prompt=HOSTILE[name] + "\n\n" + STUB), BODY)
    assert MARK not in completion


@pytest.mark.slow
@needs_box
@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_prompt_code_never_runs_without_the_permission(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="verifiers.code_tests")
    v = CodeTestsVerifier(timeout_s=10)
    as_chat = await v.score(chat(ask(HOSTILE[name])), gen(ANSWER))
    as_completion = await v.score(GenerationRequest(prompt=HOSTILE[name] + "\n\n" + STUB), gen(BODY))
    for score in (as_chat, as_completion):
        assert score.value == 1.0, (name, score)
        assert (score.details["passed"], score.details["total"]) == (1, 1)
    assert MARK not in caplog.text


# A class named __builtins__ is where every function defined after it looks builtins up: its
# __class_getitem__ runs on the answer's first abs(). Given whole, and as the class a completion
# continues (its finished method is the client's).
TAKEOVER = f"class __builtins__:\n    def __class_getitem__(cls, name):\n        {RUN}\n"
USES_ABS = "```python\ndef f(x):\n    return abs(2 * x)\n```"


@pytest.mark.slow
@needs_box
async def test_a_prompt_cannot_take_over_the_answers_builtins(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="verifiers.code_tests")
    v = CodeTestsVerifier(timeout_s=10)
    as_chat = await v.score(chat(ask(TAKEOVER)), gen(USES_ABS))
    as_completion = await v.score(GenerationRequest(prompt=TAKEOVER + "\n\n" + STUB), gen("    return abs(2 * x)\n"))
    continued = GenerationRequest(prompt=TAKEOVER + '    def g(self, x):\n        """Double x."""\n')
    program = assemble_program(continued, "        return abs(2 * x)\n\ndef f(x):\n    return abs(2 * x)\n")
    assert MARK not in program
    for score in (as_chat, as_completion):
        assert (score.value, score.details["passed"], score.details["total"]) == (1.0, 1, 1), score
    assert MARK not in caplog.text


@pytest.mark.slow
@needs_box
async def test_a_completion_prompt_split_by_carriage_returns_is_held_to_the_rule(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Python reads a lone \\r as a line break; the join counted only \\n, so a prompt whose lines
    were split by \\r ended on its first line and its later lines passed for the model's code."""
    caplog.set_level(logging.DEBUG, logger="verifiers.code_tests")
    prompt = "import os\r" + RUN + "\r" + STUB.replace("\n", "\r")
    assert MARK not in assemble_program(GenerationRequest(prompt=prompt), BODY)
    score = await CodeTestsVerifier(timeout_s=10).score(GenerationRequest(prompt=prompt), gen(BODY))
    assert (score.value, score.details["passed"], score.details["total"]) == (1.0, 1, 1), score
    assert MARK not in caplog.text
    # a \r\n across the join is one line break, as Python reads it
    assert assemble_program(GenerationRequest(prompt=STUB.replace("\n", "\r")), "\n" + BODY) == STUB + BODY


@pytest.mark.slow
@needs_box
async def test_with_the_permission_the_prompt_goes_in_as_written(caplog: pytest.LogCaptureFixture) -> None:
    """The tests permission decides whose code runs: such a caller can send any code as tests, so
    its prompt's definitions go in as they are, and the marker shows."""
    caplog.set_level(logging.DEBUG, logger="verifiers.code_tests")
    trusted = await CodeTestsVerifier().score(chat(ask(HOSTILE["default"]), client_code=True), gen(ANSWER))
    assert trusted.value == 0.0 and trusted.details["reason"] == "load_error"
    assert MARK in caplog.text


def test_what_the_rule_keeps() -> None:
    prompt = (
        "from typing import List\nimport functools\nfrom dataclasses import dataclass\n\n"
        "def helper(xs: List[int], k: int = 3, *, key=None, tags=('a', -1)) -> int:\n    return len(xs) + k\n\n"
        "@functools.lru_cache(maxsize=None)\ndef fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n"
        "@dataclass(frozen=True)\nclass Point:\n    '''A point.'''\n    x: int = 0\n    y: 'float' = 0.0\n\n"
        "class Node:\n    size = 1\n    def __init__(self, val=0, nxt=None):\n        self.val, self.nxt = val, nxt\n"
        "    @property\n    def twice(self):\n        return 2 * self.val\n    @twice.setter\n    def twice(self, v):\n"
        "        self.val = v / 2\n    @staticmethod\n    def make(v=1):\n        return Node(v)\n\n"
        "MOD = 10 ** 9 + 7\nprint('side effect')\n"
    )
    kept = dict(safe_definitions(prompt))
    assert set(kept) == {None, "helper", "fib", "Point", "Node"}
    assert kept["Point"].count("x: int = 0") == 1  # a plain annotation: a dataclass field stays one
    assert "MOD" not in "".join(filter(None, kept.values())) and "side effect" not in str(kept)
    # an annotation naming the prompt's own class could reach its code: dropped, the def kept
    own = dict(safe_definitions("class T:\n    pass\n\ndef g(x: T[int]) -> T:\n    return x\n"))
    assert own["g"] == "def g(x):\n    return x"
    # nothing that rebinds a builtin: the answer's own len() or open() would call the client's code
    shadows = (
        "import os\nfrom os import system as len\nfrom os import *\nfrom typing import *\ndef print(*a):\n    pass\n"
    )
    assert [src for _, src in safe_definitions(shadows)] == ["import os", "from typing import *"]


def test_a_completion_keeps_its_prompt_only_as_the_rule_allows() -> None:
    # the prompt's own code inside the function the model continues would run when an example calls it
    planted = GenerationRequest(prompt=f"def f(x):\n    '''Double x.'''\n    {RUN}\n")
    assert MARK not in assemble_program(planted, BODY)
    # a clean stub is joined as it is, text for text
    assert assemble_program(GenerationRequest(prompt=STUB), BODY) == STUB + BODY
    # a method the model continues inside a class the prompt gives
    method = "class Solution:\n    def twice(self, x: int) -> int:\n        '''Double x.'''\n"
    assert assemble_program(GenerationRequest(prompt=method), "        return 2 * x\n") == method + (
        "        return 2 * x\n"
    )


@pytest.mark.slow
@needs_box
async def test_an_example_of_a_function_only_the_prompt_wrote_is_not_run(caplog: pytest.LogCaptureFixture) -> None:
    """A helper's body is the client's code: its examples would test the prompt, not the answer."""
    caplog.set_level(logging.DEBUG, logger="verifiers.code_tests")
    prompt = f"```python\ndef g(x):\n    {RUN}\n    return 1\n\n{STUB}```\n>>> g(1)\n1\n"
    program = build_program(chat(prompt), ANSWER)
    assert program.prompt_only == {"g"}
    score = await CodeTestsVerifier().score(chat(prompt), gen(ANSWER))
    assert (score.value, score.details["total"]) == (1.0, 1)
    assert MARK not in caplog.text


@needs_box
def test_prompt_code_does_not_run_through_the_api(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    """From outside, over HTTP, on both endpoints, keyless (no tests permission): the hostile
    prompt's score is the answer's, and the box's stderr never carries the marker."""
    caplog.set_level(logging.DEBUG, logger="verifiers.code_tests")
    construct = HOSTILE["default"] + "\n" + HOSTILE["class body"] + "\n" + HOSTILE["decorator"]

    def reply(request: GenerationRequest) -> str:
        return ANSWER if request.is_chat else BODY

    verifiers = '[[tiers.verifiers]]\nname = "code_tests"\n'
    for server, expected in (
        ("allow_unauthenticated = true", 1.0),
        ("allow_unauthenticated = true\nallow_client_tests_without_keys = true", 0.0),  # the permission
    ):
        caplog.clear()
        cfg = smol_config(tmp_path, large="none", server=server, verifiers=verifiers)
        app = create_app(load_settings(cfg), backends={"small": ScriptedBackend("small", reply)})
        with UvicornThread(app) as srv:
            scores = []
            bodies = (
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": ask(construct)}]}),
                ("/v1/completions", {"prompt": construct + "\n\n" + STUB}),
            )
            for path, body in bodies:
                resp = httpx.post(f"{srv.url}{path}", json={"model": "small", "max_tokens": 32, **body}, timeout=60)
                assert resp.status_code == 200, resp.text
                scores.append(resp.json()["tierroute"]["attempts"][0]["scores"]["code_tests"]["score"])
        assert scores == [expected, expected], (server, scores)
        assert (MARK in caplog.text) == (expected == 0.0)


@pytest.mark.slow
@needs_box
async def test_a_prompt_or_answer_nested_past_the_parser_is_scored_not_raised() -> None:
    """3,001 characters the parser cannot hold (RecursionError from `ast.parse`) in the client's
    prompt or the model's answer: before, the error left `score` and failed the whole request."""
    deep = "-" * 3000 + "1"
    v = CodeTestsVerifier()
    for request, text in [
        (chat(deep), ANSWER),
        (chat(deep, client_code=True), ANSWER),
        (GenerationRequest(prompt=deep), BODY),
        (chat("Write f(x) that doubles x."), deep),
        (GenerationRequest(prompt=STUB), deep),
    ]:
        score = await v.score(request, gen(text))
        assert score.details["reason"] in {"no_tests", "syntax_error"}, (request, score.reason)
    # a trusted caller's helper too deep to unparse is left out; the answer is still built
    helper = "def helper():\n    return " + "-" * 400 + "1\n"
    assert build_program(chat(f"```python\n{helper}```", client_code=True), ANSWER).source == (
        "def f(x):\n    return 2 * x\n"
    )
