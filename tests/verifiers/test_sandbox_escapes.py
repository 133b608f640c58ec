"""The escapes that broke the old in-process sandbox, each tried again and checked from outside.

Every technique below was confirmed against the audit-hook sandbox (issue 11). Each test runs the
attack in a real box and then looks at the host: the file was not created, the secret not read,
the process is gone, the memory or disk cap held, the forged pass counted as a failure. The suite
runs as root in CI (this machine kind), the case where a hole costs the most.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from router.generation import GenerationRequest, Message
from tests.support.sandbox import box_processes
from tests.support.scripted import gen
from verifiers.code_tests import CodeTestsVerifier
from verifiers.sandbox import Limits, available, run_python_async, start_python

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}"),
]

# The old hook, and what an attacker does once it is gone: every dangerous call in one script.
DISARM_THEN_EVERYTHING = """
import gc, os, sys, socket, ctypes
for obj in gc.get_objects():
    if callable(obj) and getattr(obj, "__name__", "") == "hook" and hasattr(obj, "__code__"):
        obj.__code__ = (lambda *a: None).__code__
        print("disarmed a hook")
results = {}
def attempt(name, fn):
    try:
        results[name] = repr(fn())[:60]
    except BaseException as exc:
        results[name] = "refused " + type(exc).__name__
attempt("write", lambda: open(TARGET, "w").write("escaped"))
attempt("exec", lambda: os.system("touch " + TARGET))
attempt("connect", lambda: socket.create_connection(("127.0.0.1", PORT), timeout=2))
libc = ctypes.CDLL(None, use_errno=True)
attempt("unshare", lambda: (libc.unshare(0x10000000), ctypes.get_errno()))  # CLONE_NEWUSER
attempt("memfd", lambda: (libc.syscall(319, b"x", 0), ctypes.get_errno()))
attempt("ptrace", lambda: (libc.ptrace(16, 1, 0, 0), ctypes.get_errno()))  # PTRACE_ATTACH to pid 1
pid = os.fork()
if pid == 0:
    try:
        os.execv("/bin/sh", ["sh", "-c", "touch " + TARGET])
    finally:
        os._exit(3)
