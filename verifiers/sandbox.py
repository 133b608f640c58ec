"""Run untrusted, model-written Python inside operating-system isolation (bubblewrap).

Why bubblewrap: it is the maintained, daemon-less tool that Flatpak uses to build exactly this kind
of box out of Linux namespaces; it is one small C program (Debian's ``bubblewrap``), needs no
service, and takes a seccomp program from us. An in-process hook (PEP 578) cannot be a boundary:
the code it guards runs in the same interpreter and can find and disable it; an earlier version of
this module learned that from confirmed escapes.

What every run gets (a run that cannot have all of it does not run; see `available`):

- a fresh mount namespace whose root is an empty read-only tmpfs; the only files in it are the
  interpreter binary, the shared libraries it and its stdlib extension modules link against, and
  the stdlib directory, all bound read-only. The interpreter's own site-packages is hidden under
  an empty read-only tmpfs (``python -I -S`` would not look there anyway). Nothing of the service
  is visible: not its working directory, config, ledger, models, venv or home;
- a private writable directory (``/sandbox``, the cwd) on a tmpfs capped at ``disk_mb``, and a
  ``/dev/shm`` capped at 1 MiB; no other writable place (``/tmp`` does not exist, ``/dev`` is
  read-only: in a user namespace bwrap's ``/dev`` would otherwise be the code's own, uncapped);
- new PID, network, IPC and UTS namespaces: no network beyond the box's own loopback, no
  process outside the run can be seen, signalled or traced, a fresh ``/proc`` shows only the
  run's own processes (no ``/proc/<service>/environ``). ``--die-with-parent`` and
  ``--new-session``; when the run ends or times out the whole namespace is killed, so a child
  that called ``setsid()`` or double-forked dies with it;
- an unprivileged uid: when the service runs as root, bubblewrap runs privileged without a user
  namespace, keeps only CAP_SETUID/CAP_SETGID, and our prelude drops to uid/gid 65534 (nobody) with
  no groups before any of the answer's code exists: the code runs as host uid 65534 with no
  capabilities. When the service is an ordinary user, bubblewrap makes a user namespace where the
  code is uid 65534; on the host it is then the service's uid, confined by the namespaces above;
- a seccomp filter (a classic BPF program assembled here; other architectures are refused)
  that denies memfd_create and SysV shared memory, message queues and semaphores (RAM outside
  RLIMIT_AS), ptrace,
  process_vm_readv/writev, pidfd_open/getfd/send_signal, keyctl and friends, bpf,
  perf_event_open, userfaultfd, io_uring, mount and the new mount API, unshare, setns, clone
  with any namespace flag (clone3 reports ENOSYS so libc falls back to clone), module and kexec
  calls, open_by_handle_at;
- rlimits on address space, CPU seconds, file size, open files, processes and core dumps; an empty
  environment (three thread-count variables aside); a wall-clock timeout after which the namespace
  is killed.

What it does not give: RLIMIT_AS is per process, so a run can hold at most roughly
``max_procs * memory_mb`` plus its tmpfs caps; a cgroup would cap the total, but needs a
delegating daemon (systemd) this project does not assume. Time measured by CPU rlimits is per
process too; the wall timeout bounds the whole. Kernel bugs reachable through the allowed
syscalls are out of scope; run the service in a VM or gVisor where that matters. RLIMIT_NPROC
counts a host uid's processes: concurrent boxes share uid 65534's count (the service's own uid's,
when the service is not root). No audit hook is kept: it added nothing the kernel does not
already enforce, and a hook that code can disarm invites trusting it.

The box runs only the standard library: no third-party packages are visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

SANDBOX_UID = 65534  # nobody
WORKDIR = "/sandbox"

_SHM_BYTES = 1 << 20
_GRACE_S = 1.0  # how long to wait for the output pipes to close after the process exits
_PROBE_TIMEOUT_S = 20.0
_MAX_FILES = 64

# Thread pools of numeric libraries would otherwise start one thread per core.
_CHILD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class SandboxUnavailableError(OSError):
    """The machine cannot build the sandbox (bubblewrap missing, namespaces refused, ...)."""


@dataclass(frozen=True)
class SandboxResult:
    returncode: int  # negative: killed by that signal (an exit status of 129-192 reads as one)
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None  # timeout, cpu, memory, file_size, signal NAME, or None
    duration_s: float
    output_truncated: bool = False
    isolation: tuple[str, ...] = ()  # the layers the run was built with

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0
    cpu_s: float | None = None  # default: timeout_s
    memory_mb: int = 512
    max_file_mb: int = 16
    disk_mb: int = 64
    max_procs: int = 64

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be positive")
        if self.memory_mb < 32 or self.max_file_mb < 0 or self.max_procs < 1 or self.disk_mb < 1:
            raise ValueError("memory_mb >= 32, max_file_mb >= 0, disk_mb >= 1 and max_procs >= 1 are required")


# ----------------------------------------------------------------------------------------------
# the seccomp program

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_EPERM, _ENOSYS = 1, 38
# CLONE_NEWTIME | CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
# | CLONE_NEWPID | CLONE_NEWNET
_CLONE_NS_FLAGS = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# x86_64 numbers (arch/x86/entry/syscalls/syscall_64.tbl)
_DENIED_X86_64 = {
    "shmget": 29,
    # SysV message queues and semaphores: kernel memory that RLIMIT_AS does not count
    "semget": 64,
    "msgget": 68,
    "msgsnd": 69,
    "shmat": 30,
    "shmctl": 31,
    "ptrace": 101,
    "syslog": 103,
    "personality": 135,
    "uselib": 134,
    "vhangup": 153,
    "pivot_root": 155,
    "chroot": 161,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "lookup_dcookie": 212,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "finit_module": 313,
    "memfd_create": 319,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "pidfd_send_signal": 424,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "pidfd_open": 434,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
    "memfd_secret": 447,
}
_CLONE_X86_64, _CLONE3_X86_64 = 56, 435


def seccomp_program(machine: str | None = None) -> bytes:
    """The filter as ``struct sock_filter[]`` bytes, for bwrap's ``--seccomp FD``.

    Another architecture's syscalls (i386 or x32 entry points on an x86_64 kernel) kill the
    process: the numbers below mean something else there."""
    machine = machine or platform.machine()
    if machine not in ("x86_64", "amd64"):
        raise SandboxUnavailableError(f"no seccomp syscall table for architecture {machine!r} (only x86_64)")
    ld_w_abs, jeq_k, jge_k, jset_k, ret_k = 0x20, 0x15, 0x35, 0x45, 0x06
    prog: list[tuple[int, str | int, str | int, int]] = []  # code, jump-true, jump-false, k

    def jump(code: int, k: int, jt: str | int, jf: str | int = 0) -> None:
        prog.append((code, jt, jf, k))

    labels: dict[str, int] = {}
    jump(ld_w_abs, 4, 0)  # seccomp_data.arch
    jump(jeq_k, _AUDIT_ARCH_X86_64, 0, "kill")
    jump(ld_w_abs, 0, 0)  # seccomp_data.nr
    jump(jge_k, _X32_SYSCALL_BIT, "kill")
    jump(jeq_k, _CLONE_X86_64, "clone")
    jump(jeq_k, _CLONE3_X86_64, "enosys")
    for nr in sorted(_DENIED_X86_64.values()):
        jump(jeq_k, nr, "deny")
    jump(ret_k, _RET_ALLOW, 0)
    labels["clone"] = len(prog)
    jump(ld_w_abs, 16, 0)  # low word of args[0], the clone flags
    jump(jset_k, _CLONE_NS_FLAGS, "deny")
    jump(ret_k, _RET_ALLOW, 0)
    labels["deny"] = len(prog)
    jump(ret_k, _RET_ERRNO | _EPERM, 0)
    labels["enosys"] = len(prog)
    jump(ret_k, _RET_ERRNO | _ENOSYS, 0)
    labels["kill"] = len(prog)
    jump(ret_k, _RET_KILL_PROCESS, 0)
    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(prog):
        offsets = [labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
        assert all(0 <= o <= 255 for o in offsets), "seccomp jump out of range"
        out += struct.pack("<HBBI", code, offsets[0], offsets[1], k)
    return bytes(out)


# ----------------------------------------------------------------------------------------------
# what the box contains


@dataclass(frozen=True)
class _Layout:
    python: str  # the interpreter binary, by its real path
    ro_binds: tuple[tuple[str, str], ...]  # (source on the host, destination in the box)
    hidden: tuple[str, ...]  # directories inside a bound tree that are masked with an empty tmpfs


@functools.cache
def _layout() -> _Layout:
    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
    stdlib = os.path.realpath(paths["stdlib"])
    dynload = os.path.join(stdlib, "lib-dynload")
    binaries = [python]
    if os.path.isdir(dynload):
        binaries += sorted(os.path.join(dynload, n) for n in os.listdir(dynload) if n.endswith(".so"))
    binds: dict[str, str] = {python: python, stdlib: stdlib}
    for dest in _linked_libraries(binaries):
        binds.setdefault(dest, os.path.realpath(dest))
    hidden = []
    for key in ("purelib", "platlib"):
        site = os.path.realpath(paths[key])
        if site.startswith(stdlib + os.sep) and os.path.isdir(site) and site not in hidden:
            hidden.append(site)
    return _Layout(python, tuple((src, dest) for dest, src in sorted(binds.items())), tuple(hidden))


_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def _linked_libraries(binaries: list[str]) -> list[str]:
    """The shared libraries the binaries load, by the paths the loader found them at (which is
    where it will look for them inside the box, too)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise SandboxUnavailableError("ldd not found: cannot tell which shared libraries the interpreter needs")
    found: set[str] = set()
    for i in range(0, len(binaries), 32):
        out = subprocess.run(
            [ldd, *binaries[i : i + 32]], capture_output=True, text=True, timeout=30, env={"LC_ALL": "C"}, check=False
        ).stdout
        found.update(m.group(1) for m in _LDD_LINE.finditer(out))
    return sorted(p for p in found if os.path.exists(p))


