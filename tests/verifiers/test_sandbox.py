"""The sandbox contains what model-written code gets wrong: each test runs real code in a real child.

Where a layer depends on the machine (network namespaces, dropping root), the test checks the
layer when the child reports it in place, and checks the refusal itself in every case.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from verifiers.sandbox import SANDBOX_UID, run_python, run_python_async

pytestmark = pytest.mark.timeout(60)

IS_ROOT = os.geteuid() == 0


def _has_capabilities(*bits: int) -> bool:
    with open("/proc/self/status") as fh:
        eff = next(int(line.split()[1], 16) for line in fh if line.startswith("CapEff:"))
    return all(eff >> b & 1 for b in bits)


# CAP_CHOWN, CAP_DAC_READ_SEARCH, CAP_SETGID, CAP_SETUID: what dropping to nobody may need
CAN_DROP_ROOT = IS_ROOT and _has_capabilities(0, 2, 6, 7)


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line or working directory mentions ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().decode(errors="replace")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if text in cmdline or cwd.startswith(text):
            found.append(int(entry))
    return found


async def test_good_code_runs_and_prints() -> None:
    r = await run_python_async("import sys\nprint(sum(range(10)))\nprint('err', file=sys.stderr)")
    assert r.ok
    assert r.returncode == 0
    assert r.stdout == "45\n"
    assert r.stderr == "err\n"
    assert r.killed_reason is None and not r.timed_out
    assert {"rlimits", "audit"} <= set(r.isolation)


async def test_fresh_directory_empty_environment_isolated_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERROUTE_TEST_SECRET", "s3cret")
    code = (
        "import json, os, sys\n"
        "print(json.dumps({'cwd': os.getcwd(), 'files': sorted(os.listdir('.')), 'env': dict(os.environ),"
        " 'isolated': sys.flags.isolated, 'uid': os.getuid()}))"
    )
    r = await run_python_async(code, files={"data/input.txt": "hello"})
    seen = json.loads(r.stdout)
    assert Path(seen["cwd"]).name.startswith("tierroute-sandbox-")
    assert seen["files"] == ["data", "main.py"]
    assert "TIERROUTE_TEST_SECRET" not in seen["env"]
    assert not {"PATH", "HOME", "USER"} & set(seen["env"])
    assert seen["isolated"] == 1
    assert not os.path.exists(seen["cwd"]), "the sandbox directory outlived the run"
    if IS_ROOT and f"uid:{SANDBOX_UID}" in r.isolation:
        assert seen["uid"] == SANDBOX_UID


@pytest.mark.skipif(not CAN_DROP_ROOT, reason="the uid drop happens only for a root caller with the capabilities")
async def test_root_caller_runs_the_code_as_nobody() -> None:
    r = await run_python_async("import os; print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())")
    assert f"uid:{SANDBOX_UID}" in r.isolation, r.stderr
    assert r.stdout.split()[:3] == [str(SANDBOX_UID)] * 3


async def test_network_is_refused() -> None:
    connections = 0

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    attempts = {
        "by name": f"import socket; socket.create_connection(('localhost', {port}), timeout=2)",
        "by address": f"import socket; s = socket.socket(); s.settimeout(2); s.connect(('127.0.0.1', {port}))",
        "udp": f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {port}))",
        "listen": "import socket; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen()",
        "http": f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2)",
    }
    try:
        for what, code in attempts.items():
            r = await run_python_async(code, timeout_s=10)
            assert r.returncode != 0, f"{what}: the network call succeeded"
            assert "SandboxViolation" in r.stderr or "Errno" in r.stderr, (what, r.stderr)
        await asyncio.sleep(0.1)
        assert connections == 0
    finally:
        server.close()
        await server.wait_closed()


async def test_network_namespace_has_only_loopback_when_available() -> None:
    r = await run_python_async("import socket; print([n for _, n in socket.if_nameindex()])")
    if "netns" not in r.isolation:
        pytest.skip("this machine does not allow a new network namespace")
    assert json.loads(r.stdout.replace("'", '"')) == ["lo"]


async def test_writing_outside_the_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    world = Path("/tmp") / f"tierroute-escape-{os.getpid()}.txt"
    attempts = [
        f"open({str(target)!r}, 'w').write('x')",
        f"open({str(world)!r}, 'a').write('x')",
        f"import pathlib; pathlib.Path({str(world)!r}).write_text('x')",
        f"import os; os.close(os.open({str(world)!r}, os.O_WRONLY | os.O_CREAT))",
        f"open('inside.txt', 'w').write('x'); import os; os.rename('inside.txt', {str(world)!r})",
        f"import shutil; open('inside.txt', 'w').write('x'); shutil.copy('inside.txt', {str(world)!r})",
        f"import os; os.symlink({str(world)!r}, 'link'); open('link', 'w').write('x')",
        f"import os; os.remove({str(target.parent / 'keep.txt')!r})",
    ]
    (tmp_path / "keep.txt").write_text("keep")
    try:
        for code in attempts:
            r = await run_python_async(code)
            assert r.returncode != 0, code
            assert r.killed_reason == "violation", (code, r.stderr)
            assert not target.exists() and not world.exists(), code
        assert (tmp_path / "keep.txt").read_text() == "keep"
        # and inside, writing is fine
        r = await run_python_async("open('out.txt', 'w').write('ok'); print(open('out.txt').read())")
        assert r.ok and r.stdout == "ok\n"
    finally:
        world.unlink(missing_ok=True)


@pytest.mark.skipif(not IS_ROOT, reason="as a plain user the sandbox reads what that user may read")
async def test_files_only_root_may_read_stay_unreadable(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    secret = private / "key.txt"
    secret.write_text("s3cret")
    r = await run_python_async(f"print(open({str(secret)!r}).read())")
    assert r.returncode != 0
    assert "s3cret" not in r.stdout
    assert "PermissionError" in r.stderr or "SandboxViolation" in r.stderr


async def test_a_fork_bomb_is_contained() -> None:
    # Bounded on purpose: even if every layer failed, this makes at most 100 sleeping processes.
    code = (
        "import os, sys, time\n"
        "print(os.getcwd(), flush=True)\n"
        "forked = 0\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as e:\n"
        "        print('refused', type(e).__name__, flush=True)\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    forked += 1\n"
        "print('forked', forked, flush=True)\n"
        "for spawn in ('import subprocess; subprocess.run([sys.executable, \"-c\", \"1\"])',\n"
        "              'import multiprocessing; multiprocessing.Process(target=print).start()',\n"
        "              'os.system(\"true\")', 'os.posix_spawn(sys.executable, [sys.executable], {})',\n"
        "              'os.execv(sys.executable, [sys.executable])'):\n"
        "    try:\n"
        "        exec(spawn)\n"
        "        print('spawned', spawn)\n"
        "    except OSError as e:\n"
        "        print('refused', type(e).__name__)\n"
    )
    t0 = time.monotonic()
    r = await run_python_async(code, timeout_s=10)
    assert time.monotonic() - t0 < 8
    lines = r.stdout.splitlines()
    workdir = lines[0]
    assert "forked 0" in lines, r.stdout + r.stderr
    assert "spawned" not in r.stdout
    assert r.stdout.count("refused") == 6
    assert _processes_mentioning(workdir) == [], "a process of the sandbox outlived it"
    # the machine is fine: a new sandbox starts and runs
    again = await run_python_async("print('still here')")
    assert again.ok and again.stdout == "still here\n"


async def test_the_process_limit_holds_for_the_sandbox_user() -> None:
    # RLIMIT_NPROC counts threads too; it applies only once the child is not root.
    code = (
        "import threading\n"
        "gate = threading.Event()\n"
        "started = 0\n"
        "for _ in range(64):\n"
        "    try:\n"
        "        threading.Thread(target=gate.wait).start()\n"
        "        started += 1\n"
        "    except RuntimeError:\n"
        "        break\n"
        "gate.set()\n"
        "print(started)\n"
    )
    r = await run_python_async(code, max_procs=8)
    if f"uid:{SANDBOX_UID}" not in r.isolation:
        pytest.skip("the child kept the caller's uid; RLIMIT_NPROC would count the caller's processes")
    assert r.ok, r.stderr
    assert int(r.stdout) < 8


async def test_an_endless_loop_is_killed_by_the_wall_timeout() -> None:
    # a busy loop burns CPU as fast as wall time, so the CPU limit (equal to the timeout by
    # default) may fire first: either way it is killed within the limit
    for code, reasons in (("while True:\n    pass\n", {"timeout", "cpu"}), ("import time\ntime.sleep(60)\n", {"timeout"})):
        t0 = time.monotonic()
        r = await run_python_async(code, timeout_s=1.0)
        assert time.monotonic() - t0 < 4
        assert r.killed_reason in reasons
        assert r.timed_out == (r.killed_reason == "timeout")
        assert r.returncode < 0
        assert not r.ok


async def test_cpu_time_is_limited_apart_from_wall_time() -> None:
    t0 = time.monotonic()
    r = await run_python_async("while True:\n    pass\n", timeout_s=20, cpu_s=1)
    assert time.monotonic() - t0 < 6
    assert not r.timed_out
    assert r.killed_reason in ("cpu", "signal SIGKILL")


async def test_a_memory_hog_is_stopped() -> None:
    for code in ("x = bytearray(4 * 1024**3)\n", "chunks = []\nwhile True:\n    chunks.append(bytearray(10**6))\n"):
        t0 = time.monotonic()
        r = await run_python_async(code, memory_mb=128, timeout_s=10)
        assert time.monotonic() - t0 < 6
        assert r.returncode != 0
        assert r.killed_reason == "memory", r.stderr[-500:]


async def test_file_size_and_output_are_capped() -> None:
    r = await run_python_async("open('big', 'wb').write(b'0' * (3 << 20))", max_file_mb=1)
    assert r.killed_reason == "file_size"
    r = await run_python_async("print('x' * (3 << 20))", max_output_bytes=1000)
    assert r.ok
    assert r.output_truncated
    assert len(r.stdout) == 1000


async def test_stdin_reaches_the_code_and_a_large_unread_input_does_not_hang() -> None:
    r = await run_python_async("import sys; print(sys.stdin.read().upper())", stdin="hello")
    assert r.stdout == "HELLO\n"
    t0 = time.monotonic()
    r = await run_python_async("import time; time.sleep(60)", stdin=b"x" * (4 << 20), timeout_s=1)
    assert r.timed_out and time.monotonic() - t0 < 4


async def test_the_event_loop_keeps_running_while_the_child_works() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        r = await run_python_async("import time; time.sleep(1)")
    finally:
        task.cancel()
    assert r.ok
    assert ticks >= 10


async def test_cancelling_the_caller_kills_the_child() -> None:
    marker = f"tierroute-cancel-{os.getpid()}-{time.monotonic_ns()}"
    task = asyncio.create_task(run_python_async(f"import time\n# {marker}\ntime.sleep(60)", timeout_s=30))
    await asyncio.sleep(0.5)
    children = [pid for pid in _processes_mentioning("tierroute-sandbox-") if _parent(pid) == os.getpid()]
    assert children, "the child did not start"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.3)
    assert not [pid for pid in children if _alive(pid)]


async def test_many_sandboxes_at_once() -> None:
    results = await asyncio.gather(*(run_python_async(f"print({i} * 2)") for i in range(6)))
    assert [r.stdout.strip() for r in results] == [str(i * 2) for i in range(6)]


def test_the_blocking_variant_works_without_a_loop() -> None:
    r = run_python("print('sync')", timeout_s=5)
    assert r.ok and r.stdout == "sync\n"


async def test_the_blocking_variant_refuses_to_block_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="run_python_async"):
        run_python("print(1)")
    r = await asyncio.to_thread(run_python, "print('from a thread')")
    assert r.stdout == "from a thread\n"


async def test_bad_options_and_file_names_are_refused() -> None:
    with pytest.raises(ValueError):
        await run_python_async("print(1)", timeout_s=0)
    with pytest.raises(ValueError):
        await run_python_async("print(1)", files={"../escape.py": "x"})


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
