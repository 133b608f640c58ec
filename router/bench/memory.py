"""A server's resident memory (now, its peak since start, its peak over a stretch) and CPU time, read from /proc.

Read from /proc rather than asked of the server, so any process on this machine can be watched
(ours, llama-cpp-python's, vLLM's) without its cooperation; with no pid there is simply no figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path


def read_memory(pid: int | None) -> dict[str, float] | None:
    """Resident memory of a process on this machine, in MiB: now (VmRSS) and its peak since it
    started (VmHWM). None when there is no such process."""
    if pid is None:
        return None
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found: dict[str, float] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found["rss_mib" if key == "VmRSS" else "hwm_mib"] = round(int(rest.split()[0]) / 1024, 1)
    return found or None


class MemoryWatch:
    """The peak of a process's resident memory over a stretch of time, sampled from /proc."""

    def __init__(self, pid: int | None, interval_s: float = 0.1) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_mib: float | None = None
        self.end: dict[str, float] | None = None
        self._task: asyncio.Task[None] | None = None

    def _sample(self) -> dict[str, float] | None:
        now = read_memory(self.pid)
        if now is not None:
            self.peak_mib = max(self.peak_mib or 0.0, now["rss_mib"])
        return now

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self._sample()

    async def __aenter__(self) -> MemoryWatch:
        if self._sample() is not None:
            self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.end = self._sample()

    def result(self) -> dict[str, float | None] | None:
        if self.end is None and self.peak_mib is None:
            return None
        return {
            "peak_rss_mib": self.peak_mib,
            "rss_end_mib": self.end["rss_mib"] if self.end else None,
            "hwm_mib": self.end.get("hwm_mib") if self.end else None,
        }


def read_cpu_s(pid: int | None) -> float | None:
    """The CPU time (user + system, every thread) a process has used so far, from /proc; None when
    it cannot be read. On a machine busy with other work, a server's CPU time per request is the
    figure that contention does not inflate, where its wall-clock latency is."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the command name: state is field 3, utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
