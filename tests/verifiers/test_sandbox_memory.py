"""Memory the kernel holds for a box, sockets outside its network namespace, host-wide AIO: each
attack runs in a real box and is judged from outside it (issue 26, items 3, 4 and 8).

Before these rules one code_tests run held 1,768 MiB of host memory in 120 socket pairs with
raised buffers while its processes were capped at 512 MiB, a box bound a vsock port that was then
taken on the host, and a box took the host's ``fs.aio-nr`` to its maximum. The memory test
compares the host's MemAvailable while the box holds everything it could queue with the bound
`verifiers.sandbox.memory.bound_mb` states; other work on the machine moves MemAvailable too, so the
attack is sized to exceed that bound several times over were a rule missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from verifiers import sandbox
from verifiers.sandbox import Limits, available, memory_mode, run_python_async, start_python
from verifiers.sandbox import memory as box_memory
from verifiers.sandbox.cgroup import BoxCgroup, BoxCgroups
from verifiers.sandbox.memory import MemoryMode

# every box counts against uid 65534's process limit: these boxes must not run beside another
# worker's (pytest-xdist --dist loadgroup), or a box cannot fork and exits early
pytestmark = [
    pytest.mark.xdist_group("sandbox"),
    pytest.mark.timeout(180),
    pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}"),
]

# Every process of the box queues what it can in socket pairs (buffers raised where allowed),
# pipes (grown where allowed), and files sent in flight over a socket and closed, until its open
# files run out or it has queued CAP bytes. 4 processes x 384 MiB: were a rule missing, the box
# would hold about 1.5 GiB, against a stated bound of about 1.1 GiB (page tables at their sparsest
# included).
BUFFER_HOG = """
import fcntl, json, os, socket, time
CAP = 384 << 20
for _ in range(3):
    if os.fork() == 0:
        break
report = {"sndbuf": "raised", "pipe_size": "raised", "queued": 0, "in_flight": 0, "stopped": None}
carrier = socket.socketpair()
carrier[0].setblocking(False)
keep = []
def fill(send):
    try:
        while report["queued"] < CAP:
            report["queued"] += send(b"x" * 65536)
    except BlockingIOError:
        pass
try:
    while report["queued"] < CAP:
        x, y = socket.socketpair()
        for s in (x, y):
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
            except OSError as exc:
                report["sndbuf"] = exc.errno
            s.setblocking(False)
            fill(s.send)
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
        except OSError as exc:
            report["pipe_size"] = exc.errno
        os.set_blocking(w, False)
        fill(lambda data: os.write(w, data))
        try:
            socket.send_fds(carrier[0], [b"f"], [x.fileno(), y.fileno(), r, w])
            x.close(), y.close(), os.close(r), os.close(w)
            report["in_flight"] += 4
        except OSError:
            keep.append((x, y, r, w))
except OSError as exc:
    report["stopped"] = exc.errno
print(json.dumps(report), flush=True)
time.sleep(60)
"""


def mem_available_mib() -> float:
    with open("/proc/meminfo") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:")) / 1024


def sampled_mib(n: int = 5) -> float:
    samples = []
    for _ in range(n):
        samples.append(mem_available_mib())
        time.sleep(0.1)
    return statistics.median(samples)


def box_processes_left() -> int:
    """Processes of the box uid (65534) on the host: a box killed by the test before may still be
    going away, and they count against the next box's process limit (RLIMIT_NPROC is per uid)."""
    left = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            uid = next((line.split()[1] for line in status.read_text().splitlines() if line.startswith("Uid:")), "")
            left += uid == "65534"
    return left


