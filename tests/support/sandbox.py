"""Looking at sandboxes from outside: the host's view of a box's processes."""

from __future__ import annotations

import os


def box_processes(pid_ns: str) -> list[int]:
    """Host pids of live processes in the given PID namespace (``pid:[inode]``), seen from outside."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == pid_ns and _alive(int(entry)):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
