"""Run untrusted, model-written Python in a contained child process.

Layers, each of which holds on its own where the others are unavailable:

- a fresh temporary directory as cwd, removed afterwards; an empty environment; ``python -I -B``;
- the child leads its own process group, and the whole group is killed on timeout or cancellation;
- a new network namespace (``unshare(CLONE_NEWNET)``; when not root, inside a new user namespace
  that maps only the caller's own ids and whose capabilities are then dropped), where the
  machine allows it: then there is no network at all, not even loopback;
- when started as root, the child drops to uid/gid 65534 (nobody), so RLIMIT_NPROC applies and
  file permissions hold. Where the interpreter lives somewhere nobody cannot read (a pyenv under
  /root), it keeps exactly one capability, CAP_DAC_READ_SEARCH, so it can still import;
- PR_SET_NO_NEW_PRIVS; rlimits on CPU seconds, address space, file size, processes, open files
  and core dumps;
- an audit hook (PEP 578), installed before the user code runs, that refuses process creation
  (fork, exec, spawn, system, subprocess), sockets that connect, bind, send or resolve names,
  ctypes, raising rlimits, signalling other processes, and any write, rename, delete or
  permission change outside the sandbox directory.

This contains the mistakes and the casual misbehaviour of generated code: runaway loops, memory
hogs, fork bombs, stray network calls, files written where they should not be. It is not a
boundary against a determined attacker with a native-code exploit; run the router in a container
or a gVisor/Firecracker sandbox where that matters.

The child reports which layers it managed to put in place (``SandboxResult.isolation``: netns,
no_caps, uid:65534, cap:dac_read_search, no_new_privs, rlimits or rlimits:partial, audit) through
a private pipe, before it runs the user code.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SANDBOX_UID = 65534  # nobody

# Thread pools of numeric libraries would otherwise start one thread per core, each counted
# against the process limit and each reserving address space against the memory limit.
_CHILD_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_GRACE_S = 1.0  # how long to wait for stragglers holding the output pipes after the child exits


@dataclass(frozen=True)
class SandboxResult:
    returncode: int  # negative: killed by that signal
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None  # timeout, cpu, memory, file_size, violation, signal NAME, or None
    duration_s: float
    output_truncated: bool = False
    isolation: tuple[str, ...] = ()  # the layers the child put in place, e.g. ("netns", "uid:65534")

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


async def run_python_async(
    code: str,
    *,
    timeout_s: float = 10.0,
    cpu_s: float | None = None,
    memory_mb: int = 512,
    max_file_mb: int = 16,
    max_procs: int = 64,
    stdin: str | bytes | None = None,
    files: Mapping[str, str | bytes] | None = None,
    max_output_bytes: int = 1 << 20,
    isolate_network: bool = True,
    python: str | None = None,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a sandboxed child; never blocks the event loop.

    ``timeout_s`` bounds wall time, ``cpu_s`` (default: ``timeout_s``) CPU time. ``files`` are
    written into the sandbox directory first (names relative to it). Output beyond
    ``max_output_bytes`` per stream is dropped. Cancelling the caller kills the child.
    """
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive")
    if memory_mb < 32 or max_file_mb < 0 or max_procs < 1:
        raise ValueError("memory_mb >= 32, max_file_mb >= 0 and max_procs >= 1 are required")
    cpu_limit = max(1, math.ceil(cpu_s if cpu_s is not None else timeout_s))
    workdir = await asyncio.to_thread(_make_workdir, code, files or {})
    status_r = status_w = -1
    config: dict[str, Any] = {
        "workdir": workdir,
        "netns": isolate_network,
        "uid": SANDBOX_UID,
        "cpu_s": cpu_limit,
        "memory_bytes": memory_mb * 1024 * 1024,
        "file_bytes": max_file_mb * 1024 * 1024,
        "procs": max_procs,
    }
    stdin_bytes = stdin.encode() if isinstance(stdin, str) else stdin
    start = time.monotonic()
    proc: asyncio.subprocess.Process | None = None
    tasks: list[asyncio.Future[Any]] = []
    try:
        status_r, status_w = os.pipe()
        config["status_fd"] = status_w
        proc = await asyncio.create_subprocess_exec(
            python or sys.executable, "-I", "-B", "-X", "utf8", "-c", _bootstrap_source(), json.dumps(config),
            stdin=asyncio.subprocess.PIPE if stdin_bytes is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env=dict(_CHILD_ENV),
            start_new_session=True,  # the child leads a process group we can kill as a whole
            close_fds=True,
            pass_fds=(status_w,),
        )
        os.close(status_w)
        status_w = -1
        assert proc.stdout is not None and proc.stderr is not None
        out_task = asyncio.ensure_future(_drain(proc.stdout, max_output_bytes))
        err_task = asyncio.ensure_future(_drain(proc.stderr, max_output_bytes))
        tasks += [out_task, err_task]
        if stdin_bytes is not None:
            assert proc.stdin is not None
            tasks.append(asyncio.ensure_future(_feed(proc.stdin, stdin_bytes)))
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
            _kill_group(proc.pid)
            await _wait_reaped(proc)
        # a process that outlived the child (a grandchild, say) may still hold the pipes open
        _, pending = await asyncio.wait((out_task, err_task), timeout=_GRACE_S)
        if pending:
            _kill_group(proc.pid)
            await asyncio.wait(pending, timeout=_GRACE_S)
        stdout, out_cut = out_task.result() if out_task.done() else (b"", True)
        stderr, err_cut = err_task.result() if err_task.done() else (b"", True)
        returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        stderr_text = stderr.decode("utf-8", "replace")
        return SandboxResult(
            returncode=returncode,
            stdout=stdout.decode("utf-8", "replace"),
            stderr=stderr_text,
            timed_out=timed_out,
            killed_reason=_killed_reason(returncode, stderr_text, timed_out),
            duration_s=time.monotonic() - start,
            output_truncated=out_cut or err_cut,
            isolation=_read_status(status_r),
        )
    except BaseException:
        if proc is not None and proc.returncode is None:
            _kill_group(proc.pid)
        raise
    finally:
        for task in tasks:
            task.cancel()
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        await asyncio.to_thread(shutil.rmtree, workdir, True)


