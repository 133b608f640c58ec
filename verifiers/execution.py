"""Run the program an answer shows, and check the answer states what the program gives.

Small models often solve a maths question in prose, write a Python program "to verify", and then
show an output block and a final answer they made up without running anything. On the committed
GSM8K runs about 30% of answers do this; when the program's real output agrees with the stated
answer, the answer is right about half the time (small tier) or four times in five (large tier);
when they disagree it is almost never right. So the program is run in the sandbox and its result
compared with the stated final answer.

What counts, decided from those runs:

- The program: the answer's fenced blocks labelled Python (or unlabelled blocks that look like
  code: an assignment, import, definition or ``print`` call), joined in order as notebook cells
  run top to bottom (an error in one ends the run). An ``output`` block is the answer's claim,
  never code.
- The program's result: the last number it printed. When its last statement is a bare
  expression (not a ``print``), its value is shown after the run as a notebook would, so that
  counts too. No name such as ``answer`` is guessed: no committed program needs it, and a guess
  could read an intermediate value. A program that only imports and defines functions (most code
  answers) would print nothing, so it is not run at all.
- The stated answer: `verifiers.math_answer.extract_answer` over the text outside every fenced
  block (``\\boxed{}``, ``####``, ``Answer:``), so neither the code nor the invented output block
  is read as the claim. A stated answer written with decimals also agrees with a result that
  rounds to it (33.33 for 33.3333...).

Scores: agreement 1, disagreement 0. Abstains (the combination ignores it) when there is no
program; when the program prints no number (a code answer that only defines a function); when the
text states no final answer, or one that is not a number (a code answer printing an example; an
answer cut off before its conclusion, which `math_answer` already scores low); when the program
needs a module the sandbox does not have (``sympy``: the answer may be right, this cannot tell;
on the committed runs those answers are right at about the base rate); and when the sandbox is
unavailable or the answer is too large to check; and when the program does not parse because the
answer ran into its token cap inside it (a trailing ``print(f(...`` example: the code above it may
be fine, and `degeneration` already scores the cut). A program that does not run otherwise (a syntax error, an
exception, a timeout, memory) scores ``crash_score`` (0): it cannot have printed the output the
answer claims, so the stated answer rests on nothing.

Trust. Only the answer's code runs, never the prompt's (a completion is not joined to its
prompt here). That code is the model's, and a model can be asked to echo a client's code, so it is
treated as hostile whoever the caller: with this verifier on, it runs for every request whose
answer shows a program. The program runs only in the sandbox (`verifiers.sandbox`: bubblewrap, seccomp, rlimits,
no network, no host files), and what comes back is plain text read here, capped. The program can
print whatever it likes, so it can make itself agree, or look like a missing module to force an
abstention; neither gives it more than the answer's own text already has (it could state the
number it prints, or show no program). The response's details carry numbers and a fixed
vocabulary of our own (the number read from what it printed, never the text itself).

``second_opinion = true``: when the answer shows no program but states a numeric final answer, the
same tier is asked for a short program that computes the answer, which is run and compared (two
ways of reasoning agreeing is a cascade signal: Yue et al., ICLR 2024, cascades with a mixture of
thought representations). Its tokens and time are this verifier's cost. When the second program
gives no number or does not run, the verifier abstains: that says nothing about the candidate.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from router.admission.slots import Slots, hold_all, verifier_slots
from router.generation import Generation, GenerationRequest, Message
from verifiers.base import Score, VerifierContext, VerifierCost, require_integers, require_numbers
from verifiers.code_tests.harness import MAX_PROCS
from verifiers.code_tests.verifier import MAX_ANSWER_CHARS
from verifiers.consistency import generation_cost
from verifiers.extract import PYTHON_LANGS, fenced_blocks, outside_fences
from verifiers.math_answer import answers_agree, extract_answer, last_number, parse_number
from verifiers.sandbox import SandboxUnavailableError, run_python_async

log = logging.getLogger(__name__)

MAX_CODE_CHARS = 20_000  # a program behind an answer is a few dozen lines; beyond this, not checked
MAX_OUTPUT_BYTES = 64 << 10  # only the last number printed matters
_CODE_LANGS = PYTHON_LANGS - {"pycon"}  # a console session (`>>>` prompts) is not a program to run
_DISPLAY = "__tierroute_display__"
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
_EXCEPTIONS = frozenset(
    name
    for name in dir(builtins)
    if isinstance(getattr(builtins, name), type) and issubclass(getattr(builtins, name), BaseException)
)
_MISSING_MODULE = frozenset({"ModuleNotFoundError", "ImportError"})

# what a score says; nothing else of a run reaches a response
OUTCOMES = (
    "agree",
    "disagree",
    "no_program",
    "no_result",
    "no_stated_answer",
    "stated_not_a_number",
    "syntax_error",
    "cut_off",
    "exception",
    "timeout",
    "memory",
    "crashed",
    "module_unavailable",
    "too_large",
    "sandbox_unavailable",
    "no_second_program",
    "backend_failed",
)
_CRASHES = frozenset({"syntax_error", "exception", "timeout", "memory", "crashed"})

SECOND_OPINION_PROMPT = """\
Write a short Python program that computes the final answer to the problem below and prints it \
as a single number. Use only the Python standard library. Reply with the program in one ```python \
block and nothing else.

<problem>
{problem}
</problem>"""


def program_blocks(text: str) -> list[str]:
    """The code blocks of an answer that make up its program, in order (see the module docstring)."""
    found = []
    for block in fenced_blocks(text):
        if block.lang in _CODE_LANGS or (block.lang == "" and _looks_like_code(block.body)):
            found.append(block.body)
    return found


def _looks_like_code(body: str) -> bool:
    # an unlabelled block is often the output ("50.0") or a formula; a program does something
    try:
        tree = ast.parse(body)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            return True
    return False


def runnable(program: str) -> str | None:
    """The program to run: ``program`` itself, or with a trailing bare expression shown as a
    notebook shows it (its repr printed when it is not None). None when it does not parse."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr) or _is_print(last.value):
        return program
    try:
        shown = ast.unparse(last.value)
    except (ValueError, RecursionError):
        return program
    # the expression is evaluated once, at its own place in the program
    lines = program.splitlines()
    head = "\n".join(lines[: last.lineno - 1] + [lines[last.lineno - 1][: last.col_offset]])
    shown_program = f"{head}\n{_DISPLAY} = ({shown})\nif {_DISPLAY} is not None:\n    print(repr({_DISPLAY}))\n"
    try:
        ast.parse(shown_program)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return program  # a line we could not cut cleanly (col_offset counts bytes): run it as written
    return shown_program


def only_defines(program: str) -> bool:
    """Whether ``program`` only imports and defines functions (a code answer with no example): run,
    it would print nothing, so it is not run. Anything that executes at definition (a decorator,
    a default that is not a constant, a class body) is run as usual."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
            if node.decorator_list or not all(isinstance(d, ast.Constant) for d in defaults):
                return False
        elif not isinstance(node, ast.Import | ast.ImportFrom | ast.Pass) and not (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        ):
            return False
    return True


def _is_print(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"


def agrees(result: str, stated: str) -> bool:
    """Whether the program's result is the stated answer: the same number, or one that rounds to a
    stated answer written with decimals."""
    if answers_agree(result, stated):
        return True
    value, claim = parse_number(result), parse_number(stated)
    if value is None or claim is None:
        return False
    m = re.search(r"\.(\d{1,6})(?!\d)", stated)
    return m is not None and math.isclose(round(value, len(m.group(1))), claim, abs_tol=1e-9)


@dataclass(frozen=True)
class Run:
    """What came back from one sandboxed run, read here as plain values."""

    outcome: str  # ok, or one of the crash / module_unavailable outcomes
    result: str | None  # the last number printed
    exit_status: int | None
    error: str | None  # a built-in exception's name, else None
    seconds: float


@dataclass(frozen=True)
class ExecutionVerifier:
    # bounds this verifier's own generations in serving; an eval run stretches it (evals.runner)
    deadline_params: ClassVar[tuple[str, ...]] = ("generation_timeout_s",)
    second_opinion: bool = False
    timeout_s: float = 10.0  # one sandboxed run, as code_tests
    memory_mb: int = 512
    crash_score: float = 0.0
    max_concurrency: int = 0  # sandboxes at once per verifier; 0: the machine's CPU count
    max_queue: int = 0  # runs waiting for a sandbox; 0: four per slot; beyond it: 503
    max_tokens: int = 384  # of the second program
    temperature: float = 0.0
    seed: int = 0
    generation_timeout_s: float = 120.0
    name: str = "execution"
    ctx: VerifierContext = field(default_factory=lambda: VerifierContext(tier=""), repr=False, compare=False)
    _sandboxes: Slots = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.second_opinion, bool):
            raise TypeError("second_opinion must be true or false")
        require_numbers(self, "timeout_s", "crash_score", "temperature", "generation_timeout_s")
        require_integers(self, "memory_mb", "max_concurrency", "max_queue", "max_tokens", "seed")
        if self.timeout_s <= 0 or self.generation_timeout_s <= 0:
            raise ValueError("timeout_s and generation_timeout_s must be positive")
        if not 0.0 <= self.crash_score <= 1.0:
            raise ValueError("crash_score must be in [0, 1]")
        if self.memory_mb < 64 or self.max_concurrency < 0 or self.max_queue < 0:
            raise ValueError("memory_mb must be at least 64, max_concurrency and max_queue not negative")
        if self.max_tokens < 16 or self.temperature < 0:
            raise ValueError("max_tokens must be at least 16 and temperature not negative")
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")
        object.__setattr__(self, "_sandboxes", verifier_slots(self.name, self.slots, self.max_queue))

    @property
    def uses_model(self) -> bool:
        """Scoring asks the tier's model for work only for the second opinion."""
        return self.second_opinion

    @property
    def slots(self) -> int:
        return self.max_concurrency or os.cpu_count() or 2

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        text = candidate.text
        if len(text) > MAX_ANSWER_CHARS:
            refused = {"outcome": "too_large", "source": "answer", "blocks": 0}
            return Score.abstain("too_large: the answer is too large to check", details=refused)
        blocks = program_blocks(text)
        stated = extract_answer(outside_fences(text))
        details: dict[str, Any] = {"source": "answer", "blocks": len(blocks), "stated": _short(stated)}
        if not blocks:
            if self.second_opinion:
                return await self._second_opinion(request, stated)
            return _abstain("no_program", "the answer shows no program", details)
        program = "\n\n".join(blocks)
        details["code_chars"] = len(program)
        return await self._check(program, stated, details, cut_off=candidate.finish_reason == "length")

    async def _check(
        self, program: str, stated: str | None, details: dict[str, Any], *, cut_off: bool = False
    ) -> Score:
        if len(program) > MAX_CODE_CHARS:
            return _abstain("too_large", f"the program is over {MAX_CODE_CHARS} characters", details)
        if await asyncio.to_thread(only_defines, program):
            return _abstain("no_result", "the program only defines functions: it prints nothing", details)
        source = await asyncio.to_thread(runnable, program)
        if source is None and cut_off:
            return _abstain("cut_off", "the answer ran out of tokens inside its program", details)
        if source is None:
            run = Run("syntax_error", None, None, "SyntaxError", 0.0)
        else:
            try:
                run = await self._run(source)
            except SandboxUnavailableError as exc:
                log.error("execution: the sandbox is unavailable: %s", exc)
                return _abstain("sandbox_unavailable", "the sandbox is unavailable", details)
        details.update(
            exit_status=run.exit_status, result=_number(run.result), error=run.error, sandbox_s=round(run.seconds, 3)
        )
        which = "the program" if details["source"] == "answer" else "the second program"
        if run.outcome == "module_unavailable":
            return _abstain(run.outcome, f"{which} needs a module the sandbox does not have", details)
        if run.outcome in _CRASHES:
            if details["source"] != "answer":
                return _abstain(run.outcome, f"{which} did not run ({run.outcome})", details)
            details["outcome"] = run.outcome
            return Score(float(self.crash_score), f"{run.outcome}: {which} does not run", details)
        if run.result is None:
            return _abstain("no_result", f"{which} printed no number", details)
        if stated is None:
            return _abstain("no_stated_answer", f"{which} printed a number; the answer states no final answer", details)
        if parse_number(stated) is None:
            return _abstain("stated_not_a_number", "the stated final answer is not a number", details)
        if agrees(run.result, stated):
            details["outcome"] = "agree"
            return Score(1.0, f"agree: {which} prints {run.result[:40]}, the answer states {stated[:40]}", details)
        details["outcome"] = "disagree"
        return Score(0.0, f"disagree: {which} prints {run.result[:40]}, the answer states {stated[:40]}", details)

    async def _run(self, source: str) -> Run:
        async with hold_all(self._sandboxes, self.ctx.sandboxes):  # its own slot, then the host's
            done = await run_python_async(
                source,
                timeout_s=self.timeout_s,
                memory_mb=self.memory_mb,
                max_procs=MAX_PROCS,
                max_output_bytes=MAX_OUTPUT_BYTES,
            )
        log.debug(
            "execution run: exit %s killed=%s stderr tail %r", done.returncode, done.killed_reason, done.stderr[-500:]
        )
        result = last_number(done.stdout)
        if done.timed_out or done.killed_reason in ("timeout", "cpu"):
            return Run("timeout", result, done.returncode, None, done.duration_s)
        if done.killed_reason == "memory":
            return Run("memory", result, done.returncode, "MemoryError", done.duration_s)
        if done.returncode == 0:
            return Run("ok", result, 0, None, done.duration_s)
        error = _exception_name(done.stderr)
        if error in _MISSING_MODULE:
            outcome = "module_unavailable"
        elif error == "SyntaxError" or error == "IndentationError":
            outcome = "syntax_error"
        else:
            outcome = "exception" if error is not None else "crashed"
        return Run(outcome, result, done.returncode, error, done.duration_s)

    def _second_opinion_request(self, request: GenerationRequest) -> GenerationRequest:
        return GenerationRequest(
            messages=(Message("user", SECOND_OPINION_PROMPT.format(problem=request.last_user_text())),),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=self.seed,
            tenant=request.tenant,  # the client's problem: a local tier keeps its KV as the client's
            local_only=request.local_only,
        )

    def worst_cost(self, request: GenerationRequest) -> VerifierCost:
        """The second program, when one may be asked for: at the tier's own limits, for the whole
        `generation_timeout_s` (router.verification.worst_cost). Sandbox time is not charged."""
        backend = self.ctx.backend
        if not self.second_opinion or backend is None:
            return VerifierCost()
        ask = self._second_opinion_request(request)
        return VerifierCost(
            prompt_tokens=backend.prompt_token_limit(ask),
            completion_tokens=backend.completion_token_limit(ask),
            seconds=self.generation_timeout_s,
            tier=self.ctx.tier or None,
        )

    async def _second_opinion(self, request: GenerationRequest, stated: str | None) -> Score:
        details: dict[str, Any] = {"source": "second_opinion", "blocks": 0, "stated": _short(stated)}
        if stated is None or parse_number(stated) is None:
            why = "no_stated_answer" if stated is None else "stated_not_a_number"
            return _abstain(why, "the answer shows no program and states no numeric answer to check", details)
        backend = self.ctx.backend
        if backend is None:
            return _abstain("backend_failed", "no backend to ask for a second program", details)
        ask = self._second_opinion_request(request).with_(deadline=time.monotonic() + self.generation_timeout_s)
        try:
            reply = await backend.generate(ask)
        except Exception as exc:  # noqa: BLE001 - a failed second opinion is no opinion, with its reason
            log.warning("execution: second program request failed: %s: %s", type(exc).__name__, exc)
            return _abstain("backend_failed", f"asking for a second program failed ({type(exc).__name__})", details)
        cost = generation_cost([reply], self.ctx.tier or None)
        blocks = program_blocks(reply.text) or ([reply.text] if _looks_like_code(reply.text) else [])
        details["blocks"] = len(blocks)
        if not blocks:
            return _abstain("no_second_program", "the tier wrote no program", details, cost)
        details["code_chars"] = sum(len(b) for b in blocks)
        score = await self._check("\n\n".join(blocks), stated, details)
        return Score(score.value, score.reason, score.details, cost)


def _abstain(outcome: str, why: str, details: dict[str, Any], cost: VerifierCost | None = None) -> Score:
    details["outcome"] = outcome
    return Score.abstain(f"{outcome}: {why}", details=details, cost=cost or VerifierCost())


def _exception_name(stderr: str) -> str | None:
    """The built-in exception a traceback ends with; None for anything else (the program's own
    exception classes and whatever it wrote itself are not repeated)."""
    for line in reversed(stderr[-4000:].splitlines()):
        if line.strip():
            m = _ERROR_LINE.match(line)
            name = m.group(1).rsplit(".", 1)[-1] if m else None
            return name if name in _EXCEPTIONS else None
    return None


def _number(s: str | None) -> float | None:
    return None if s is None else parse_number(s)


def _short(s: str | None, n: int = 60) -> str | None:
    return s if s is None or len(s) <= n else s[: n - 3] + "..."


def make_execution(params: dict[str, Any], ctx: VerifierContext) -> ExecutionVerifier:
    if "ctx" in params:
        raise TypeError("unexpected param 'ctx'")
    return ExecutionVerifier(**params, ctx=ctx)
