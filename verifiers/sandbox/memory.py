"""How much memory one sandbox can hold on this host, and which mechanism holds it there.

Two modes, chosen once per process (`choose`), logged at start-up and named in every run's
``isolation``:

- ``cgroup-memory``, where the service was given a cgroup v2 subtree with the memory and pids
  controllers (`verifiers.sandbox.cgroup`): each box gets ``memory.max`` = memory_mb + disk_mb + 1 MiB
  (/dev/shm) + 32 MiB (bubblewrap, page tables, the stdlib's page cache), ``memory.swap.max`` 0 and
  ``pids.max`` = max_procs + 2 (bubblewrap's two processes). Processes, tmpfs, pipes and kernel
  objects made for the box are counted together.
- ``rlimit-memory`` everywhere else: RLIMIT_AS caps each process at memory_mb and RLIMIT_NPROC
  their number, so the box's processes hold at most max_procs x memory_mb, plus the kernel's
  bookkeeping for each (page tables, memory maps, stack), which no rlimit counts. Page tables are
  the large part: RLIMIT_AS counts the size of mappings, not how far apart they lie, and a page
  mapped alone in its own gigabyte of address space needs a page-table page and a middle-directory
  page of its own (a third, the upper directory, with five-level paging). So memory_mb of small
  mappings spread over the address space, only read, cost 2 x memory_mb of page tables (a box
  of one 64 MiB process held 103 MiB of them; the arithmetic once assumed dense mappings, 128 KiB).

In both modes what the kernel keeps outside any process or cgroup count is held down by the
seccomp filter (`verifiers.sandbox.seccomp`: no socket but AF_UNIX stream ones, no listen, no socket
buffer resizing, no pipe resizing, no vmsplice, splice, tee or sendfile, no AIO, inotify or
fanotify, no extended attributes written) and by RLIMIT_NOFILE = 64: a socket holds at most about
2 x ``net.core.wmem_default`` (one message may pass the buffer's size before the sender blocks), a
pipe 64 KiB, and the number of them is bounded by the open files, max_procs x 64, plus the files
a box can leave in flight in an AF_UNIX socket after closing them (the kernel allows a user
RLIMIT_NOFILE of those, plus one message of up to 253). AF_UNIX buffers are not charged to a cgroup
(the kernel charges socket memory only for protocols that keep a memory account, such as TCP),
so this part is added in both modes; pipe buffers are charged, so in cgroup mode it over-counts.

`bound_mb` is that arithmetic, from the limits and this host's sysctls; a test fills every kind
of buffer from inside a box and checks the host's memory against it. What it leaves out: memory
the kernel spends on objects whose count no limit here bounds (empty files on the box's tmpfs
cost an inode each, not counted by its size cap; in cgroup mode they are charged), and kernel
bugs.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from dataclasses import dataclass

from verifiers.sandbox.cgroup import BoxCgroups, find_delegation

log = logging.getLogger(__name__)

MAX_OPEN_FILES = 64  # RLIMIT_NOFILE in the box; Python with a Pool of 8 workers uses about 26
SHM_MB = 1  # the box's /dev/shm
CGROUP_SLACK_MB = 32
BWRAP_TASKS = 2  # bubblewrap's monitor outside the PID namespace and its init inside
_SCM_MAX_FD = 253  # fds one AF_UNIX message may carry past the in-flight check
_PIPE_KIB = 64  # 16 pages, the default, which F_SETPIPE_SZ being refused keeps
_FILE_OVERHEAD_KIB = 4  # struct file, inode, dentry, socket or pipe bookkeeping
_MAP_ENTRY_BYTES = 256  # a vm_area_struct and its share of the maple tree


@dataclass(frozen=True)
class MemoryMode:
    name: str  # "cgroup-memory" or "rlimit-memory"
    why: str  # where the cgroups are made, or why there are none (for the start-up log)
    cgroups: BoxCgroups | None = None
    sh: str | None = None  # the shell that moves a box into its cgroup


def choose() -> MemoryMode:
    """The cgroup mode where this process was given a delegated cgroup v2 (and set it up), else the
    rlimit mode with the reason. Moves this process into a leaf cgroup when that is needed."""
    try:
        with open("/proc/self/cgroup") as fh, open("/proc/self/mountinfo") as mi:
            found = find_delegation(os.getpid(), fh.read(), mi.read())
    except OSError as exc:
        found = f"cannot read this process's cgroup: {exc}"
    if isinstance(found, str):
        return MemoryMode("rlimit-memory", found)
    sh = shutil.which("sh")
    if sh is None:
        return MemoryMode("rlimit-memory", "no sh to move a box into its cgroup")
    try:
        cgroups = BoxCgroups.claim(found, os.getpid())
    except OSError as exc:
        return MemoryMode("rlimit-memory", f"could not set up cgroups under {found.parent}: {exc}")
    return MemoryMode("cgroup-memory", f"one cgroup per box under {found.parent}", cgroups, sh)


def cgroup_memory_bytes(memory_mb: int, disk_mb: int) -> int:
    """A box's ``memory.max`` in cgroup mode."""
    return (memory_mb + disk_mb + SHM_MB + CGROUP_SLACK_MB) << 20