def run_python(code: str, **options: Any) -> SandboxResult:
    """Blocking twin of `run_python_async` (same keyword options), for code without an event loop
    (threads of an eval runner, scripts). Inside a running loop, await `run_python_async`."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_python_async(code, **options))
    raise RuntimeError("run_python() would block the running event loop; await run_python_async()")


def _make_workdir(code: str, files: Mapping[str, str | bytes]) -> str:
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="tierroute-sandbox-"))
    with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as fh:
        fh.write(code)
    for name, content in files.items():
        path = os.path.realpath(os.path.join(workdir, name))
        if not path.startswith(workdir + os.sep) or path == os.path.join(workdir, "main.py"):
            shutil.rmtree(workdir, ignore_errors=True)
            raise ValueError(f"sandbox file name {name!r} must be a relative path other than main.py")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(content.encode() if isinstance(content, str) else content)
    return workdir


async def _drain(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    """Read a stream to its end, keeping the first `cap` bytes; keep reading so the child never
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
    # a child that exits without reading its input is not an error of ours
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.close()


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


async def _wait_reaped(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), 5.0)


def _read_status(fd: int) -> tuple[str, ...]:
    os.set_blocking(fd, False)
    try:
        raw = os.read(fd, 1 << 16)
        return tuple(str(x) for x in json.loads(raw))
    except (BlockingIOError, ValueError, TypeError):
        return ()


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
    tail = stderr[-2000:]
    last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
    if "MemoryError" in last:
        return "memory"
    if "SandboxViolation" in last:
        return "violation"
    if "[Errno 27]" in last:  # EFBIG: RLIMIT_FSIZE (Python ignores SIGXFSZ and raises instead)
        return "file_size"
    return None


@functools.cache
def _bootstrap_source() -> str:
    body = textwrap.dedent(inspect.getsource(_child_main))
    return f"import sys\n{body}\n_child_main(sys.argv[1])\n"


