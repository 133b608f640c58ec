"""One cgroup v2 per sandbox, so a box's memory and task count are capped as a whole.

Why: RLIMIT_AS caps each process of a box, so a box of ``max_procs`` processes may hold
``max_procs`` times its ``memory_mb``. A cgroup's ``memory.max`` caps them together, with what the
kernel allocates on their behalf and charges to them: tmpfs pages, pipe buffers, page tables,
inodes and dentries, TCP and UDP socket buffers. It does not cap ``AF_UNIX`` socket buffers (the
kernel charges socket memory to a cgroup only for the protocols that keep a memory account, TCP
and UDP among them), which is why the seccomp rules on socket buffers apply in both modes
(`verifiers.sandbox.seccomp`).

Where: only where the service was given a cgroup subtree to manage, which this module must
recognise rather than assume. As root every cgroup directory is writable, so "writable" does not
mean "ours"; a cgroup counts as delegated when

- the service runs at the root of a cgroup namespace that is not the host's root cgroup (a
  container started with its own cgroup namespace), or
- the cgroup carries systemd's delegation mark (the ``trusted.delegate`` or ``user.delegate``
  extended attribute that ``Delegate=yes`` sets),

and the memory and pids controllers are available in it. A cgroup that has processes cannot give
controllers to children (cgroup v2's no-internal-process rule), so the service, when alone in its
delegated cgroup, moves itself into a ``tierroute-service`` leaf first; when other processes share
it, nothing is moved and the rlimit mode is used. A delegated parent whose ``cgroup.subtree_control``
already holds memory and pids (a second service process, systemd's ``DelegateSubgroup=``) is used
as it is.

Each box gets a child ``tierroute-box-<pid>-<n>`` with ``memory.max``, ``memory.swap.max`` 0,
``memory.oom.group`` 1 (an out-of-memory kill takes the whole box) and ``pids.max``; the box's
first process enters it before bubblewrap starts (a ``sh`` that writes itself into
``cgroup.procs`` and then execs bwrap), so every process of the box is born inside. On leaving,
``cgroup.kill`` ends whatever is left and the directory is removed.

This host kind (cgroup v1 with an empty unified mount) never takes this path; the detection is
tested here with built cgroup trees, the path itself only where a delegated cgroup v2 exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SERVICE_LEAF = "tierroute-service"
BOX_PREFIX = "tierroute-box-"
_NEEDED = frozenset({"memory", "pids"})
_DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")
_REMOVE_WAIT_S = 2.0


@dataclass(frozen=True)
class Delegation:
    """Where boxes' cgroups go: ``parent``; ``leave_first`` when the service must first move itself
    out of ``parent`` into a leaf (it is alone there)."""

    parent: Path
    leave_first: bool


def own_cgroup(proc_self_cgroup: str) -> str | None:
    """The process's cgroup v2 path (``0::/path``), relative to its cgroup namespace's root."""
    for line in proc_self_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def cgroup2_mount(mountinfo: str) -> tuple[str, str] | None:
    """(root of the hierarchy that is mounted, mount point) of the first cgroup2 mount."""
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if sep and tail.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            return _unescape(fields[3]), _unescape(fields[4])
    return None


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def find_delegation(pid: int, proc_self_cgroup: str, mountinfo: str) -> Delegation | str:
    """Where this process may make cgroups for its boxes, or why it may not (a sentence)."""
    path = own_cgroup(proc_self_cgroup)
    mount = cgroup2_mount(mountinfo)
    if path is None or mount is None:
        return "no cgroup v2 hierarchy"
    root, mountpoint = mount
    if root != "/" and path != root and not path.startswith(root.rstrip("/") + "/"):
        return f"the service's cgroup {path} is outside the mounted cgroup2 tree"
    own = Path(mountpoint) / os.path.relpath(path, root)
    if not _NEEDED <= _words(own / "cgroup.controllers"):
        v1 = any(":memory:" in line for line in proc_self_cgroup.splitlines())
        held = " (a cgroup v1 hierarchy holds the memory controller)" if v1 else ""
        return f"cgroup v2 at {mountpoint} does not offer the memory and pids controllers to {own}{held}"
    if not (own / "memory.max").exists():
        return "the service runs in the host's root cgroup: it was given no cgroup of its own"
    at_namespace_root = path == "/"
    parent_is_namespace_root = os.path.dirname(path) == "/" and (own.parent / "memory.max").exists()
    if not at_namespace_root and (parent_is_namespace_root or _delegated(own.parent)):
        # the service sits in a leaf of a delegated cgroup that already gives children their
        # controllers: its own earlier set-up (a child process of it), or systemd's DelegateSubgroup=
        if _NEEDED <= _words(own.parent / "cgroup.subtree_control") and _writable(own.parent):
            return Delegation(own.parent, leave_first=False)
    if not (at_namespace_root or _delegated(own)):
        return f"the service's cgroup {own} is not delegated to it (no cgroup namespace, no systemd Delegate=)"
    if not _writable(own):
        return f"the service's cgroup {own} is not writable"
    others = _words(own / "cgroup.procs") - {str(pid)}
    if others:
        return f"{len(others)} other process(es) share the service's cgroup {own}; give the service one of its own"
    return Delegation(own, leave_first=True)


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _writable(directory: Path) -> bool:
    files = (directory, directory / "cgroup.procs", directory / "cgroup.subtree_control")
    return all(os.access(p, os.W_OK) for p in files)


def _delegated(directory: Path) -> bool:
    for name in _DELEGATE_XATTRS:
        with contextlib.suppress(OSError):
            if os.getxattr(directory, name).strip(b"\0\n ") in (b"1", b"yes", b"true"):
                return True
    return False


class BoxCgroups:
    """The delegated parent under which each box gets a cgroup of its own."""

    def __init__(self, parent: Path) -> None:
        self.parent = parent
        self._numbers = itertools.count(1)

    @classmethod
    def claim(cls, delegation: Delegation, pid: int) -> BoxCgroups:
        """Make ``delegation.parent`` ready to hold boxes; raises OSError when the kernel refuses."""
        parent = delegation.parent
        if delegation.leave_first:
            leaf = parent / SERVICE_LEAF
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(pid))
        missing = _NEEDED - _words(parent / "cgroup.subtree_control")
        if missing:
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(missing)))
        return cls(parent)

    def new_box(self, memory_bytes: int, max_tasks: int) -> BoxCgroup:
        path = self.parent / f"{BOX_PREFIX}{os.getpid()}-{next(self._numbers)}"
        path.mkdir()
        box = BoxCgroup(path)
        try:
            (path / "memory.max").write_text(str(memory_bytes))
            if (path / "memory.swap.max").exists():  # absent where the kernel has no swap accounting
                (path / "memory.swap.max").write_text("0")
            (path / "memory.oom.group").write_text("1")
            (path / "pids.max").write_text(str(max_tasks))
        except OSError:
            box.remove_now()
            raise
        return box


class BoxCgroup:
    """One box's cgroup: the processes of the box are born in it (see `entry_argv`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entry_argv(self, sh: str) -> list[str]:
        """A prefix for the box's command: this shell writes itself into the cgroup, then becomes
        the command, so the command's first instruction already runs inside."""
        return [sh, "-c", 'echo 0 > "$1" && shift && exec "$@"', "sh", str(self.path / "cgroup.procs")]

    def memory_exceeded(self) -> bool:
        """Whether the kernel killed a process of the box for reaching ``memory.max``."""
        try:
            events = dict(line.split() for line in (self.path / "memory.events").read_text().splitlines())
        except (OSError, ValueError):
            return False
        return int(events.get("oom_kill", 0)) > 0 or int(events.get("oom_group_kill", 0)) > 0

    def kill(self) -> None:
        try:
            (self.path / "cgroup.kill").write_text("1")
        except FileNotFoundError:  # before Linux 5.14: kill what is listed
            for pid in _words(self.path / "cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid), 9)
        except OSError:
            pass

    async def remove(self) -> None:
        """Kill what is left and remove the directory once it is empty (a box's cgroup must not
        outlive it: another box could not be told apart from its leftovers)."""
        self.kill()
        deadline = time.monotonic() + _REMOVE_WAIT_S
        while self._populated() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.remove_now()

    def remove_blocking(self) -> None:
        """`remove` for callers without an event loop (the start-up probe)."""
        self.kill()
        deadline = time.monotonic() + _REMOVE_WAIT_S
        while self._populated() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.remove_now()

    def _populated(self) -> bool:
        return "populated 1" in _read(self.path / "cgroup.events")

    def remove_now(self) -> None:
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("sandbox: could not remove the box cgroup %s: %s", self.path, exc)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
