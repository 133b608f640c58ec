"""What touches llama.cpp's process-wide state, and guards the model against other threads.

Kept apart from the engine because a vocabulary read (`vocab`) needs the same log routing and
backend init as a model load, and because `ModelGuard` is the one piece other threads touch.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from router.errors import UnavailableError


def physical_cores() -> int:
    """Physical cores from /proc/cpuinfo (llama.cpp gains nothing from SMT siblings)."""
    import os

    try:
        cores: set[tuple[str, str]] = set()
        phys = core = ""
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "physical id":
                    phys = value
                elif key == "core id":
                    core = value
                elif not key and (phys or core):
                    cores.add((phys, core))
                    phys = core = ""
        if phys or core:
            cores.add((phys, core))
        if cores:
            return len(cores)
    except OSError:
        pass
    return os.cpu_count() or 1


_native_log_callback: Any = None


def route_native_logs() -> None:
    """Send llama.cpp's own log lines to Python logging (debug), instead of raw stderr, where
    harmless vocabulary notices look like errors to an operator."""
    global _native_log_callback
    import llama_cpp as lc

    if _native_log_callback is not None:
        return
    native = logging.getLogger("llama_cpp.native")

    @lc.llama_log_callback  # type: ignore[untyped-decorator]
    def forward(level: int, text: bytes, user_data: Any) -> None:
        native.debug("%s", text.decode("utf-8", errors="replace").rstrip())

    _native_log_callback = forward  # ctypes callbacks must outlive every call into llama.cpp
    lc.llama_log_set(forward, ctypes.c_void_p(0))


class ModelGuard:
    """Lets other threads make read-only native calls on the model (tokenizing) only while it is
    loaded: `use()` refuses once `close()` has begun, and `close()` returns when the last user has
    left, so the engine thread never frees a model that another thread is reading."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cv = threading.Condition()
        self._users = 0
        self._open = False

    def open(self) -> None:
        with self._cv:
            self._open = True

    @contextmanager
    def use(self) -> Iterator[None]:
        with self._cv:
            if not self._open:
                raise UnavailableError(f"tier '{self.name}' has no model loaded now; retry later", retry_after=5.0)
            self._users += 1
        try:
            yield
        finally:
            with self._cv:
                self._users -= 1
                self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._open = False
            self._cv.wait_for(lambda: self._users == 0)


def read_ahead(path: str | os.PathLike[str]) -> None:
    """Ask the kernel to read a model file into the page cache now, in large sequential reads.

    llama.cpp maps the file and faults its weights in as it touches them (repacking them for this
    CPU), so a file not in the page cache is read in small pieces: on this project's 2-core VM a
    cold 1.1 GB model took about a minute that way, and every other process's fsync waited behind
    those reads meanwhile (measured: a SQLite test 1.5 -> 12 s beside a cold load, no slower beside
    a warm one). The advice starts the whole read at once; it is nearly free when the file is
    already cached, and a failure only means llama.cpp reads as before."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # llama.cpp reports a missing or unreadable file itself
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except (OSError, AttributeError):
        pass  # not on this platform or file system: llama.cpp faults the weights in as before
    finally:
        os.close(fd)
