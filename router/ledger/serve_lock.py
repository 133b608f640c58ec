"""One `tierroute serve` per SQLite ledger: a second is refused at start.

A SQLite ledger's budgets and rate limits are enforced in the serving process (its reservations,
its rate windows, its spend read back at start), so two processes on one file each admit
against the whole budget: the outside review ran two on one ledger and they spent $0.031 of a
$0.02 team budget between them. Several replicas share limits only through PostgreSQL
(`ledger.url`), where admission is decided in the database.

`serve` takes an exclusive `flock` on a file beside the ledger (`<ledger>.serve-lock`) and holds
it for the process's life. The kernel drops it when the process ends however it ends (`kill -9`
too), so a crashed server never blocks the next start, and nothing has to be cleaned up; the
file itself stays, holding the last holder's pid for the error message. The lock is the
serving process's alone: the CLI's reads and writes (`report`, `keys list`, `keys create`) take
no lock and run beside a server, as SQLite's WAL mode lets them. The descriptor is not inherited
by the processes the service starts (schema workers, sandboxes: Python opens it close-on-exec),
so none of them can outlive the server holding it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from router.config import LedgerSettings
from router.errors import ConfigError

SUFFIX = ".serve-lock"


class ServeLock:
    """The held lock; `release` (or the process's end) lets the next server start."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd: int | None = fd
        self.path = path

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor of the open file drops the flock
            self.fd = None


def lock_path(ledger: Path) -> Path:
    """The lock file of a SQLite ledger: beside the file it resolves to, so two spellings of one
    ledger (a relative path, a symlink) take one lock."""
    found = ledger.expanduser().resolve()
    return found.with_name(found.name + SUFFIX)


def hold(settings: LedgerSettings) -> ServeLock | None:
    """The serving lock of the SQLite ledger `settings` name (None for a PostgreSQL ledger or none
    at all); ConfigError, naming ledger.path and the process holding it, when another has it."""
    if not settings.enabled or settings.url is not None:
        return None
    path = lock_path(Path(settings.path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ConfigError(f"ledger.path: cannot create the serving lock {path}: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise ConfigError(
            f"ledger.path: {settings.path} is already served by another `tierroute serve`{holder}. A SQLite "
            "ledger serves one process: budgets and rate limits are enforced inside it, so two would each "
            "spend the whole budget. Stop the other process, or run several replicas on a PostgreSQL ledger "
            "(ledger.url; docs/ledger.md, Several replicas)."
        ) from None
    except OSError as exc:
        os.close(fd)
        raise ConfigError(f"ledger.path: cannot lock {path}: {exc}") from None
    with contextlib.suppress(OSError):  # only for the message a second server prints
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return ServeLock(fd, path)


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {text})" if text.isdigit() else ""