@pytest.mark.slow
async def test_a_box_cannot_hold_kernel_buffers_beyond_its_stated_bound() -> None:
    for _ in range(100):  # up to 10 s for the boxes of earlier tests to be gone
        if not box_processes_left():
            break
        await asyncio.sleep(0.1)
    limits = Limits(timeout_s=60, memory_mb=64, max_procs=4)
    bound = box_memory.bound_mb(memory_mode().name, limits.memory_mb, limits.disk_mb, limits.max_procs)
    for attempt in range(4):
        # a box on another test worker counts against the same uid's process limit, so this box
        # may fail to fork and exit at once: that is not what is measured here, so try again
        before = await asyncio.to_thread(sampled_mib)
        async with start_python(BUFFER_HOG, limits=limits, stdin=False) as box:
            lines = [await asyncio.wait_for(box.stdout.readline(), 60) for _ in range(4)]
            if not all(lines) and attempt < 3:
                box.kill()
                continue
            reports = [json.loads(line) for line in lines]
            await asyncio.sleep(0.5)
            # while the box holds all of it; the most available of three windows, so that another
            # test process allocating for a moment (a parallel worker loading a model) does not count
            during = max([await asyncio.to_thread(sampled_mib) for _ in range(3)])
            box.kill()
        break
    await asyncio.sleep(0.5)
    after = await asyncio.to_thread(sampled_mib)
    # against the lower of the baselines before and after the box: memory another process took
    # meanwhile and kept is in both `after` and `during`, so it is not counted as the box's
    held = min(before, after) - during
    for report in reports:
        assert report["sndbuf"] == 1 and report["pipe_size"] == 1, report  # EPERM
        assert report["stopped"] in (24, None), report  # EMFILE once its open files ran out
    queued_mib = sum(r["queued"] for r in reports) / (1 << 20)
    files = box_memory.buffered_files(limits.max_procs)
    assert queued_mib <= files * box_memory.per_file_kib() / 1024, (queued_mib, reports)
    assert sum(r["in_flight"] for r in reports) <= box_memory.MAX_OPEN_FILES + 253 + 4
    # from outside: what the host lost while the box held its buffers
    assert held < bound, f"the box held {held:.0f} MiB of host memory; the stated bound is {bound} MiB"
    assert before - after < 300, "the box's memory was not given back"


# Mappings of 8 KiB, each straddling a 1 GiB boundary far from the interpreter, only read (the
# zero page): each costs two page-table pages and two middle-directory pages, 16 KiB of tables for
# 8 KiB of address space. Each of the box's processes maps what its RLIMIT_AS leaves.
PAGE_TABLE_HOG = """
import ctypes, json, os, time
try:
    if os.fork() == 0:
        time.sleep(0.1)
except BlockingIOError:  # RLIMIT_NPROC counts uid 65534's processes in other boxes too
    print(json.dumps({"maps": -1}), flush=True)
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
GB, maps = 1 << 30, 0
base = (1 << 40) + os.getpid() * (1 << 37)
for i in range(60000):
    addr = base + (2 * i + 1) * GB - 4096
    if libc.mmap(addr, 8192, 1, 0x22 | 0x100000, -1, 0) != addr:  # PROT_READ, private anonymous, NOREPLACE
        break
    ctypes.c_char.from_address(addr).value, ctypes.c_char.from_address(addr + 4096).value
    maps += 1
print(json.dumps({"maps": maps}), flush=True)
time.sleep(60)
"""


def meminfo_mib(key: str, n: int = 5) -> float:
    samples = []
    for _ in range(n):
        with open("/proc/meminfo") as fh:
            samples.append(next(int(line.split()[1]) for line in fh if line.startswith(f"{key}:")) / 1024)
        time.sleep(0.1)
    return statistics.median(samples)


@pytest.mark.slow
async def test_sparse_mappings_cost_no_more_page_tables_than_the_bound_counts() -> None:
    """RLIMIT_AS counts mapped bytes, not how sparse they lie; the page tables the host spends on a
    box's sparse mappings, read from the host's /proc/meminfo, stay within the stated per-process
    kernel term (once it assumed dense mappings: 16 MiB per 64 MiB process, where 103 MiB were held)."""
    limits = Limits(timeout_s=60, memory_mb=64, max_procs=8)
    before = await asyncio.to_thread(meminfo_mib, "PageTables")
    async with start_python(PAGE_TABLE_HOG, limits=limits, stdin=False) as box:
        reports = [json.loads(await asyncio.wait_for(box.stdout.readline(), 60)) for _ in range(2)]
        held = await asyncio.to_thread(meminfo_mib, "PageTables") - before
        box.kill()
    ran = [r for r in reports if r["maps"] >= 0]
    assert ran and all(r["maps"] > 1000 for r in ran), reports  # the attack ran: each mapped its share
    stated = len(ran) * box_memory.per_process_kernel_kib(limits.memory_mb) / 1024
    assert held < stated, f"the box's page tables took {held:.0f} MiB; the stated kernel term is {stated:.0f} MiB"
    assert held > 50, held  # and the attack is real: far beyond dense tables (a few hundred KiB)