def buffered_files(max_procs: int) -> int:
    """How many pipes and sockets one box can keep alive: open in its processes or in flight."""
    return max_procs * MAX_OPEN_FILES + MAX_OPEN_FILES + _SCM_MAX_FD


def per_file_kib() -> int:
    """The most kernel memory one pipe or AF_UNIX socket can hold with its size left alone."""
    return max(2 * _sysctl("net/core/wmem_default", 212992) // 1024, _PIPE_KIB) + _FILE_OVERHEAD_KIB


def page_table_kib(memory_mb: int) -> int:
    """The most page-table memory memory_mb of mappings can need: a page of each level below the
    top-level directory's per page mapped (each alone in its own region), plus the at most 256
    pages of the level under the top (1 MiB), plus the top-level directory and its copy (PTI)."""
    return memory_mb * 1024 * _table_levels() + 1024 + 8


def per_process_kernel_kib(memory_mb: int) -> int:
    """Page tables for memory_mb of mappings at their sparsest, the most memory maps a process may
    have, a stack."""
    maps = _sysctl("vm/max_map_count", 65530) * _MAP_ENTRY_BYTES // 1024
    return page_table_kib(memory_mb) + maps + 64


def bound_mb(mode_name: str, memory_mb: int, disk_mb: int, max_procs: int) -> int:
    """The most host memory one box can hold in the given mode (see the module docstring)."""
    buffers_kib = buffered_files(max_procs) * per_file_kib()
    if mode_name == "cgroup-memory":
        held_kib = cgroup_memory_bytes(memory_mb, disk_mb) >> 10
    else:
        held_kib = max_procs * (memory_mb * 1024 + per_process_kernel_kib(memory_mb)) + (disk_mb + SHM_MB) * 1024
    return -(-(held_kib + buffers_kib) // 1024)


def describe(mode: MemoryMode) -> str:
    """One line for the start-up log: the mode, why, and the bound's terms on this host."""
    files = f"(max_procs x {MAX_OPEN_FILES} + {MAX_OPEN_FILES + _SCM_MAX_FD}) x {per_file_kib()} KiB of buffers"
    if mode.cgroups is not None:
        held = f"memory.max = memory_mb + disk_mb + {SHM_MB + CGROUP_SLACK_MB} MiB"
    else:
        kernel = per_process_kernel_kib(0) // 1024
        held = f"max_procs x (memory_mb x {1 + _table_levels()} + {kernel} MiB) + disk_mb + {SHM_MB} MiB"
    return f"sandbox memory mode {mode.name} ({mode.why}): a box holds at most {held} + {files}"


@functools.cache
def _table_levels() -> int:
    """Page-table pages one lone page can need below the levels bounded by count: 2 (the page
    table and the middle directory), 3 where the CPU has five-level paging (the upper directory)."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line for line in fh if line.startswith("flags")), "")
    except OSError:
        return 3
    return 3 if "la57" in flags.split() else 2


def _sysctl(name: str, default: int) -> int:
    try:
        with open(f"/proc/sys/{name}") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default