def _bwrap_argv(bwrap: str, limits: Limits, files: list[tuple[int, str]], seccomp_fd: int) -> list[str]:
    layout = _layout()
    argv = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--clearenv",
    ]
    if os.geteuid() == 0:
        # no user namespace: the prelude becomes host uid 65534, so nothing it does runs as root
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    for key, value in _CHILD_ENV.items():
        argv += ["--setenv", key, value]
    parents: list[str] = []
    for _, dest in layout.ro_binds:
        parent = os.path.dirname(dest)
        while parent != "/" and parent not in parents:
            parents.append(parent)
            parent = os.path.dirname(parent)
    for parent in sorted(parents, key=lambda p: p.count("/")):
        # bwrap would make missing parents 0700 as root: then nobody could not reach the stdlib
        argv += ["--perms", "0755", "--dir", parent]
    for src, dest in layout.ro_binds:
        argv += ["--ro-bind", src, dest]
    for path in layout.hidden:
        argv += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(_SHM_BYTES), "--tmpfs", "/dev/shm"]
    # in a user namespace bwrap's /dev is the code's own, and an uncapped tmpfs: freeze it
    argv += ["--remount-ro", "/dev"]
    argv += ["--perms", "1777", "--size", str(limits.disk_mb << 20), "--tmpfs", WORKDIR]
    for fd, name in files:
        argv += ["--perms", "0666", "--file", str(fd), f"{WORKDIR}/{name}"]
    argv += ["--chdir", WORKDIR, "--remount-ro", "/", "--seccomp", str(seccomp_fd)]
    return argv