# Three ways to make the kernel hold memory that neither RLIMIT_AS nor the socket and pipe
# arithmetic counts, each stopped at about 300 MiB: one byte from each of 16 pipe pages spliced per
# call into a socket (the socket counts 16 bytes, the pages stay), inotify queues of events with
# 255-byte names, and user.* extended attributes on the box's tmpfs (not counted by its size cap).
KERNEL_OBJECT_HOG = """
import ctypes, json, os, socket, time
libc = ctypes.CDLL(None, use_errno=True)
CAP = 300 << 20
seen, keep = {}, []
try:
    r, w = os.pipe2(os.O_DIRECT | os.O_NONBLOCK)
    pinned = 0
    while pinned < CAP:
        a, b = socket.socketpair()
        a.setblocking(False)
        keep.append((a, b))
        while pinned < CAP:
            try:
                for _ in range(16):
                    os.write(w, b"x")
            except BlockingIOError:
                pass
            try:
                pinned += os.splice(r, a.fileno(), 16, flags=os.SPLICE_F_NONBLOCK) * 4096
            except BlockingIOError:
                break
    seen["splice"] = "ok"
except OSError as exc:
    seen["splice"] = exc.errno
for _ in range(20):
    fd = libc.inotify_init1(os.O_NONBLOCK)
    if fd < 0:
        seen["inotify"] = ctypes.get_errno()
        break
    libc.inotify_add_watch(fd, b"/sandbox", 0xFFF)
    keep.append(fd)
else:
    name = "/sandbox/" + "a" * 255
    open(name, "w").close()
    for _ in range(8200):
        os.close(os.open(name, os.O_RDONLY))
    seen["inotify"] = "ok"
try:
    open("x", "w").close()
    for k in range(CAP // 2 // 65536):
        os.setxattr("x", f"user.k{k}", b"v" * 65536)
    seen["xattr"] = "ok"
except OSError as exc:
    seen["xattr"] = exc.errno
print(json.dumps(seen), flush=True)
time.sleep(60)
"""


@pytest.mark.slow
async def test_pinned_pages_event_queues_and_xattrs_are_refused_and_hold_no_host_memory() -> None:
    limits = Limits(timeout_s=60, memory_mb=64, max_procs=1)
    bound = box_memory.bound_mb(memory_mode().name, limits.memory_mb, limits.disk_mb, limits.max_procs)
    before = await asyncio.to_thread(sampled_mib)
    async with start_python(KERNEL_OBJECT_HOG, limits=limits, stdin=False) as box:
        seen = json.loads(await asyncio.wait_for(box.stdout.readline(), 60))
        await asyncio.sleep(0.5)
        held = before - await asyncio.to_thread(sampled_mib)
        box.kill()
    # answered as a kernel or filesystem without the feature: ENOSYS, ENOSYS, EOPNOTSUPP
    assert seen == {"splice": 38, "inotify": 38, "xattr": 95}, seen
    assert held < bound, f"the box held {held:.0f} MiB of host memory; the stated bound is {bound} MiB"


# What a sender leaves queued at a receiver after closing: 40 datagram receivers fed by one closed
# sender after another (each takes max_dgram_qlen + 1 messages, about 2 MiB), and a listening
# socket's unaccepted connections whose clients filled them and closed (up to somaxconn), stopped
# at 700 MiB. Were a rule missing, the box would hold about 800 MiB against a bound of about 430.
SOCKET_QUEUE_HOG = """
import json, socket, time
CAP = 700 << 20
seen = {}
queued, keep = 0, []
try:
    while len(keep) < 40:
        r = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        r.bind(b"\\0r%d" % len(keep))
        keep.append(r)
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.setblocking(False)
            try:
                queued += s.sendto(b"x" * 200000, r.getsockname())
            except BlockingIOError:
                break
            finally:
                s.close()
    seen["datagram"] = "ok"
except OSError as exc:
    seen["datagram"] = exc.errno
try:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(b"\\0listener")
    listener.listen(4096)
    queued = 0
    while queued < CAP:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.setblocking(False)
        c.connect(b"\\0listener")
        try:
            while queued < CAP:
                queued += c.send(b"x" * 65536)
        except BlockingIOError:
            pass
        c.close()
    seen["listen"] = "ok"
except OSError as exc:
    seen["listen"] = exc.errno
print(json.dumps(seen), flush=True)
time.sleep(60)
"""


