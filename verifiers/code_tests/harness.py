"""One sandboxed run: load the program in the worker, ask for each step, judge each reply here.

The worker (`verifiers.code_tests.worker`) runs in a box from `verifiers.sandbox`; the run speaks
to it through `verifiers.code_tests.protocol` and decides with `verifiers.code_tests.judge`. A test
computed from its leaves (`verifiers.outside_judge`) asks the box for one leaf at a time.

A worker that exits early, stalls, or answers out of protocol fails every test it did not answer in
protocol; an answer out of protocol is counted as ``forged``. Memory is capped per process, so
`MAX_PROCS` bounds what one run can hold.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

from verifiers.code_tests.judge import failure_kind, judge, judge_doctest
from verifiers.code_tests.protocol import MAX_REPLY_BYTES, Session, Stop
from verifiers.code_tests.steps import Check, Step
from verifiers.code_tests.worker import worker_source
from verifiers.outside_judge import Failed, Judge, Opaque, truth_of
from verifiers.sandbox import Limits, start_python

MAX_PROCS = 8  # processes one code_tests run may have: with memory_mb each, its memory bound


@dataclass(frozen=True)
class UnitResult:
    label: str
    group: str
    passed: bool
    kind: str | None = None  # why it failed, one of KINDS
    in_process: bool = False
    detail: str = ""  # for the server log only
    forgeable: bool = False  # code that takes over the box could have passed it


@dataclass(frozen=True)
class HarnessRun:
    """What one sandboxed run of the harness found."""

    loaded: bool  # the program ran to the end of its top level
    load_kind: str | None  # why not, one of KINDS
    units: list[UnitResult]
    duration_s: float
    forged: bool = False  # the worker answered out of protocol
    log: str = ""  # the worker's stderr and the load error, for the server log only


async def run_tests(
    program: str,
    steps: list[Step],
    *,
    timeout_s: float = 10.0,
    unit_timeout_s: float = 3.0,
    memory_mb: int = 512,
) -> HarnessRun:
    """Load ``program`` as module ``solution`` in a sandboxed worker, then run ``steps`` there one
    request at a time, judging each reply here. Tests never answered in protocol count as failed."""
    start = time.monotonic()
    deadline = start + timeout_s
    # memory is capped per process, so the process count bounds what one run can hold
    limits = Limits(timeout_s=timeout_s + 1.0, memory_mb=memory_mb, max_procs=MAX_PROCS)
    units: list[UnitResult] = []
    tests = [s for s in steps if s.is_test]
    loaded, load_kind, forged, notes = False, None, False, []
    async with start_python(
        worker_source(), limits=limits, files={"solution.py": program}, stream_limit=MAX_REPLY_BYTES
    ) as box:
        session = Session(box, deadline, unit_timeout_s)
        stop: Stop | None = None
        try:
            load = await session.ask({"op": "load"})
            loaded = load.ok
            if not load.ok:
                load_kind = {
                    "SyntaxError": "syntax_error",
                    "ModuleNotFoundError": "import_error",
                    "ImportError": "import_error",
                    "MemoryError": "memory",
                }.get(load.exc, "load_error")
                notes.append(f"load: {load.exc}: {load.msg}")
        except Stop as exc:
            stop = exc
            load_kind = "forged" if exc.kind == "forged" else exc.kind
        if loaded:
            for step in steps:
                if stop is not None:
                    break
                try:
                    units.extend(await _run_step(session, step))
                except Stop as exc:
                    stop = exc
                    if step.is_test:
                        units.append(
                            UnitResult(
                                step.label, step.group, False, exc.kind, step.in_process, exc.detail, step.forgeable
                            )
                        )
        if stop is not None:
            forged = stop.kind == "forged"
            notes.append(f"stopped: {stop.kind} {stop.detail}".strip())
            box.kill()
        elif box.stdin is not None:
            box.stdin.close()
        if stop is None or stop.kind != "crashed":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(box.proc.wait(), 1.0)
            box.kill()
        err, _ = await box.stderr()
    answered = len(units)
    kind_left = "forged" if forged else "not_run"
    for step in tests[answered:]:
        units.append(UnitResult(step.label, step.group, False, kind_left, step.in_process, forgeable=step.forgeable))
    stderr = err.decode("utf-8", "replace")[-4000:]
    return HarnessRun(loaded, load_kind, units, time.monotonic() - start, forged, "\n".join([*notes, stderr]).strip())


async def _run_step(session: Session, step: Step) -> list[UnitResult]:
    base = None
    ns = step.group
    if step.own_ns:
        ns, base = f"{step.group}:{step.label}:{secrets.token_hex(4)}", step.group
    if step.kind == "setup":
        await session.ask({"op": "exec", "source": step.source, "ns": ns, "base": base})
        return []
    if step.kind == "doctest":
        op = "eval" if step.expr else "exec"
        reply = await session.ask({"op": op, "source": step.source, "ns": ns, "base": base})
        kind = await asyncio.to_thread(judge_doctest, step, reply)  # literal_eval of a long want
        detail = (
            "" if kind is None else f"expected {step.want[:120]!r}, got {reply.printed[:120]!r} {reply.exc} {reply.msg}"
        )
        detail = detail[:400]
        return [UnitResult(step.label, step.group, kind is None, kind, False, detail, step.forgeable)]
    for check in step.plan():
        if check.judge == "outside":
            kind, outcome = await _judge_outside(session, check, ns, base)
        else:
            reply = await session.ask({"op": check.op, "source": check.source, "ns": ns, "base": base})
            kind = judge(check, reply)
            outcome = f"{reply.exc}: {reply.msg}" if not reply.ok else f"-> {reply.value!r:.200}"
        if kind is not None:
            detail = f"{check.source[:120]} {outcome}"
            return [UnitResult(step.label, step.group, False, kind, step.in_process, detail, step.forgeable)]
    return [UnitResult(step.label, step.group, True, None, step.in_process, forgeable=step.forgeable)]


async def _judge_outside(session: Session, check: Check, ns: str, base: str | None) -> tuple[str | None, str]:
    """Compute ``check.source`` here, asking the box only for its leaves' values; the failure's
    kind (None when it holds) and, for the log, what the box said last."""
    said = [""]

    async def ask(source: str) -> Any:
        reply = await session.ask({"op": "eval", "source": source, "ns": ns, "base": base})
        said[0] = f"{source[:60]} -> " + (f"{reply.exc}: {reply.msg}" if not reply.ok else f"{reply.value!r:.100}")
        if not reply.ok:
            raise Failed(failure_kind(reply))
        if isinstance(reply.value, Opaque):
            reply.value.truth = reply.truth
        return reply.value

    judge_here = Judge(shadowed=check.shadowed)
    try:
        value = await judge_here.value(ast.parse(check.source, mode="eval").body, ask)
        # a doctest states the bool it prints; an assert asks for truth
        held = value is check.expected if check.cmp == "exact" else truth_of(value)
    except Failed as exc:
        return exc.kind, said[0]
    return (None if held else ("mismatch" if check.cmp == "exact" else "assertion")), said[0]