results["fork+exec status"] = os.waitpid(pid, 0)[1] >> 8
print(results)
"""


async def test_disarming_the_audit_hook_gains_nothing(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    connections = 0

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    code = f"TARGET = {str(target)!r}\nPORT = {port}\n" + DISARM_THEN_EVERYTHING
    try:
        r = await run_python_async(code, timeout_s=15)
    finally:
        server.close()
        await server.wait_closed()
    assert r.ok, r.stderr
    assert not target.exists()
    assert connections == 0
    seen = eval(r.stdout.splitlines()[-1])  # noqa: S307 - our own script's printed dict
    assert seen["write"].startswith("refused") and seen["connect"].startswith("refused")
    # ctypes works, and buys nothing: the kernel's filter answers EPERM, whatever Python thinks
    assert seen["unshare"] == seen["memfd"] == seen["ptrace"] == "(-1, 1)", seen
    assert seen["fork+exec status"] == 3  # no /bin/sh in the box
    assert seen["exec"] != "0"


async def test_dir_fd_relative_paths_reach_nothing_outside(tmp_path: Path) -> None:
    secret = tmp_path / "secret.key"
    secret.write_text("TOP-SECRET-VALUE")
    secret.chmod(0o600)
    written = tmp_path / "planted.txt"
    rel_secret = str(secret).lstrip("/")
    rel_written = str(written).lstrip("/")
    code = textwrap.dedent(f"""
        import os
        root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
        for rel in ({rel_secret!r}, "etc/shadow", "proc/1/environ"):
            try:
                fd = os.open(rel, os.O_RDONLY, dir_fd=root)
                print("read", rel, os.read(fd, 200))
            except OSError as exc:
                print("refused", rel, exc.errno)
        try:
            fd = os.open({rel_written!r}, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=root)
            os.write(fd, b"planted")
            print("wrote")
        except OSError as exc:
            print("refused write", exc.errno)
    """)
    r = await run_python_async(code)
    assert r.ok, r.stderr
    assert "TOP-SECRET-VALUE" not in r.stdout and "root:" not in r.stdout
    assert r.stdout.count("refused") == 4, r.stdout
    assert not written.exists()
    assert secret.read_text() == "TOP-SECRET-VALUE"


async def test_sqlite_attach_and_uri_create_nothing_outside(tmp_path: Path) -> None:
    # a stand-in for the service's ledger: a real SQLite file the box must neither read nor change
    ledger = tmp_path / "ledger.db"
    with sqlite3.connect(ledger) as db:
        db.execute("create table spend (key text, usd real)")
        db.execute("insert into spend values ('k1', 5.0)")
    before = ledger.read_bytes()
    created = tmp_path / "created.db"
    code = textwrap.dedent(f"""
        import sqlite3
        con = sqlite3.connect(":memory:")
        for statement in (
            "ATTACH DATABASE {str(created)!r} AS a",
            "ATTACH DATABASE {str(ledger)!r} AS l",
            "ATTACH DATABASE 'file:{created}?mode=rwc' AS u",
        ):
            try:
                con.execute(statement)
                print("attached", statement)
            except sqlite3.Error as exc:
                print("refused", type(exc).__name__)
        try:
            con.execute("UPDATE l.spend SET usd = 0")
            con.commit()
            print("rewrote the ledger")
        except sqlite3.Error as exc:
            print("refused update", type(exc).__name__)
        try:
            sqlite3.connect("file:{created}?mode=rwc", uri=True).execute("create table t (x)")
            print("created by uri")
        except sqlite3.Error as exc:
            print("refused", type(exc).__name__)
    """)
    r = await run_python_async(code)
    assert r.ok, r.stderr
    assert "rewrote the ledger" not in r.stdout and "created by uri" not in r.stdout
    assert not created.exists()
    assert ledger.read_bytes() == before
    with sqlite3.connect(ledger) as db:
        assert db.execute("select usd from spend").fetchall() == [(5.0,)]


def _host_shmem_kib() -> int:
    with open("/proc/meminfo") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("Shmem:"))


async def test_memory_outside_rlimit_as_and_disk_are_capped() -> None:
    # memfd and SysV shared memory are RAM that RLIMIT_AS does not count; tmpfs writes are RAM too
    code = textwrap.dedent("""
        import ctypes, mmap, os, sys, time
        stored = {}
        try:
            fd = os.memfd_create("hog")
            os.ftruncate(fd, 1536 << 20)
            m = mmap.mmap(fd, 1536 << 20)
            stored["memfd"] = 1536
        except OSError as exc:
            stored["memfd"] = "refused " + str(exc.errno)
        libc = ctypes.CDLL(None, use_errno=True)
        shmid = libc.shmget(0, 1536 << 20, 0o1600)
        stored["shmget"] = "refused" if shmid < 0 else "got"
        for place in ("/sandbox", "/dev/shm"):
            total = 0
            block = b"x" * (1 << 20)
            try:
                for i in range(2048):
                    with open(f"{place}/fill{i}", "wb") as fh:
                        fh.write(block * 8)
                    total += 8
            except OSError as exc:
                stored[place] = (total, exc.errno)
        print(stored, flush=True)
        time.sleep(3)
    """)
    limits = Limits(timeout_s=30, max_file_mb=16, disk_mb=64)
    before = _host_shmem_kib()
    peak = before
    async with start_python(code, limits=limits, stdin=False) as box:
        line = await asyncio.wait_for(box.stdout.readline(), 25)
        # measured from outside, while the box holds everything it managed to store
        peak = max(peak, _host_shmem_kib())
        await asyncio.wait_for(box.proc.wait(), 25)
    stored = eval(line)  # noqa: S307 - our own script's printed dict
    assert stored["memfd"] == "refused 1", stored
    assert stored["shmget"] == "refused"
    assert stored["/sandbox"][0] <= 64 and stored["/sandbox"][1] == 28  # ENOSPC at the tmpfs cap
    assert stored["/dev/shm"][0] <= 1 and stored["/dev/shm"][1] == 28
    # other processes on the machine move Shmem too; the box alone could have added 3 GiB
    assert peak - before < 400 << 10


async def test_a_setsid_child_dies_with_the_run() -> None:
    code = textwrap.dedent("""
        import os, time
        print(os.readlink("/proc/self/ns/pid"), flush=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)
            os._exit(0)
        time.sleep(0.3)
        print("parent done", flush=True)
    """)
    r = await run_python_async(code, timeout_s=10)
    assert r.ok and "parent done" in r.stdout
    ns = r.stdout.split()[0]
    await asyncio.sleep(0.2)
    assert box_processes(ns) == [], "the detached grandchild outlived the run"


async def test_the_service_cannot_be_read_or_signalled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPSTREAM_API_KEY", "sk-must-not-leak")
    victim = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={"UPSTREAM_API_KEY": "sk-must-not-leak"}
    )
    config = Path(__file__).resolve().parents[2] / "config.toml"
    try:
        code = textwrap.dedent(f"""
            import ctypes, os, signal
            out = []
            for path in ({str(config)!r}, "/proc/{os.getpid()}/environ", "/proc/{victim.pid}/environ", "/proc/1/environ"):
                try:
                    out.append(("read", path, open(path, "rb").read(300)))
                except OSError as exc:
                    out.append(("refused", path, exc.errno))
            for pid in ({os.getpid()}, {victim.pid}):
                try:
                    os.kill(pid, signal.SIGKILL)
                    out.append(("killed", pid))
                except OSError as exc:
                    out.append(("refused kill", pid, exc.errno))
                try:
                    fd = os.pidfd_open(pid)
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    out.append(("pidfd killed", pid))
                except OSError as exc:
                    out.append(("refused pidfd", pid, exc.errno))
            libc = ctypes.CDLL(None, use_errno=True)
            out.append(("raw pidfd_send_signal", libc.syscall(424, 3, 9, 0, 0), ctypes.get_errno()))
            print(out)
        """)
        r = await run_python_async(code)
        assert r.ok, r.stderr
        assert "sk-must-not-leak" not in r.stdout
        assert "[tiers" not in r.stdout and "('read'" not in r.stdout, r.stdout
        assert "('killed'" not in r.stdout and "('pidfd killed'" not in r.stdout, r.stdout
        # from outside: both the test process (the service's stand-in) and the victim live on
        time.sleep(0.2)
        assert victim.poll() is None
        # kill(-1) signals everything the caller may: inside the box that is the box alone
        r = await run_python_async(
            "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError as e:\n    print(e)"
        )
        time.sleep(0.2)
        assert victim.poll() is None
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()


def chat(text: str, **metadata: object) -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", text),), metadata=metadata)


# The exploit against the old harness: find its nonce in a frame, print "passed" records, exit 0.
OLD_FORGERY = """
import os, sys, json
frame = sys._getframe()
found = set()
while frame is not None:
    for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
        if isinstance(value, str) and 8 <= len(value) <= 64 and all(c in "0123456789abcdef" for c in value):
            found.add(value)
    frame = frame.f_back