def _prelude_args(limits: Limits) -> list[str]:
    cpu = max(1, math.ceil(limits.cpu_s if limits.cpu_s is not None else limits.timeout_s))
    rlimits = [
        ("RLIMIT_CPU", cpu, cpu + 1),  # SIGXCPU first, SIGKILL a second later
        ("RLIMIT_AS", limits.memory_mb << 20, limits.memory_mb << 20),
        ("RLIMIT_FSIZE", limits.max_file_mb << 20, limits.max_file_mb << 20),
        ("RLIMIT_NOFILE", 256, 256),
        ("RLIMIT_NPROC", limits.max_procs, limits.max_procs),
        ("RLIMIT_CORE", 0, 0),
    ]
    return [str(SANDBOX_UID), *(f"{name}:{soft}:{hard}" for name, soft, hard in rlimits)]


# The prelude runs in the box before the answer's code: drop to nobody (when bwrap started us as
# root), set the rlimits, then run /sandbox/main.py. It imports nothing of this package.
_PRELUDE = """\
import os, resource, sys
uid, limits = int(sys.argv[1]), sys.argv[2:]
try:
    if os.getuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if 0 in os.getresuid() or 0 in os.getresgid():
        raise OSError("still root")
    for item in limits:
        name, soft, hard = item.split(":")
        resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
except (OSError, ValueError) as exc:
    sys.stderr.write(f"sandbox prelude failed: {exc}\\n")
    os._exit(70)
del uid, limits, resource
sys.argv = ["main.py"]
with open("main.py", "rb") as fh:
    code = compile(fh.read(), "/sandbox/main.py", "exec")
main = type(sys)("__main__")
main.__file__ = "/sandbox/main.py"
main.__builtins__ = __builtins__
sys.modules["__main__"] = main
del fh
exec(code, main.__dict__)
"""


