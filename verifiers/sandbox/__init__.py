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
- a seccomp filter (`verifiers.sandbox.seccomp`, a classic BPF program; other architectures are refused)
  that denies memfd_create and SysV shared memory, message queues and semaphores (RAM outside
  RLIMIT_AS), ptrace, process_vm_readv/writev, pidfd_open/getfd/send_signal, keyctl and friends,
  bpf, perf_event_open, userfaultfd, io_uring and the AIO calls, mount and the new mount API,
  unshare, setns, clone with any namespace flag (clone3 reports ENOSYS so libc falls back to
  clone), module and kexec calls, open_by_handle_at, vmsplice, splice, tee and sendfile (pages
  pinned in a socket beyond what its buffer counts), inotify and fanotify (event queues), writing
  extended attributes (kept by tmpfs beyond its size cap); every socket family but AF_UNIX
  (EAFNOSUPPORT: no AF_VSOCK, which the network namespace does not cover, no netlink, no packet
  sockets), and of AF_UNIX all but stream sockets, and listen (a closed sender's data stays
  queued at its receiver); resizing a socket's buffers or a pipe;
- rlimits on address space, CPU seconds, file size, open files (64), processes and core dumps; an
  empty environment (three thread-count variables aside); a wall-clock timeout after which the
  namespace is killed;
- where the service was given a delegated cgroup v2 subtree, a cgroup per box with ``memory.max``
  and ``pids.max`` (`verifiers.sandbox.memory` says which mode runs, logs it at start-up and puts it
  last in ``isolation``: ``cgroup-memory`` or ``rlimit-memory``).

What it does not give: without the cgroup, RLIMIT_AS is per process, so a run can hold about
``max_procs * memory_mb``, up to twice that again in page tables (RLIMIT_AS does not see how sparse
mappings lie), plus its tmpfs caps plus the kernel buffers of its pipes and sockets
(`verifiers.sandbox.memory.bound_mb` computes the whole bound for either mode). Time measured by CPU
rlimits is per process too; the wall timeout bounds the whole. Kernel bugs reachable through the
allowed syscalls are out of scope; run the service in a VM or gVisor where that matters.
RLIMIT_NPROC counts a host uid's processes: concurrent boxes share uid 65534's count (the
service's own uid's, when the service is not root). No audit hook is kept: it added nothing the
kernel does not already enforce, and a hook that code can disarm invites trusting it.

The box runs only the standard library: no third-party packages are visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from verifiers.sandbox import memory as box_memory
from verifiers.sandbox import seccomp
from verifiers.sandbox.cgroup import BoxCgroup
from verifiers.sandbox.memory import MemoryMode

log = logging.getLogger(__name__)

SANDBOX_UID = 65534  # nobody
WORKDIR = "/sandbox"

_SHM_BYTES = box_memory.SHM_MB << 20
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


def seccomp_program(machine: str | None = None) -> bytes:
    """The filter (`verifiers.sandbox.seccomp`) as ``struct sock_filter[]`` bytes, for bwrap's ``--seccomp FD``."""
    try:
        return seccomp.program(machine)
    except seccomp.UnsupportedArchitectureError as exc:
        raise SandboxUnavailableError(str(exc)) from exc


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
        ("RLIMIT_NOFILE", box_memory.MAX_OPEN_FILES, box_memory.MAX_OPEN_FILES),
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
    return _setup()[0]


def memory_mode() -> MemoryMode:
    """How this host bounds a box's memory (`verifiers.sandbox.memory`); decided, set up and logged
    once per process, with the first sandboxed run or availability check."""
    return _setup()[1]


_SETUP_LOCK = threading.Lock()


def _setup() -> tuple[str | None, MemoryMode]:
    # a lock around the cache: the cgroup set-up may move this process, and must happen once
    with _SETUP_LOCK:
        return _setup_once()


@functools.cache
def _setup_once() -> tuple[str | None, MemoryMode]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        missing = "bubblewrap (bwrap) is not installed; run `make setup` or `apt-get install bubblewrap`"
        return missing, MemoryMode("rlimit-memory", missing)
    try:
        seccomp_program()
        _layout()
    except (SandboxUnavailableError, OSError, subprocess.SubprocessError) as exc:
        return str(exc), MemoryMode("rlimit-memory", str(exc))
    mode = box_memory.choose()
    reason = _probe(bwrap, mode)
    if reason is not None and mode.cgroups is not None:
        # the cgroup path failed where detection said it would work: say so, run without it
        if _probe(bwrap, MemoryMode("rlimit-memory", "")) is None:
            mode, reason = MemoryMode("rlimit-memory", f"a box could not run in its cgroup: {reason}"), None
    if reason is None:
        (log.info if mode.cgroups is not None else log.warning)("%s", box_memory.describe(mode))
    return reason, mode


