"""Which store a ledger location names: a `postgresql://` URL opens the shared PostgreSQL ledger,
anything else is a SQLite file. Kept apart from both stores: the choice sits above them, and
psycopg is imported only by those who open a PostgreSQL ledger.
"""

from __future__ import annotations

import os
from pathlib import Path

from router.config import LedgerSettings, postgres_url_problem
from router.errors import ConfigError
from router.ledger.entries import LedgerStore
from router.ledger.store import SQLiteStore

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(location: str | Path) -> bool:
    return str(location).startswith(POSTGRES_SCHEMES)


def open_store(
    location: str | Path,
    *,
    read_only: bool = False,
    settings: LedgerSettings | None = None,
    hold_ttl_s: float = 600.0,
) -> LedgerStore:
    """The store at `location` (not yet opened); `settings` gives a PostgreSQL store its password
    variable, pool size and timeout."""
    text = str(location)
    if not is_postgres(text):
        return SQLiteStore(location, read_only=read_only)
    s = settings if settings is not None else LedgerSettings()
    problem = postgres_url_problem(text)
    if problem is not None:
        raise ConfigError(problem)
    from router.ledger.postgres import PostgresStore  # psycopg only for those who open a PostgreSQL ledger

    return PostgresStore(
        text,
        password=password_of(s),
        read_only=read_only,
        pool_size=s.pool_size,
        connect_timeout_s=s.connect_timeout_s,
        hold_ttl_s=hold_ttl_s,
        synchronous_commit=s.synchronous_commit,
    )


def password_of(settings: LedgerSettings) -> str | None:
    """The password from the variable `ledger.password_env` names (refused when it is unset)."""
    if settings.password_env is None:
        return None
    value = os.environ.get(settings.password_env)
    if value is None:
        raise ConfigError(f"ledger.password_env: the environment variable {settings.password_env} is not set")
    return value