for nonce in found:
    for _ in range(10):
        os.write(1, (nonce + json.dumps({"kind": "unit", "passed": True, "error": None}) + "\\n").encode())
        os.write(1, (json.dumps({"id": nonce, "ok": True, "printed": "", "value": {"t": "B", "v": True}, "truth": True}) + "\\n").encode())
os._exit(0)
"""

# A forger that knows the new protocol: it takes over the worker's input and answers every request
# itself, in protocol, with whatever would pass most checks it can see.
PROTOCOL_FORGERY = """
import json, os, sys
def f(x):
    return 0
def forge():
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            os._exit(0)
        req = json.loads(line)
        reply = {"id": req["id"], "ok": True, "printed": "", "value": {"t": "B", "v": True}, "truth": True}
        os.write(1, (json.dumps(reply) + "\\n").encode())
if __name__ != "__main__":
    # the load request is already read: answer it, then every later one
    os.write(1, (json.dumps({"id": sys._getframe(1).f_locals.get("rid"), "ok": True, "printed": ""}) + "\\n").encode())
    forge()
"""


async def test_a_forged_pass_counts_as_a_failure() -> None:
    tests = "assert f(2) == 4\nassert f(3) == 9\nassert f(10) == 100\nassert f(-1) == 1\n"
    request = chat("Write f(x) returning x squared.", tests=tests)
    v = CodeTestsVerifier(unit_timeout_s=2, timeout_s=10)
    old = await v.score(request, gen(f"```python\n{OLD_FORGERY}\n```"))
    assert old.value == 0.0, old
    assert old.details["reason"] in ("forged", "crashed"), old.details
    new = await v.score(request, gen(f"```python\n{PROTOCOL_FORGERY}\n```"))
    # in protocol, yet each reply is plain data the checker compares with an expectation it never
    # sent: a value of True is not 4, 9, 100 or 1
    assert new.value == 0.0, new
    assert new.details.get("passed", 0) == 0
    honest = await v.score(request, gen("```python\ndef f(x):\n    return x * x\n```"))
    assert honest.value == 1.0, honest


async def test_sandbox_output_never_reaches_the_score() -> None:
    # failure text is an exfiltration channel: only counts and a fixed vocabulary come back
    leak = "LEAKED-" + "x" * 20
    code = f"```python\nimport sys\nprint({leak!r}, file=sys.stderr)\ndef f(x):\n    raise ValueError({leak!r})\n```"
    s = await CodeTestsVerifier().score(chat("Write f.", tests="assert f(1) == 1\n"), gen(code))
    assert s.value == 0.0
    assert leak not in repr(s)
    assert s.details["failures"] == {"exception": 1}
    broken = await CodeTestsVerifier().score(chat("Write f."), gen(f"```python\nraise RuntimeError({leak!r})\n```"))
    assert broken.reason == "load_error" and leak not in repr(broken)


async def test_the_grader_does_not_take_an_early_exit_for_a_pass() -> None:
    from evals.grading import grade_code_tests

    tests = "def check(candidate):\n    assert candidate(2) == 4\n"
    for cheat in ("import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n", "exit()\n"):
        answer = f"```python\ndef f(x):\n    return 0\n{cheat}```"
        grade = await grade_code_tests(answer, tests, entry_point="f")
        assert not grade.correct, cheat
    right = await grade_code_tests("```python\ndef f(x):\n    return x * x\n```", tests, entry_point="f")
    assert right.correct, right
    # an answer that prints its own examples (buffered until exit) is still graded on its tests
    printing = "```python\ndef f(x):\n    return x * x\n\n# Test cases\nprint(f(2))  # 4\nprint(f(3))\n```"
    assert (await grade_code_tests(printing, tests, entry_point="f")).correct


# machine code for `mov eax, 20; int 0x80; ret`: getpid through the i386 entry, where every number
# names another call than on x86_64, so the filter kills the process rather than judge it
I386_CALL = """
import ctypes, mmap
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))
print("before", flush=True)
print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))(), flush=True)
"""
X32_CALL = """
import ctypes
print("before", flush=True)
print(ctypes.CDLL(None).syscall(0x40000000 | 39), flush=True)  # getpid through the x32 ABI
"""
# the calls that make a file descriptor: those whose objects hold memory no limit of the box counts
# are refused; the others hold a few hundred bytes each and count against RLIMIT_NOFILE
FD_CALLS = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    r = libc.syscall(nr, *args)
    return "ok" if r >= 0 else os.strerror(ctypes.get_errno())
mask = ctypes.c_ulonglong(1 << 1)
print(json.dumps({
    "mq_open": call(240, b"q", os.O_CREAT | os.O_RDWR, 0o600, None),
    "memfd_create": call(319, b"x", 0),
    "userfaultfd": call(323, 0),
    "pidfd_open": call(434, os.getpid(), 0),
    "eventfd2": call(290, 0, 0),
    "timerfd_create": call(283, 1, 0),
    "signalfd4": call(289, -1, ctypes.byref(mask), 8, 0),
    "epoll_create1": call(291, 0),
}))
"""


async def test_a_call_through_another_abi_kills_the_process() -> None:
    for code in (I386_CALL, X32_CALL):
        result = await run_python_async(code)
        assert result.stdout == "before\n" and result.returncode == -signal.SIGSYS, (code, result)


async def test_only_descriptors_that_hold_bounded_memory_can_be_made() -> None:
    result = await run_python_async(FD_CALLS)
    assert result.ok, result.stderr
    made = json.loads(result.stdout)
    assert made["mq_open"] == os.strerror(38)  # ENOSYS: no POSIX message queues
    for name in ("memfd_create", "userfaultfd", "pidfd_open"):
        assert made[name] == os.strerror(1), (name, made)  # EPERM
    for name in ("eventfd2", "timerfd_create", "signalfd4", "epoll_create1"):
        assert made[name] == "ok", (name, made)
