"""One `tierroute serve` per SQLite ledger, tried with real processes.

A SQLite ledger's budgets are enforced inside the serving process, so the outside review's two
servers on one file each admitted against a $0.02 team budget and spent $0.031 between them.
What must hold: a second `serve` on the same file (under the same path, or another spelling of
it through a symlink or a hard link) exits at start with an error naming ledger.path and PostgreSQL, and never
answers; the first keeps serving; the CLI's commands (`report costs`, `keys list`, `keys create`)
run beside it; and once the first dies by `kill -9`, the next `serve` starts at once (the lock
died with its process).

The tiers are a scripted upstream on loopback: the test is about processes, not a model."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.control import ask, control_config
from tests.support.fault_upstream import FaultUpstream
from tests.support.servers import TIERROUTE, free_port, serve_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def second_serve(cfg: Path) -> subprocess.CompletedProcess[str]:
    """Another `serve` on `cfg`: how it ended, or a failure if it came up and answered."""
    port = free_port()
    proc = subprocess.Popen(
        [TIERROUTE, "--config", str(cfg), "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 120
    try:
        while proc.poll() is None:
            try:
                up = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                up = False
            if up:
                raise AssertionError("a second `tierroute serve` came up on the same SQLite ledger")
            if time.monotonic() > deadline:
                raise AssertionError("a second `tierroute serve` neither exited nor came up in 120 s")
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def cli(cfg: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TIERROUTE, "--config", str(cfg), *argv], capture_output=True, text=True, timeout=120)


def test_a_second_server_on_one_sqlite_ledger_is_refused_and_a_killed_ones_lock_dies_with_it(tmp_path: Path) -> None:
    ledger = tmp_path / "data" / "ledger.sqlite3"
    ledger.parent.mkdir()
    (tmp_path / "alias").symlink_to(ledger.parent)
    with FaultUpstream() as upstream:
        cfg, raw = control_config(tmp_path, upstream.base_url, ledger=str(ledger), keys={"ana": {}})
        alias, _ = control_config(
            tmp_path, upstream.base_url, ledger=str(tmp_path / "alias" / ledger.name), name="alias.toml"
        )
        with serve_process(cfg, log_path=tmp_path / "first.log") as (first, url, _):
            with httpx.Client(timeout=60) as client:
                assert ask(client, url, raw["ana"]).status_code == 200
                # a hard link is the same file under a name of its own (the outside review's way
                # round a lock named after the ledger)
                (tmp_path / "other").mkdir()
                os.link(ledger, tmp_path / "other" / "hard.sqlite3")
                hard, _ = control_config(
                    tmp_path, upstream.base_url, ledger=str(tmp_path / "other" / "hard.sqlite3"), name="hard.toml"
                )
                for spelling in (cfg, alias, hard):
                    refused = second_serve(spelling)
                    assert refused.returncode == 1, (refused.returncode, refused.stderr[-2000:])
                    said = refused.stderr
                    assert "ledger.path" in said and "PostgreSQL" in said and "ledger.url" in said, said
                    assert "Traceback" not in said, said
                    if spelling is not hard:  # the holder's pid is written beside the name it served
                        assert f"pid {first.pid}" in said, said
                # the CLI runs beside the server, reads and writes alike
                report = cli(cfg, "report", "costs")
                assert report.returncode == 0, report.stderr
                listed = cli(cfg, "keys", "list")
                assert listed.returncode == 0 and "ana" in listed.stdout, listed.stderr
                made = cli(cfg, "keys", "create", "ben")
                assert made.returncode == 0 and "trk-" in made.stdout, made.stderr
                assert ask(client, url, raw["ana"]).status_code == 200  # the first still serves

            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        started = time.monotonic()
        with serve_process(cfg, log_path=tmp_path / "next.log") as (_, url, _), httpx.Client(timeout=60) as client:
            assert ask(client, url, raw["ana"]).status_code == 200
        print(f"restart after kill -9 served in {time.monotonic() - started:.1f} s")
