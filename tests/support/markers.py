"""What makes a test `slow`, and the guard that keeps `make check` (`pytest -m "not slow"`) fast.

A slow test loads a real model, starts a process (a server, PostgreSQL, a sandbox, the CLI) or
spends seconds of CPU; about everything else runs in milliseconds. Tests that ask for the model
file or PostgreSQL through a fixture are marked by tests/conftest.py without saying so
(SLOW_FIXTURES); the others carry the mark themselves. So that a new test cannot slow the fast
loop unnoticed, the fast loop fails a test that is not marked and still loads a model in this
process (llama.cpp's loader is wrapped) or starts a child process (`subprocess.Popen`, which
asyncio's subprocesses use too, is wrapped), with a message that says to mark it; the failure is
reported even where the code under test catches the error.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SLOW_FIXTURES = frozenset({"smol_path", "pg", "db"})
HARMLESS_CHILDREN = frozenset({"uname"})


class SlowTestInFastLoop(RuntimeError):
    """A test not marked `slow` did something that makes it slow."""


def slow_by_fixtures(item: pytest.Item) -> bool:
    return bool(SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())))


def marked_slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


# a module whose tests start sandboxes (bubblewrap boxes running code as uid 65534)
SANDBOX_SOURCE = re.compile(r"verifiers\.sandbox|from verifiers import sandbox|\bcode_tests\b|\"execution\"|bwrap")


@functools.cache
def _starts_sandboxes(path: Path) -> bool:
    return bool(SANDBOX_SOURCE.search(path.read_text(encoding="utf-8")))


def worker_group(item: pytest.Item) -> str | None:
    """The pytest-xdist group (`--dist loadgroup`) that keeps a slow test with the tests it shares
    something with: PostgreSQL's tests on one worker (one server); the sandbox tests on one worker,
    because every box on the host counts against uid 65534's process limit (RLIMIT_NPROC), so a
    fork bomb contained in one box would starve a box another worker starts; each other slow
    module's tests on one worker (its module-scoped server or model loaded once). Fast tests have
    none and spread freely."""
    if {"pg", "db"} & set(getattr(item, "fixturenames", ())):
        return "postgres"
    if not marked_slow(item):
        return None
    if _starts_sandboxes(item.path):
        return "sandbox"
    return item.nodeid.split("::", 1)[0]


def carry_groups_in_node_ids(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each grouped test's node id the `@group` suffix `--dist loadgroup` schedules by.

    pytest-xdist's worker writes that suffix itself, but it cannot be relied on: its hook runs
    before this project's conftest adds the groups (`worker_group`), and xdist 3.8 writes it into
    `item._nodeid`, which pytest 9.2 no longer reads (the id moved to `item._id`), so every test
    reached the controller ungrouped and the sandbox tests spread over all workers. Called after
    every other plugin's collection hook; a no-op outside an xdist worker running loadgroup."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        )
        if not names:
            continue
        suffix = "@" + "_".join(names)
        if item.nodeid.endswith(suffix):
            continue
        if hasattr(item, "_id"):  # pytest >= 9.2
            item._id = type(item._id).parse(item.nodeid + suffix)
        else:
            item._nodeid = item.nodeid + suffix


class FastLoop:
    """Only active when the run deselects slow tests; then `check` raises inside an unmarked test."""

    active = False
    current: str | None = None  # the running test's id while it is not marked slow
    violations: list[str] = []  # what the running test did that it should not have

    @classmethod
    def configure(cls, config: pytest.Config) -> None:
        cls.active = "not slow" in (config.getoption("markexpr", "") or "")
        if cls.active:
            cls._wrap_model_loader()
            cls._wrap_child_processes()

    @classmethod
    @contextlib.contextmanager
    def running(cls, item: pytest.Item) -> Iterator[None]:
        """Around a test's setup, call and teardown, module fixtures included."""
        cls.current = None if marked_slow(item) else item.nodeid
        cls.violations = []
        try:
            yield
        finally:
            cls.current = None

    @classmethod
    def check(cls, what: str) -> None:
        if cls.active and cls.current is not None:
            message = (
                f"{cls.current} {what}, which the fast loop (`make check`) leaves to `make test`: "
                "mark the test `@pytest.mark.slow` (or the module: `pytestmark = pytest.mark.slow`)"
            )
            cls.violations.append(message)
            raise SlowTestInFastLoop(message)

    @classmethod
    def fail_report(cls, report: pytest.TestReport) -> None:
        """Fail the phase's report with what the test did, whatever the test made of the error."""
        if cls.violations and report.outcome != "skipped":
            report.outcome = "failed"
            report.longrepr = "\n".join(dict.fromkeys(cls.violations))
            cls.violations = []

    @classmethod
    def _wrap_model_loader(cls) -> None:
        import llama_cpp

        load = llama_cpp.llama_model_load_from_file
        if getattr(load, "fast_loop_guard", False):
            return

        def guarded(*args: Any, **kwargs: Any) -> Any:
            cls.check("loads a model")
            return load(*args, **kwargs)

        guarded.fast_loop_guard = True  # type: ignore[attr-defined]
        llama_cpp.llama_model_load_from_file = guarded

    @classmethod
    def _wrap_child_processes(cls) -> None:
        import subprocess

        spawn = subprocess.Popen._execute_child  # type: ignore[attr-defined]
        if getattr(spawn, "fast_loop_guard", False):
            return

        def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> Any:
            program = args if isinstance(args, str | bytes) else (list(args) or ["?"])[0]
            # the standard library's `platform` asks `uname` once per process (the openai client
            # sends the platform in its headers): a millisecond, nothing the test chose to start
            if str(program) not in HARMLESS_CHILDREN:
                cls.check(f"starts a child process ({program})")
            return spawn(self, args, *rest, **kwargs)

        guarded.fast_loop_guard = True  # type: ignore[attr-defined]
        subprocess.Popen._execute_child = guarded  # type: ignore[attr-defined]
