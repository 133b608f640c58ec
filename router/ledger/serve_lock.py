"""One `tierroute serve` per SQLite ledger: a second is refused at start.

A SQLite ledger's budgets and rate limits are enforced in the serving process (its reservations,
its rate windows, its spend read back at start), so two processes on one file each admit
against the whole budget: the outside review ran two on one ledger and they spent $0.031 of a
$0.02 team budget between them. Several replicas share limits only through PostgreSQL
(`ledger.url`), where admission is decided in the database.

`serve` takes an exclusive `flock` on the ledger's database file itself and holds it for the
process's life: a lock on the file, not on a name, so every spelling of one ledger takes the same
lock (a relative path, a symlink, and a hard link or a bind mount too, which resolve to another
name but are the same file; the outside review started a second server through a hard link when
the lock was a file named after the ledger). SQLite's own locks are POSIX record locks, which
Linux keeps apart from `flock`'s, so this lock never blocks SQLite's. The kernel drops it when the
process ends however it ends (`kill -9` too), so a crashed server never blocks the next start,
and nothing has to be cleaned up. The holder's pid is written to a file beside the ledger
(`<ledger>.serve-lock`) for the message a second server prints. The lock is the
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
    ledger = Path(settings.path).expanduser()
    path = lock_path(ledger)
    try:
        ledger.parent.mkdir(parents=True, exist_ok=True)
        # an empty file is an empty SQLite database: the ledger opens it as it would have made it
        fd = os.open(ledger, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ConfigError(f"ledger.path: cannot open {ledger} to lock it: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = _holder(path)
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
        path.write_text(f"{os.getpid()}\n")
    return ServeLock(fd, path)


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="ascii")[:32].strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {text})" if text.isdigit() else ""
