"""The tests that start sandboxes run on one pytest-xdist worker, checked by running them in xdist.

Every box counts against uid 65534's process limit, so two workers' boxes starve each other (a
box that cannot fork exits early and its test fails for a reason it does not test). tests/conftest
puts them in one `--dist loadgroup` group; this runs two of their modules under `-n 2 --dist
loadgroup` with a plugin that skips each test before it starts a box, and reads from the verbose
report which worker took each test. Before the group was carried in the node ids itself
(tests/support/markers.py, `carry_groups_in_node_ids`), they spread over both workers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["tests/verifiers/test_sandbox.py", "tests/verifiers/test_sandbox_memory.py"]
NO_BOX = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    pytest.skip("the worker is what is tested, not the box")
"""


@pytest.mark.slow
def test_the_sandbox_tests_of_several_modules_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "no_box_plugin.py").write_text(NO_BOX, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no_box_plugin", "-n", "2"]
        + ["--dist", "loadgroup", "-m", "slow", "-v", *MODULES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    workers = {}
    for worker, nodeid in re.findall(r"^\[(gw\d+)\].*? SKIPPED (\S+)", run.stdout, re.MULTILINE):
        workers[nodeid] = worker
    assert len(workers) >= 10, run.stdout[-3000:]  # both modules' slow tests were reported
    assert {nodeid.split("::")[0] for nodeid in workers} == set(MODULES)
    assert all(nodeid.endswith("@sandbox") for nodeid in workers), sorted(workers)
    assert len(set(workers.values())) == 1, sorted(workers.items())
