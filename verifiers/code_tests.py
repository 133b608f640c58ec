"""Run the caller's own tests against the code in the answer, in the sandbox.

Tests come only from what a real caller sends:

- ``request.metadata["tests"]``: Python test code (a string, or a list of strings, one test each).
  Each top-level ``assert`` is one test, each ``def test_*()`` is one test (called after its
  definition), everything else is setup run in order; a script with neither is one test that
  passes when it runs without error. The answer's code is importable as ``solution`` too, so
  ``from solution import f`` works.
- with ``doctest = true`` (the default), the ``>>>`` examples in the request's last user message
  (or prompt), such as a HumanEval docstring's. An example with no expected output is setup.

Never a grader's reference tests: see "Eval hygiene" in DESIGN.md.

Score: the fraction of tests that pass. With no tests at all: ``no_tests_score`` (0.5) when the code
compiles and imports cleanly, else 0.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import inspect
import json
import os
import re
import secrets
import textwrap
from dataclasses import dataclass, field
from typing import Any

from router.generation import Generation, GenerationRequest
from verifiers.base import Score, VerifierContext
from verifiers.extract import compiles, defined_names, definitions, extract_code, fenced_blocks
from verifiers.sandbox import SandboxResult, run_python_async

_PS1 = re.compile(r"^(?P<indent>[ \t]*)>>>(?: (?P<src>.*)|$)")
_PS2 = re.compile(r"^[ \t]*\.\.\.(?: (?P<src>.*)|$)")
_END_OF_WANT = ('"""', "'''", "```")


@dataclass(frozen=True)
class Step:
    """One thing the harness runs: setup, or a test (assert / call / script / doctest)."""

    kind: str  # setup, test, doctest
    source: str
    label: str
    group: str  # tests or doctest: each group runs in its own copy of the solution's namespace
    want: str = ""
    exc: str | None = None  # a doctest that expects this exception type

    @property
    def is_test(self) -> bool:
        return self.kind != "setup"


def assemble_program(request: GenerationRequest, text: str) -> str:
    """The program to test: the code in the answer, after the prompt's own imports and helpers.

    An answer often leaves out what the prompt already gave it (``from typing import List``, a
    helper function the stub relies on); the prompt's imports, and its functions and classes that
    the answer does not define itself, go in front. Nothing else of the prompt runs.

    For a plain completion of a code prompt (HumanEval-style: a signature and docstring that the
    model continues with a body), the prompt and the answer together.
    """
    code = extract_code(text)
    prompt = request.last_user_text()
    if not request.is_chat and not fenced_blocks(text):
        joined = prompt + text
        if compiles(joined) and (not compiles(code) or not defined_names(prompt) & defined_names(code)):
            return joined
    if not compiles(code):
        return code
    own = defined_names(code)
    given = [src for name, src in definitions(extract_code(prompt)) if name not in own and src not in code]
    return "\n\n".join([*given, code]) if given else code


def doctest_steps(text: str) -> list[Step]:
    """The ``>>>`` examples in ``text``, leniently parsed (indentation need not be consistent)."""
    lines = text.splitlines()
    steps: list[Step] = []
    i = 0
    while i < len(lines):
        m = _PS1.match(lines[i])
        if m is None:
            i += 1
            continue
        indent = m.group("indent")
        source = [m.group("src") or ""]
        i += 1
        while i < len(lines) and (m2 := _PS2.match(lines[i])) is not None:
            source.append(m2.group("src") or "")
            i += 1
        want: list[str] = []
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if not stripped or _PS1.match(line) or stripped.startswith(_END_OF_WANT):
                break
            ends_docstring = stripped.endswith(_END_OF_WANT)
            if ends_docstring:
                line = line.rstrip()[:-3]
            want.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
            if ends_docstring:
                break
        src = "\n".join(source)
        if not src.strip() or not compiles(src):
            continue
        label = ">>> " + _short(src)
        if want and want[0].startswith("Traceback (most recent call last)"):
            exc = want[-1].split(":", 1)[0].strip().rsplit(".", 1)[-1]
            steps.append(Step("doctest", src, label, "doctest", exc=exc))
        elif want:
            steps.append(Step("doctest", src, label, "doctest", want="\n".join(want)))
        else:
            steps.append(Step("setup", src, label, "doctest"))
    return steps


def caller_test_steps(tests: str | list[str] | tuple[str, ...]) -> list[Step]:
    """Split the caller's test code into setup and tests (see the module docstring).

    Raises SyntaxError when the tests do not parse."""
    if not isinstance(tests, str):
        return [Step("test", t, f"tests[{i}]", "tests") for i, t in enumerate(tests)]
    tree = ast.parse(tests)
    steps: list[Step] = []
    for node in tree.body:
        source = ast.unparse(node)
        if isinstance(node, ast.Assert):
            steps.append(Step("test", source, _short(source), "tests"))
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test") and _takes_no_args(node):
            steps.append(Step("setup", source, f"def {node.name}", "tests"))
            steps.append(Step("test", f"{node.name}()", f"{node.name}()", "tests"))
        else:
            steps.append(Step("setup", source, _short(source), "tests"))
    if not any(s.is_test for s in steps):
        return [Step("test", tests, "tests script", "tests")]
    return steps


@dataclass(frozen=True)
class UnitResult:
    label: str
    group: str
    passed: bool
    error: str | None = None


@dataclass(frozen=True)
class HarnessRun:
    """What one sandboxed run of the harness found."""

    loaded: bool  # the program ran to the end of its top level
    load_error: str | None
    units: list[UnitResult]
    sandbox: SandboxResult


async def run_tests(
    program: str,
    steps: list[Step],
    *,
    timeout_s: float = 10.0,
    unit_timeout_s: float = 3.0,
    memory_mb: int = 512,
) -> HarnessRun:
    """Run ``program`` then ``steps`` in one sandbox; tests that never reported count as failed."""
    nonce = secrets.token_hex(8)
    payload = {
        "nonce": nonce,
        "program": program,
        "unit_timeout_s": unit_timeout_s,
        "steps": [
            {"kind": s.kind, "source": s.source, "want": s.want, "exc": s.exc, "group": s.group} for s in steps
        ],
    }
    result = await run_python_async(
        _harness_source(), stdin=json.dumps(payload), timeout_s=timeout_s, memory_mb=memory_mb
    )
    records = []
    for line in result.stdout.splitlines():
        if line.startswith(nonce):
            try:
                records.append(json.loads(line[len(nonce) :]))
            except ValueError:
                continue
    loaded, load_error = False, None
    if records and records[0].get("kind") == "program":
        loaded, load_error = bool(records[0]["ok"]), records[0].get("error")
    elif result.timed_out:
        load_error = "timed out while loading"
    else:
        tail = result.stderr.strip().splitlines()[-1:]
        why = result.killed_reason or f"exit status {result.returncode}"
        load_error = f"the process ended before reporting ({why})" + (f": {tail[0][:200]}" if tail else "")
    reported = [r for r in records if r.get("kind") == "unit"]
    stop = next((r.get("reason") for r in records if r.get("kind") == "stop"), None)
    tests = [s for s in steps if s.is_test]
    units = []
    for i, step in enumerate(tests):
        if i < len(reported):
            r = reported[i]
            units.append(UnitResult(step.label, step.group, bool(r["passed"]), r.get("error")))
        else:
            why = stop or ("timed out" if result.timed_out else f"not run: {result.killed_reason or 'the process ended'}")
            units.append(UnitResult(step.label, step.group, False, why))
    return HarnessRun(loaded, load_error, units, result)


@dataclass(frozen=True)
class CodeTestsVerifier:
    doctest: bool = True
    timeout_s: float = 10.0  # the whole sandboxed run
    unit_timeout_s: float = 3.0  # one test; the first test to time out ends the run
    memory_mb: int = 512
    no_tests_score: float = 0.5
    max_concurrency: int = 0  # sandboxes at once per verifier; 0: the machine's CPU count
    name: str = "code_tests"
    _limits: dict[Any, asyncio.Semaphore] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.doctest, bool):
            raise TypeError("doctest must be true or false")
        for key in ("timeout_s", "unit_timeout_s", "no_tests_score"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{key} must be a number")
        for key in ("memory_mb", "max_concurrency"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{key} must be an integer")
        if self.timeout_s <= 0 or self.unit_timeout_s <= 0:
            raise ValueError("timeout_s and unit_timeout_s must be positive")
        if not 0.0 <= self.no_tests_score <= 1.0:
            raise ValueError("no_tests_score must be in [0, 1]")
        if self.memory_mb < 64 or self.max_concurrency < 0:
            raise ValueError("memory_mb must be at least 64 and max_concurrency not negative")
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")

    def _limit(self) -> asyncio.Semaphore:
        # one semaphore per event loop: an asyncio primitive belongs to the loop that first used it
        loop = asyncio.get_running_loop()
        sem = self._limits.get(loop)
        if sem is None:
            self._limits.clear()
            sem = self._limits[loop] = asyncio.Semaphore(self.max_concurrency or os.cpu_count() or 2)
        return sem

    async def score(self, request: GenerationRequest, candidate: Generation) -> Score:
        program = assemble_program(request, candidate.text)
        try:
            ast.parse(program)
        except (SyntaxError, ValueError) as exc:
            where = f" at line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
            msg = exc.msg if isinstance(exc, SyntaxError) else str(exc)
            return Score(0.0, f"no runnable Python: syntax error{where}: {msg}", {"compiles": False})

        steps: list[Step] = []
        notes: list[str] = []
        tests = request.metadata.get("tests")
        if tests is not None:
            if isinstance(tests, str) or (
                isinstance(tests, list | tuple) and all(isinstance(t, str) for t in tests)
            ):
                try:
                    steps += caller_test_steps(tests)
                except SyntaxError as exc:
                    # the caller's mistake; run it anyway as one test so it shows as failing
                    notes.append(f"metadata tests do not parse ({exc.msg}, line {exc.lineno})")
                    steps.append(Step("test", tests, "tests (do not parse)", "tests"))
            else:
                notes.append("metadata tests ignored: not a string or a list of strings")
        if self.doctest:
            steps += doctest_steps(request.last_user_text())

        async with self._limit():
            try:
                run = await run_tests(
                    program, steps, timeout_s=self.timeout_s, unit_timeout_s=self.unit_timeout_s,
                    memory_mb=self.memory_mb,
                )
            except OSError as exc:
                return Score(0.0, f"sandbox failed to start: {exc}", {"compiles": True})
        details: dict[str, Any] = {
            "compiles": True,
            "imports": run.loaded,
            "sandbox_s": round(run.sandbox.duration_s, 3),
            "isolation": list(run.sandbox.isolation),
        }
        if notes:
            details["notes"] = notes
        suffix = f" ({'; '.join(notes)})" if notes else ""
        if not run.loaded:
            details["error"] = run.load_error
            return Score(0.0, f"the code fails when loaded: {run.load_error}{suffix}", details)
        if not run.units:
            return Score(
                float(self.no_tests_score),
                "no tests to run (no metadata tests, no >>> examples in the prompt): "
                f"the code compiles and imports cleanly{suffix}",
                details,
            )
        passed = sum(u.passed for u in run.units)
        by_group = {g: [u for u in run.units if u.group == g] for g in ("tests", "doctest")}
        details.update(
            passed=passed,
            total=len(run.units),
            failures=[{"test": u.label, "error": u.error} for u in run.units if not u.passed][:10],
        )
        parts = [
            f"{'caller tests' if g == 'tests' else 'prompt examples'} {sum(u.passed for u in us)}/{len(us)}"
            for g, us in by_group.items()
            if us
        ]
        reason = f"{passed}/{len(run.units)} tests passed ({', '.join(parts)})"
        first = next((u for u in run.units if not u.passed), None)
        if first is not None:
            reason += f"; first failure: {first.label}: {first.error}"
        return Score(passed / len(run.units), reason + suffix, details)


def make_code_tests(params: dict[str, Any], ctx: VerifierContext) -> CodeTestsVerifier:
    return CodeTestsVerifier(**params)


def _short(source: str, n: int = 80) -> str:
    one = " ".join(source.split())
    return one if len(one) <= n else one[: n - 3] + "..."


def _takes_no_args(fn: ast.FunctionDef) -> bool:
    a = fn.args
    return not (a.posonlyargs or a.args or a.vararg or a.kwonlyargs or a.kwarg) or (
        len(a.defaults) == len(a.posonlyargs) + len(a.args) and not a.kwonlyargs
    )


@functools.cache
def _harness_source() -> str:
    return textwrap.dedent(inspect.getsource(_harness_main)) + "\n_harness_main()\n"


def _harness_main() -> None:  # pragma: no cover - runs only inside the sandbox
    """Load the program as module ``solution``, run the steps, report each test on a line of its own.

    Shipped to the sandbox as source text; self-contained. The payload arrives on stdin. Reports go
    to a duplicate of the original stdout, prefixed with a nonce, while the code's own prints are
    captured, so a stray print can neither break nor forge a report.
    """
    import ast
    import contextlib
    import io
    import json
    import math
    import os
    import signal
    import sys
    import types

    payload = json.loads(sys.stdin.read())
    nonce = payload.pop("nonce")
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    unit_timeout = float(payload["unit_timeout_s"])

    def emit(**record: object) -> None:
        channel.write(nonce + json.dumps(record) + "\n")
        channel.flush()

    class UnitTimeout(BaseException):
        pass

    def on_alarm(signum: int, frame: object) -> None:
        raise UnitTimeout()

    signal.signal(signal.SIGALRM, on_alarm)

    def run(code: object, ns: dict, evaluate: bool) -> tuple[bool, object, str, BaseException | None]:
        printed = io.StringIO()
        signal.setitimer(signal.ITIMER_REAL, unit_timeout)
        try:
            with contextlib.redirect_stdout(printed):
                value = eval(code, ns) if evaluate else exec(code, ns)  # noqa: S307 - that is the job
            return True, value, printed.getvalue(), None
        except BaseException as exc:  # noqa: BLE001 - a test's failure, whatever it is, is data
            return False, None, printed.getvalue(), exc
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def describe(exc: BaseException | None) -> str | None:
        if exc is None:
            return None
        if isinstance(exc, UnitTimeout):
            return f"timed out after {unit_timeout:g}s"
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return text[:300]

    def same(a: object, b: object) -> bool:
        if isinstance(a, bool) or isinstance(b, bool):
            return type(a) is type(b) and a == b
        if isinstance(a, int | float) and isinstance(b, int | float):
            return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
        if isinstance(a, list | tuple) and isinstance(b, list | tuple):
            return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        try:
            return bool(a == b)
        except Exception:  # noqa: BLE001
            return False

    def doctest_passes(value: object, is_expr: bool, printed: str, want: str) -> bool:
        got = printed + (repr(value) + "\n" if is_expr and value is not None else "")
        if " ".join(got.split()) == " ".join(want.split()):
            return True
        if is_expr and not printed:
            try:
                expected = ast.literal_eval(want.strip())
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                return " ".join(str(value).split()) == " ".join(want.split())
            return same(value, expected)
        return False

    module = types.ModuleType("solution")
    module.__file__ = os.path.abspath("solution.py")
    sys.modules["solution"] = module
    ok, _, _, exc = run(compile(payload["program"], "solution.py", "exec"), module.__dict__, False)
    emit(kind="program", ok=ok, error=describe(exc))
    if not ok:
        return

    spaces: dict[str, dict] = {}
    for step in payload["steps"]:
        ns = spaces.setdefault(step["group"], dict(module.__dict__, __name__="__test__"))
        source = step["source"]
        is_expr = False
        try:
            if step["kind"] == "doctest":
                try:
                    code = compile(source, "<doctest>", "eval")
                    is_expr = True
                except SyntaxError:
                    code = compile(source, "<doctest>", "exec")
            else:
                code = compile(source, "<test>", "exec")
        except (SyntaxError, ValueError) as exc2:
            if step["kind"] != "setup":
                emit(kind="unit", passed=False, error=describe(exc2))
            continue
        ok, value, printed, exc = run(code, ns, is_expr)
        if step["kind"] == "setup":
            continue
        if isinstance(exc, UnitTimeout):
            # code that hangs on one input is not worth waiting out on every other one
            emit(kind="unit", passed=False, error=describe(exc))
            emit(kind="stop", reason=f"not run: an earlier test timed out after {unit_timeout:g}s")
            return
        if step["kind"] == "test":
            emit(kind="unit", passed=ok, error=describe(exc))
        elif step["exc"]:
            passed = exc is not None and type(exc).__name__ == step["exc"]
            emit(kind="unit", passed=passed, error=None if passed else f"expected {step['exc']}, got {describe(exc)}")
        else:
            passed = ok and doctest_passes(value, is_expr, printed, step["want"])
            if passed:
                emit(kind="unit", passed=True, error=None)
            else:
                got = describe(exc) if not ok else (printed + (repr(value) if is_expr and value is not None else "")).strip()
                emit(kind="unit", passed=False, error=f"expected {step['want'][:120]!r}, got {str(got)[:120]!r}")
