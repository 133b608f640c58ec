"""A real PostgreSQL server for the tests: Debian's binaries, `initdb` and `pg_ctl` in a temporary
directory, on a free loopback port, started once per test session (per worker, under pytest-xdist) and
stopped at its end; the `pg` and `db` fixtures in tests/conftest.py hand it out.

initdb and postgres refuse to run as root, so as root they run as the `postgres` user (the Debian
package creates it). There is no skip: a machine without PostgreSQL fails these tests, loudly
(`make setup` installs it). Each test gets a database of its own (`fresh_database`).
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg

from tests.support.servers import free_port


def _bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed: run `make setup` (apt-get install postgresql)")
    return found


class PostgresServer:
    """One server; `url(db)` for a database on it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tierroute-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.user = "postgres"
        self._as: list[str] = []
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(self.dir, account.pw_uid, account.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run(_bin("initdb"), "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8", "--no-sync")
        # the server's durability settings do not matter to a test (it kills routers, not the
        # database); fsync off keeps a loaded machine's tests fast
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off -c max_connections=200"
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-o", options, "-w", "start")
        atexit.register(self.stop)

    def _run(self, *command: str) -> None:
        done = subprocess.run([*self._as, *command], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.dir / "log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(command)} failed: {done.stdout}{done.stderr}{tail}")

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{db}"

    def create_database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if self.data.exists():
            subprocess.run(
                [*self._as, _bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=60,
            )
            shutil.rmtree(self.dir, ignore_errors=True)


_server: PostgresServer | None = None


def server() -> PostgresServer:
    """The session's server, started on first use."""
    global _server
    if _server is None:
        _server = PostgresServer()
    return _server


def stop_server() -> None:
    """Stop the session's server, if one was started."""
    global _server
    if _server is not None:
        _server.stop()
        _server = None