@pytest.mark.slow
async def test_closed_senders_leave_nothing_queued_beyond_the_bound() -> None:
    limits = Limits(timeout_s=60, memory_mb=64, max_procs=1)
    bound = box_memory.bound_mb(memory_mode().name, limits.memory_mb, limits.disk_mb, limits.max_procs)
    before = await asyncio.to_thread(sampled_mib)
    async with start_python(SOCKET_QUEUE_HOG, limits=limits, stdin=False) as box:
        seen = json.loads(await asyncio.wait_for(box.stdout.readline(), 60))
        await asyncio.sleep(0.5)
        held = before - await asyncio.to_thread(sampled_mib)
        box.kill()
    assert held < bound, f"the box held {held:.0f} MiB of host memory; the stated bound is {bound} MiB"
    assert seen == {"datagram": 94, "listen": 95}, seen  # ESOCKTNOSUPPORT, EOPNOTSUPP


VSOCK_AND_FAMILIES = """
import json, socket, time
PORT = {port}
seen = {{}}
def attempt(name, fn):
    try:
        fn()
        seen[name] = "ok"
    except OSError as exc:
        seen[name] = exc.errno
def vsock_bind():
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    s.bind((socket.VMADDR_CID_ANY, PORT))
    s.listen()
    globals()["held"] = s
def vsock_connect():
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).connect((2, PORT))  # the host
attempt("vsock bind", vsock_bind)
attempt("vsock connect", vsock_connect)
attempt("vsock pair", lambda: socket.socketpair(socket.AF_VSOCK))
for family, kind in (("AF_INET", 1), ("AF_INET6", 2), ("AF_NETLINK", 3), ("AF_PACKET", 3)):
    attempt(family, lambda: socket.socket(getattr(socket, family), kind))
attempt("unix", lambda: socket.socketpair(socket.AF_UNIX))
print(json.dumps(seen), flush=True)
time.sleep(30)
"""


@pytest.mark.slow
async def test_a_box_can_neither_bind_nor_connect_a_vsock_nor_open_a_network_family() -> None:
    port = random.randint(20000, 60000)
    async with start_python(VSOCK_AND_FAMILIES.format(port=port), limits=Limits(timeout_s=40), stdin=False) as box:
        seen = json.loads(await asyncio.wait_for(box.stdout.readline(), 30))
        host_bind = _host_vsock_bind(port)  # while the box lives: the port is still free on the host
        box.kill()
    assert seen.pop("unix") == "ok"
    assert seen == dict.fromkeys(seen, 97), seen  # EAFNOSUPPORT for every one
    assert set(seen) == {"vsock bind", "vsock connect", "vsock pair", "AF_INET", "AF_INET6", "AF_NETLINK", "AF_PACKET"}
    assert host_bind in ("bound", "no vsock on this host"), host_bind


def _host_vsock_bind(port: int) -> str:
    try:
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except (OSError, AttributeError):
        return "no vsock on this host"
    try:
        s.bind((socket.VMADDR_CID_ANY, port))
        return "bound"
    except OSError as exc:
        return f"refused: {exc}"
    finally:
        s.close()


AIO_HOG = """
import ctypes, json, time
libc = ctypes.CDLL(None, use_errno=True)
contexts, errors = 0, set()
for _ in range(200):
    ctx = ctypes.c_ulong(0)
    if libc.syscall(206, 65536, ctypes.byref(ctx)) == 0:  # io_setup
        contexts += 1
    else:
        errors.add(ctypes.get_errno())
for name, nr in (("io_submit", 209), ("io_getevents", 208), ("io_destroy", 207), ("io_cancel", 210), ("io_pgetevents", 333)):
    libc.syscall(nr, 0, 0, 0, 0, 0)
    errors.add(ctypes.get_errno())
print(json.dumps({"contexts": contexts, "errors": sorted(errors)}), flush=True)
time.sleep(30)
"""


def _aio_nr() -> int:
    with open("/proc/sys/fs/aio-nr") as fh:
        return int(fh.read())