def _probe(bwrap: str, mode: MemoryMode) -> str | None:
    code = b"import os\nprint(os.getuid(), os.geteuid(), os.getpid())\n"
    fds = []
    cgroup = None
    limits = Limits(timeout_s=_PROBE_TIMEOUT_S)
    try:
        fds = [_memfd("sandbox-probe", code), _memfd("sandbox-seccomp", _filter())]
        argv = _bwrap_argv(bwrap, limits, [(fds[0], "main.py")], fds[1]) + _python_argv(limits)
        if mode.cgroups is not None and mode.sh is not None:
            cgroup = mode.cgroups.new_box(_cgroup_bytes(limits), limits.max_procs + box_memory.BWRAP_TASKS)
            argv = cgroup.entry_argv(mode.sh) + argv
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
        if cgroup is not None:
            cgroup.remove_blocking()
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return f"bubblewrap cannot build the sandbox here: {tail[0][:300]}"
    seen = done.stdout.decode(errors="replace").split()
    if seen[:2] != [str(SANDBOX_UID)] * 2 or len(seen) < 3 or not seen[2].isdigit() or int(seen[2]) > 4:
        return f"the sandbox did not isolate as expected (saw {' '.join(seen)[:100]!r})"
    return None


def _cgroup_bytes(limits: Limits) -> int:
    return box_memory.cgroup_memory_bytes(limits.memory_mb, limits.disk_mb)


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

    def __init__(
        self, proc: asyncio.subprocess.Process, max_output_bytes: int, cgroup: BoxCgroup | None = None
    ) -> None:
        self.proc = proc
        assert proc.stdout is not None and proc.stderr is not None
        self.stdin = proc.stdin
        self.stdout = proc.stdout
        self._err = asyncio.ensure_future(_drain(proc.stderr, max_output_bytes))
        self._cgroup = cgroup

    def memory_exceeded(self) -> bool:
        """Whether the box's cgroup (cgroup-memory mode) killed it for reaching ``memory.max``."""
        return self._cgroup is not None and self._cgroup.memory_exceeded()

    async def stderr(self) -> tuple[bytes, bool]:
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(self._err), _GRACE_S)
        return b"", True

    def kill(self) -> None:
        # bwrap's own pid-1 in the box has PDEATHSIG=SIGKILL: when it dies the kernel kills every
        # process in the namespace, whatever session or group they moved to
        _kill_group(self.proc.pid)
        if self._cgroup is not None:
            self._cgroup.kill()


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
    mode = await asyncio.to_thread(memory_mode)
    fds: list[int] = []
    proc: asyncio.subprocess.Process | None = None
    box: SandboxProcess | None = None
    cgroup: BoxCgroup | None = None
    try:
        file_fds = []
        for name, content in payload.items():
            data = content.encode() if isinstance(content, str) else content
            fds.append(await asyncio.to_thread(_memfd, "sandbox-file", data))
            file_fds.append((fds[-1], name))
        fds.append(_memfd("sandbox-seccomp", _filter()))
        await asyncio.to_thread(_layout)
        argv = _bwrap_argv(bwrap, limits, file_fds, fds[-1]) + _python_argv(limits)
        if mode.cgroups is not None and mode.sh is not None:
            try:
                cgroup = await asyncio.to_thread(
                    mode.cgroups.new_box, _cgroup_bytes(limits), limits.max_procs + box_memory.BWRAP_TASKS
                )
            except OSError as exc:
                # the stated bound needs the cgroup: a box without one does not run
                raise SandboxUnavailableError(f"could not make the box's cgroup: {exc}") from exc
            argv = cgroup.entry_argv(mode.sh) + argv
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
        box = SandboxProcess(proc, max_output_bytes, cgroup)
        yield box
    finally:
        try:
            for fd in fds:
                os.close(fd)
            if proc is not None:
                if proc.returncode is None:
                    _kill_group(proc.pid)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 5.0)
                if box is not None:
                    box._err.cancel()
        finally:
            if cgroup is not None:  # even when the wait above was cancelled
                await cgroup.remove()


def isolation_layers() -> tuple[str, ...]:
    """The layers every box is built with here; the last names the memory mode (`memory_mode`)."""
    uid = "uid:65534" if os.geteuid() == 0 else "userns-uid:65534"
    layers = ("bwrap", "mountns", "pidns", "netns", "ipcns", uid, "seccomp", "af-unix-only", "rlimits", "tmpfs-caps")
    return (*layers, memory_mode().name)


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
            killed_reason="memory" if box.memory_exceeded() else _killed_reason(returncode, stderr_text, timed_out),
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
