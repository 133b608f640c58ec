"""The sandbox runs model-written code in bubblewrap: each test runs real code in a real box and
checks what it could do from outside it. The attacks a hostile client would try are in
test_sandbox_escapes.py; these are the mistakes of ordinary code.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.config import smol_config
from tests.support.sandbox import box_processes
from verifiers.sandbox import SANDBOX_UID, available, run_python, run_python_async, seccomp_program

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(60),
    pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}"),
]


async def test_good_code_runs_and_prints() -> None:
    r = await run_python_async("import sys\nprint(sum(range(10)))\nprint('err', file=sys.stderr)")
    assert r.ok
    assert r.returncode == 0
    assert r.stdout == "45\n"
    assert r.stderr == "err\n"
    assert r.killed_reason is None and not r.timed_out
    assert {"bwrap", "pidns", "netns", "seccomp", "rlimits"} <= set(r.isolation)


async def test_fresh_directory_empty_environment_isolated_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERROUTE_TEST_SECRET", "s3cret")
    code = (
        "import json, os, sys\n"
        "print(json.dumps({'cwd': os.getcwd(), 'files': sorted(os.listdir('.')), 'env': dict(os.environ),"
        " 'isolated': sys.flags.isolated, 'root': sorted(os.listdir('/')), 'path': sys.path}))"
    )
    r = await run_python_async(code, files={"input.txt": "hello"})
    seen = json.loads(r.stdout)
    assert seen["cwd"] == "/sandbox"
    assert seen["files"] == ["input.txt", "main.py"]
    assert "TIERROUTE_TEST_SECRET" not in seen["env"]
    assert not {"PATH", "HOME", "USER"} & set(seen["env"])
    assert seen["isolated"] == 1
    # the box's root holds the interpreter's tree, /dev, /proc and the work directory: no /tmp,
    # /etc, /home, /work, nor the project or its venv
    assert not {"tmp", "etc", "home", "work", "usr", "var"} & set(seen["root"])
    assert not any("site-packages" in p or ".venv" in p for p in seen["path"])
    # nothing of the box is left on the host: its directory was a tmpfs in its own mount namespace
    assert not Path("/sandbox").exists()


async def test_the_code_runs_as_nobody_seen_from_inside_and_outside() -> None:
    code = (
        "import os, time\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "print(*(status[k].strip() for k in ('CapEff', 'CapPrm', 'NoNewPrivs', 'Seccomp')), flush=True)\n"
        "print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups(), os.readlink('/proc/self/ns/pid'), flush=True)\n"
        "time.sleep(2)\n"
    )
    task = asyncio.create_task(run_python_async(code, timeout_s=10))
    await asyncio.sleep(1.0)
    # from outside: the processes of the box run as host uid 65534 when the service is root
    ns = None
    for _ in range(20):
        mine = [
            p for p in _descendants(os.getpid()) if _readlink(f"/proc/{p}/ns/pid") != _readlink("/proc/self/ns/pid")
        ]
        if mine:
            ns = _readlink(f"/proc/{mine[-1]}/ns/pid")
            break
        await asyncio.sleep(0.1)
    r = await task
    kernel_view, ids = r.stdout.splitlines()
    # no capabilities left, no way to gain any, and the seccomp filter in force (mode 2)
    assert kernel_view.split() == ["0000000000000000", "0000000000000000", "1", "2"]
    uid, euid, gid = ids.split()[:3]
    assert [uid, euid, gid] == [str(SANDBOX_UID)] * 3
    assert "[]" in r.stdout
    assert ns is not None
    if os.geteuid() == 0:
        assert r.stdout.split()[-1] == ns  # the same namespace seen from both sides
        assert "uid:65534" in r.isolation


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
        "http": f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2)",
    }
    # UDP leaves no error behind: the box has a loopback of its own that the datagram reaches
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    attempts["udp"] = (
        f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {udp.getsockname()[1]}))"
    )
    try:
        for what, code in attempts.items():
            r = await run_python_async(code, timeout_s=10)
            if what != "udp":
                assert r.returncode != 0, f"{what}: the network call succeeded"
                assert "Errno" in r.stderr, (what, r.stderr)
        await asyncio.sleep(0.1)
        assert connections == 0
        with pytest.raises(BlockingIOError):
            udp.recv(10)
    finally:
        udp.close()
        server.close()
        await server.wait_closed()


async def test_the_network_namespace_has_only_its_own_loopback() -> None:
    # /proc/net is the reader's network namespace; if_nameindex() would need a netlink socket,
    # which the box may not make
    code = "import json; print(json.dumps([ln.split(':')[0].strip() for ln in open('/proc/net/dev').readlines()[2:]]))"
    r = await run_python_async(code)
    assert json.loads(r.stdout) == ["lo"], r.stderr


async def test_writing_outside_the_directory_fails_and_nothing_appears_outside(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    world = Path("/tmp") / f"tierroute-escape-{os.getpid()}.txt"
    attempts = [
        f"open({str(target)!r}, 'w').write('x')",
        f"open({str(world)!r}, 'a').write('x')",
        f"import pathlib; pathlib.Path({str(world)!r}).write_text('x')",
        f"import os; os.close(os.open({str(world)!r}, os.O_WRONLY | os.O_CREAT))",
        f"open('inside.txt', 'w').write('x'); import os; os.rename('inside.txt', {str(world)!r})",
        f"import os; os.symlink({str(world)!r}, 'link'); open('link', 'w').write('x')",
        f"import os; os.remove({str(target.parent / 'keep.txt')!r})",
        "open('/escaped.txt', 'w').write('x')",
        "open('/dev/escaped.txt', 'w').write('x')",
    ]
    (tmp_path / "keep.txt").write_text("keep")
    try:
        for code in attempts:
            r = await run_python_async(code)
            assert r.returncode != 0, code
            assert "Error" in r.stderr, (code, r.stderr)
            assert not target.exists() and not world.exists(), code
        assert (tmp_path / "keep.txt").read_text() == "keep"
        # and inside, writing is fine
        r = await run_python_async("open('out.txt', 'w').write('ok'); print(open('out.txt').read())")
        assert r.ok and r.stdout == "ok\n"
    finally:
        world.unlink(missing_ok=True)


async def test_host_files_are_not_there(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    secret = private / "key.txt"
    secret.write_text("s3cret")
    secret.chmod(0o644)
    for path in (secret, "/etc/passwd", "/etc/shadow", str(Path.cwd() / "config.toml"), sys.executable):
        r = await run_python_async(f"print(open({str(path)!r}, 'rb').read()[:100])")
        assert r.returncode != 0, path
        assert "s3cret" not in r.stdout and "root:" not in r.stdout
        assert "FileNotFoundError" in r.stderr, r.stderr


async def test_a_fork_bomb_is_contained() -> None:
    # Bounded on purpose: even if every layer failed, this makes at most 200 sleeping processes.
    code = (
        "import os, time\n"
        "print(os.readlink('/proc/self/ns/pid'), flush=True)\n"
        "forked = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as e:\n"
        "        print('refused', type(e).__name__, flush=True)\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    forked += 1\n"
        "print('forked', forked, flush=True)\n"
    )
    t0 = time.monotonic()
    r = await run_python_async(code, timeout_s=10, max_procs=32)
    assert time.monotonic() - t0 < 8
    lines = r.stdout.splitlines()
    assert lines[1].startswith("refused"), r.stdout + r.stderr
    assert int(lines[2].split()[1]) < 32
    # from outside: the box's namespace is empty once the run returns; its sleepers died with it
    await asyncio.sleep(0.2)
    assert box_processes(lines[0]) == [], "a process of the sandbox outlived it"
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
    if os.geteuid() != 0:
        pytest.skip("as a plain user the box's host uid is the service's: RLIMIT_NPROC counts the service too")
    r = await run_python_async(code, max_procs=8)
    assert r.ok, r.stderr
    assert int(r.stdout) < 8


async def test_an_endless_loop_is_killed_by_the_wall_timeout() -> None:
    # a busy loop burns CPU as fast as wall time, so the CPU limit (equal to the timeout by
    # default) may fire first: either way it is killed within the limit
    for code, reasons in (
        ("while True:\n    pass\n", {"timeout", "cpu"}),
        ("import time\ntime.sleep(60)\n", {"timeout"}),
    ):
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


async def test_cancelling_the_caller_kills_the_box() -> None:
    task = asyncio.create_task(run_python_async("import os, time\nos.fork()\ntime.sleep(60)", timeout_s=30))
    namespaces: set[str] = set()
    for _ in range(50):
        await asyncio.sleep(0.1)
        namespaces = {_readlink(f"/proc/{p}/ns/pid") for p in _descendants(os.getpid())} - {
            _readlink("/proc/self/ns/pid")
        }
        if namespaces and sum(len(box_processes(ns)) for ns in namespaces) >= 3:
            break
    assert namespaces, "the box did not start"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.3)
    assert not [p for ns in namespaces for p in box_processes(ns)]


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
    for name in ("../escape.py", "/etc/x", "main.py", "a/b.py", ".."):
        with pytest.raises(ValueError):
            await run_python_async("print(1)", files={name: "x"})


def test_the_seccomp_program_is_refused_for_other_architectures() -> None:
    assert len(seccomp_program("x86_64")) % 8 == 0
    with pytest.raises(OSError, match="aarch64"):
        seccomp_program("aarch64")


def test_config_check_and_serve_refuse_code_tests_without_bubblewrap(tmp_path: Path, smol_path: Path) -> None:
    cfg = smol_config(tmp_path, large="none")
    text = cfg.read_text()
    cfg.write_text(text.replace("[tiers.price]", '[[tiers.verifiers]]\nname = "code_tests"\n\n[tiers.price]', 1))
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}  # no bwrap on the PATH
    for command in (["config", "check"], ["serve", "--port", "0"]):
        out = subprocess.run(
            [sys.executable, "-m", "router.cli", "--config", str(cfg), *command],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert out.returncode != 0, command
        assert "tiers[0] (small).verifiers[" in out.stderr and "(code_tests)" in out.stderr, out.stderr
        assert "bubblewrap" in out.stderr
        assert "Traceback" not in out.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "router.cli", "--config", str(cfg), "config", "check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "code_tests" not in ok.stderr, ok.stderr


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            children.setdefault(_parent(int(entry)), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1