def _child_main(config_json: str) -> None:  # pragma: no cover - runs only inside the child
    """The child's prelude: put every layer in place, report them, then run main.py.

    Shipped to the child as source text (``python -c``), so it imports nothing from this package
    and must stay self-contained.
    """
    import ctypes
    import importlib.machinery
    import json
    import os
    import resource
    import runpy
    import sys

    import _posixsubprocess  # type: ignore[import-not-found]

    cfg = json.loads(config_json)
    workdir = os.path.realpath(cfg["workdir"])
    layers: list[str] = []
    libc = ctypes.CDLL(None, use_errno=True)

    def set_caps(mask: int) -> bool:
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        data = (Data * 2)()
        for i in range(2):
            word = (mask >> (32 * i)) & 0xFFFFFFFF
            data[i].effective = data[i].permitted = word
        return libc.capset(ctypes.byref(header), data) == 0

    def write_file(path: str, text: str) -> None:
        with open(path, "w") as fh:
            fh.write(text)

    # 1. No network: a fresh namespace has only a loopback device, and it is down.
    if cfg["netns"]:
        clone_newnet, clone_newuser = 0x40000000, 0x10000000
        if os.geteuid() == 0:
            if libc.unshare(clone_newnet) == 0:
                layers.append("netns")
        else:
            outer_uid, outer_gid = os.geteuid(), os.getegid()
            if libc.unshare(clone_newnet | clone_newuser) == 0:
                layers.append("netns")
                try:
                    # map our own ids, or the process could not create a single file
                    write_file("/proc/self/setgroups", "deny")
                    write_file("/proc/self/uid_map", f"{outer_uid} {outer_uid} 1")
                    write_file("/proc/self/gid_map", f"{outer_gid} {outer_gid} 1")
                except OSError:
                    pass
                if set_caps(0):  # the new user namespace granted every capability in it: drop them
                    layers.append("no_caps")

    # 2. Not root: as root RLIMIT_NPROC is not enforced and every file is writable.
    def readable_as(uid: int, paths: list[str]) -> bool:
        os.setegid(uid)
        os.seteuid(uid)
        try:
            for p in paths:
                os.listdir(p)
            return True
        except OSError:
            return False
        finally:
            os.seteuid(0)
            os.setegid(0)

    def drop_root(uid: int) -> None:
        import_paths = [p for p in sys.path if os.path.isdir(p)] + [os.path.dirname(os.__file__), workdir]
        os.setgroups([])
        for dirpath, dirnames, filenames in os.walk(workdir):
            for name in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
                os.chown(name, uid, uid)
        if readable_as(uid, import_paths):
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            layers.append(f"uid:{uid}")
            return
        # The interpreter lives where nobody cannot read (a pyenv under /root): keep read access
        # to files, and nothing else. First prove capset works, while a failure costs nothing.
        dac_read_search, setgid, setuid, pr_set_keepcaps = 2, 6, 7, 8
        if not set_caps((1 << dac_read_search) | (1 << setgid) | (1 << setuid)):
            return
        libc.prctl(pr_set_keepcaps, 1, 0, 0, 0)
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if not set_caps(1 << dac_read_search):
            sys.stderr.write("sandbox: could not set capabilities after dropping root\n")
            os._exit(70)
        libc.prctl(pr_set_keepcaps, 0, 0, 0, 0)
        layers.append(f"uid:{uid}")
        layers.append("cap:dac_read_search")

    uid = cfg["uid"]
    if os.geteuid() == 0 and uid is not None:
        try:
            drop_root(uid)
        except OSError:
            pass  # a container without CAP_SETUID or CAP_CHOWN: the other layers still hold
    if libc.prctl(38, 1, 0, 0, 0) == 0:  # PR_SET_NO_NEW_PRIVS
        layers.append("no_new_privs")

    # 3. Resource limits.
    limits = [
        (resource.RLIMIT_CPU, cfg["cpu_s"], cfg["cpu_s"] + 1),  # SIGXCPU first, SIGKILL a second later
        (resource.RLIMIT_AS, cfg["memory_bytes"], cfg["memory_bytes"]),
        (resource.RLIMIT_FSIZE, cfg["file_bytes"], cfg["file_bytes"]),
        (resource.RLIMIT_NOFILE, 256, 256),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    if os.getuid() != 0 and f"uid:{uid}" in layers:
        # counted per user: only meaningful for the sandbox's own uid, never for the caller's
        limits.append((resource.RLIMIT_NPROC, cfg["procs"], cfg["procs"]))
    all_set = True
    for which, soft, hard in limits:
        _, current_hard = resource.getrlimit(which)
        if current_hard != resource.RLIM_INFINITY:
            hard = min(hard, current_hard)  # only root could raise it, and we may not be root
            soft = min(soft, hard)
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            all_set = False
    layers.append("rlimits" if all_set else "rlimits:partial")

    # 4. The audit hook.
    class SandboxViolation(PermissionError):
        pass

    SandboxViolation.__qualname__ = "SandboxViolation"
    realpath, fspath, fsdecode, isdir = os.path.realpath, os.fspath, os.fsdecode, os.path.isdir
    getpid = os.getpid
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    native_suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    prefix = workdir + os.sep
    refused = frozenset({
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
        "subprocess.Popen", "os.killpg", "signal.pthread_kill",
        "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
        "resource.setrlimit", "resource.prlimit", "sys.remote_exec",
    })
    path_events = {  # event -> positions of the path arguments to check
        "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
        "os.symlink": (1,), "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
        "os.chflags": (0,), "os.lchflags": (0,), "os.setxattr": (0,), "os.removexattr": (0,),
        "shutil.rmtree": (0,), "os.mkfifo": (0,), "os.mknod": (0,),
    }

    # Kept privileges (root, or CAP_DAC_READ_SEARCH) could read what nobody may not: limit reads
    # to the sandbox, the interpreter's own trees, and files any user could read anyway.
    privileged = os.getuid() == 0 or "cap:dac_read_search" in layers
    own_trees = tuple({realpath(p) + os.sep for p in [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path] if p})

    def resolve(path: object) -> str | None:
        try:
            return realpath(fsdecode(fspath(path)))  # type: ignore[arg-type]
        except TypeError:
            return None  # a file descriptor: already checked when it was opened

    def inside(full: str | None) -> bool:
        return full is None or full == workdir or full.startswith(prefix)

    def anyone_may_read(full: str) -> bool:
        if full.startswith(own_trees) or full == "/dev/null":
            return True
        try:
            if not os.stat(full).st_mode & 0o004:
                return False
            parent = os.path.dirname(full)
            while True:
                if not os.stat(parent).st_mode & 0o001:
                    return False
                if parent == "/":
                    return True
                parent = os.path.dirname(parent)
        except OSError:
            return True  # missing: the open itself will fail

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event in refused or event.startswith("ctypes."):
            raise SandboxViolation(f"sandbox refused {event}")
        if event == "os.kill":
            if args[0] != getpid():
                raise SandboxViolation("sandbox refused os.kill of another process")
        elif event in ("open", "sqlite3.connect"):
            path, mode, flags = (args + (None, None))[:3] if event == "open" else (args[0], "a", 0)
            if path is None or isinstance(path, int):
                return
            full = resolve(path)
            if full is None or inside(full) and not full.endswith(native_suffixes):
                return
            writing = bool((flags or 0) & write_flags) or any(c in (mode or "") for c in "wax+")
            if writing:
                if full.endswith(native_suffixes):
                    raise SandboxViolation("sandbox refused writing a native extension module")
                if full != "/dev/null":
                    raise SandboxViolation(f"sandbox refused writing {path!r} outside its directory")
            elif inside(full):
                return
            elif mode is None and isdir(full):
                # a directory fd from os.open would let dir_fd= reach outside unseen
                raise SandboxViolation(f"sandbox refused opening directory {path!r}")
            elif privileged and not anyone_may_read(full):
                raise SandboxViolation(f"sandbox refused reading {path!r}")
        elif event == "import" and args[0] == "_posixsubprocess":
            raise SandboxViolation("sandbox refused importing _posixsubprocess")
        elif event in path_events:
            for i in path_events[event]:
                if i < len(args) and not inside(resolve(args[i])):
                    raise SandboxViolation(f"sandbox refused {event} on {args[i]!r} outside its directory")

    def no_fork_exec(*args: object, **kwargs: object) -> None:
        raise SandboxViolation("sandbox refused _posixsubprocess.fork_exec")

    _posixsubprocess.fork_exec = no_fork_exec  # reached without an audit event in older Pythons
    sys.addaudithook(hook)
    layers.append("audit")

    os.write(cfg["status_fd"], json.dumps(layers).encode())
    os.close(cfg["status_fd"])
    runpy.run_path(os.path.join(workdir, "main.py"), run_name="__main__")