@pytest.mark.slow
async def test_a_box_cannot_take_the_hosts_aio_contexts() -> None:
    before = _aio_nr()
    async with start_python(AIO_HOG, limits=Limits(timeout_s=40), stdin=False) as box:
        seen = json.loads(await asyncio.wait_for(box.stdout.readline(), 30))
        during = _aio_nr()
        host_ok = _host_io_setup()
        box.kill()
    assert seen == {"contexts": 0, "errors": [38]}, seen  # ENOSYS, as a kernel without AIO says
    assert during - before < 65536, (before, during)  # one context of the box's would add 65536
    assert host_ok


def _host_io_setup() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    ctx = ctypes.c_ulong(0)
    if libc.syscall(206, 128, ctypes.byref(ctx)) != 0:
        return False
    libc.syscall(207, ctx)
    return True


@pytest.mark.slow
async def test_everyday_code_that_needs_a_socketpair_or_files_still_runs() -> None:
    # asyncio's loop and multiprocessing make AF_UNIX pairs and pipes; Pool(8) opens about 26 files
    code = textwrap.dedent("""
        import asyncio, multiprocessing
        async def main():
            await asyncio.sleep(0)
            return "loop"
        print(asyncio.run(main()))
        with multiprocessing.Pool(8) as pool:
            print(sum(pool.map(abs, range(-5, 5))))
    """)
    r = await run_python_async(code, timeout_s=30, max_procs=16)
    assert r.ok, r.stderr[-1000:]
    assert r.stdout.split() == ["loop", "25"]


@pytest.mark.slow
async def test_the_memory_mode_is_named_in_every_result_and_logged_at_start_up() -> None:
    r = await run_python_async("print(1)")
    assert r.isolation[-1] == memory_mode().name in ("cgroup-memory", "rlimit-memory")
    assert "af-unix-only" in r.isolation
    out = subprocess.run(
        [sys.executable, "-c", "from verifiers import sandbox; assert sandbox.available() is None"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 0, out.stderr
    assert f"sandbox memory mode {memory_mode().name}" in out.stderr
    assert "a box holds at most" in out.stderr


@pytest.mark.skipif(memory_mode().name != "cgroup-memory", reason="no delegated cgroup v2 here")
async def test_in_cgroup_mode_the_box_is_capped_as_a_whole_and_its_cgroup_removed() -> None:
    # 4 processes of 200 MiB each fit their RLIMIT_AS of 256 MiB, not a memory.max of 256 + 64 + 33
    code = textwrap.dedent("""
        import os, time
        for _ in range(3):
            if os.fork() == 0:
                break
        block = bytearray(200 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(5)
    """)
    mode = memory_mode()
    assert mode.cgroups is not None
    before = {p.name for p in mode.cgroups.parent.iterdir() if p.name.startswith("tierroute-box-")}
    r = await run_python_async(code, memory_mb=256, max_procs=8, timeout_s=30)
    assert r.killed_reason == "memory", (r.returncode, r.stderr[-500:])
    after = {p.name for p in mode.cgroups.parent.iterdir() if p.name.startswith("tierroute-box-")}
    assert after <= before


@pytest.mark.slow
async def test_a_box_enters_its_cgroup_before_bubblewrap_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cgroup path on a stand-in directory (this host has no delegated cgroup v2): the files
    # are plain, so what is checked is the order and the values, not the kernel's enforcement.
    # The shell stage writes "0" (itself) into cgroup.procs and then becomes bwrap.
    stand_in = MemoryMode("cgroup-memory", "a stand-in", BoxCgroups(tmp_path), shutil.which("sh"))
    monkeypatch.setattr(sandbox, "memory_mode", lambda: stand_in)
    r = await run_python_async("import os\nprint(os.getpid())", memory_mb=100, disk_mb=20, max_procs=5)
    assert r.ok and r.stdout.strip() == "2", r.stderr  # bwrap's pid 1, then the code: as without it
    (box,) = list(tmp_path.iterdir())  # a plain directory with files cannot be removed; a cgroup can
    assert box.name.startswith(f"tierroute-box-{os.getpid()}-")
    assert (box / "cgroup.procs").read_text() == "0\n"
    assert (box / "memory.max").read_text() == str((100 + 20 + 1 + 32) << 20)
    assert (box / "pids.max").read_text() == "7"  # max_procs and bubblewrap's two
    assert (box / "cgroup.kill").read_text() == "1"  # whatever was left was killed on leaving
    (box / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 1\n")
    assert BoxCgroup(box).memory_exceeded()
    (box / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    assert not BoxCgroup(box).memory_exceeded()