# ----------------------------------------------------------------------------------------------
# availability


def available() -> str | None:
    """None when sandboxed runs work here, else why not (for `config check` and `serve`)."""
    return _probe()


@functools.cache
def _probe() -> str | None:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed; run `make setup` or `apt-get install bubblewrap`"
    try:
        seccomp_program()
        _layout()
    except (SandboxUnavailableError, OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    code = b"import os\nprint(os.getuid(), os.geteuid(), os.getpid())\n"
    fds = []
    try:
        fds = [_memfd("sandbox-probe", code), _memfd("sandbox-seccomp", _filter())]
        limits = Limits(timeout_s=_PROBE_TIMEOUT_S)
        argv = _bwrap_argv(bwrap, limits, [(fds[0], "main.py")], fds[1]) + _python_argv(limits)
        # synchronous: `config check` and start-up may call this inside a running event loop
        done = subprocess.run(
            argv,
            capture_output=True,
            timeout=_PROBE_TIMEOUT_S,
            pass_fds=fds,
            env={},
            cwd="/",
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap could not start: {exc}"
    finally:
        for fd in fds:
            os.close(fd)
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return f"bubblewrap cannot build the sandbox here: {tail[0][:300]}"
    seen = done.stdout.decode(errors="replace").split()
    if seen[:2] != [str(SANDBOX_UID)] * 2 or len(seen) < 3 or not seen[2].isdigit() or int(seen[2]) > 4:
        return f"the sandbox did not isolate as expected (saw {' '.join(seen)[:100]!r})"
    return None


@functools.cache
def _filter() -> bytes:
    return seccomp_program()


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        _write_all(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _python_argv(limits: Limits) -> list[str]:
    return [_layout().python, "-I", "-S", "-B", "-X", "utf8", "-c", _PRELUDE, *_prelude_args(limits)]


def _bwrap_or_raise() -> str:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailableError("bubblewrap (bwrap) is not installed")
    return bwrap


# ----------------------------------------------------------------------------------------------
# running


class SandboxProcess:
    """A started box: its stdin and stdout are the caller's to talk to, stderr is kept (capped)."""

    def __init__(self, proc: asyncio.subprocess.Process, max_output_bytes: int) -> None:
        self.proc = proc
        assert proc.stdout is not None and proc.stderr is not None
        self.stdin = proc.stdin
        self.stdout = proc.stdout
        self._err = asyncio.ensure_future(_drain(proc.stderr, max_output_bytes))

    async def stderr(self) -> tuple[bytes, bool]:
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(self._err), _GRACE_S)
        return b"", True

    def kill(self) -> None:
        # bwrap's own pid-1 in the box has PDEATHSIG=SIGKILL: when it dies the kernel kills every
        # process in the namespace, whatever session or group they moved to
        _kill_group(self.proc.pid)


@contextlib.asynccontextmanager
async def start_python(
    code: str,
    *,
    limits: Limits,
    files: Mapping[str, str | bytes] | None = None,
    stdin: bool = True,
    max_output_bytes: int = 1 << 20,
    stream_limit: int = 1 << 16,
) -> AsyncIterator[SandboxProcess]:
    """Start ``code`` as /sandbox/main.py in a box; the box is killed and reaped on leaving."""
    bwrap = _bwrap_or_raise()
    files = dict(files or {})
    if len(files) >= _MAX_FILES:
        raise ValueError(f"at most {_MAX_FILES - 1} sandbox files")
    for name in files:
        if name == "main.py" or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", name):
            raise ValueError(f"sandbox file name {name!r} must be a plain file name other than main.py")
    payload = {"main.py": code, **files}
    fds: list[int] = []
    proc: asyncio.subprocess.Process | None = None
    box: SandboxProcess | None = None
    try:
        file_fds = []
        for name, content in payload.items():
            data = content.encode() if isinstance(content, str) else content
            fds.append(await asyncio.to_thread(_memfd, "sandbox-file", data))
            file_fds.append((fds[-1], name))
        fds.append(_memfd("sandbox-seccomp", _filter()))
        await asyncio.to_thread(_layout)
        argv = _bwrap_argv(bwrap, limits, file_fds, fds[-1]) + _python_argv(limits)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd="/",
            env={},
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(fds),
            limit=stream_limit,
        )
        for fd in fds:
            os.close(fd)
        fds.clear()
        box = SandboxProcess(proc, max_output_bytes)
        yield box
    finally:
        for fd in fds:
            os.close(fd)
        if proc is not None:
            if proc.returncode is None:
                _kill_group(proc.pid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 5.0)
            if box is not None:
                box._err.cancel()


def isolation_layers() -> tuple[str, ...]:
    uid = "uid:65534" if os.geteuid() == 0 else "userns-uid:65534"
    return ("bwrap", "mountns", "pidns", "netns", "ipcns", uid, "seccomp", "rlimits", "tmpfs-caps")


async def run_python_async(
    code: str,
    *,
    timeout_s: float = 10.0,
    cpu_s: float | None = None,
    memory_mb: int = 512,
    max_file_mb: int = 16,
    disk_mb: int = 64,
    max_procs: int = 64,
    stdin: str | bytes | None = None,
    files: Mapping[str, str | bytes] | None = None,
    max_output_bytes: int = 1 << 20,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a box; never blocks the event loop.

    ``timeout_s`` bounds wall time, ``cpu_s`` (default: ``timeout_s``) CPU time per process.
    ``files`` are put into the box's directory first (plain names). Output beyond
    ``max_output_bytes`` per stream is dropped. Cancelling the caller kills the box.
    Raises SandboxUnavailableError where bubblewrap is missing.
    """
    limits = Limits(timeout_s, cpu_s, memory_mb, max_file_mb, disk_mb, max_procs)
    stdin_bytes = stdin.encode() if isinstance(stdin, str) else stdin
    start = time.monotonic()
    async with start_python(
        code, limits=limits, files=files, stdin=stdin_bytes is not None, max_output_bytes=max_output_bytes
    ) as box:
        out_task = asyncio.ensure_future(_drain(box.stdout, max_output_bytes))
        feed = None
        if box.stdin is not None and stdin_bytes is not None:
            feed = asyncio.ensure_future(_feed(box.stdin, stdin_bytes))
        timed_out = False
        try:
            await asyncio.wait_for(box.proc.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
            box.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(box.proc.wait(), 5.0)
        finally:
            if feed is not None:
                feed.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(out_task), _GRACE_S)
        if not out_task.done():
            out_task.cancel()
        stdout, out_cut = out_task.result() if out_task.done() and not out_task.cancelled() else (b"", True)
        stderr, err_cut = await box.stderr()
        returncode = box.proc.returncode if box.proc.returncode is not None else -signal.SIGKILL
        if 128 < returncode < 128 + 65:
            # bwrap passes a signal death of the code on as 128 + the signal, as a shell would
            returncode = 128 - returncode
        stderr_text = stderr.decode("utf-8", "replace")
        return SandboxResult(
            returncode=returncode,
            stdout=stdout.decode("utf-8", "replace"),
            stderr=stderr_text,
            timed_out=timed_out,
            killed_reason=_killed_reason(returncode, stderr_text, timed_out),
            duration_s=time.monotonic() - start,
            output_truncated=out_cut or err_cut,
            isolation=isolation_layers(),
        )


def run_python(code: str, **options: Any) -> SandboxResult:
    """Blocking twin of `run_python_async` (same keyword options), for code without an event loop
    (threads of an eval runner, scripts). Inside a running loop, await `run_python_async`."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_python_async(code, **options))
    raise RuntimeError("run_python() would block the running event loop; await run_python_async()")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


async def _drain(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    """Read a stream to its end, keeping the first `cap` bytes; keep reading so the box never
    blocks on a full pipe."""
    kept = bytearray()
    cut = False
    while chunk := await stream.read(1 << 16):
        room = cap - len(kept)
        if len(chunk) > room:
            cut = True
        if room > 0:
            kept += chunk[:room]
    return bytes(kept), cut


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    # a box that exits without reading its input is not an error of ours
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.close()


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def _killed_reason(returncode: int, stderr: str, timed_out: bool) -> str | None:
    if timed_out:
        return "timeout"
    if returncode == -signal.SIGXCPU:
        return "cpu"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    if returncode == 0:
        return None
    last = next((ln for ln in reversed(stderr[-2000:].splitlines()) if ln.strip()), "")
    if "MemoryError" in last:
        return "memory"
    if "[Errno 27]" in last:  # EFBIG: RLIMIT_FSIZE (Python ignores SIGXFSZ and raises instead)
        return "file_size"
    return None
