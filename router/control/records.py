"""What the control plane stores: keys, teams and end users' limits, as plain values.

A key has roles: `client` (it may send completions, list models, and the rest of /v1) and
`admin` (it may use /admin/). The two are separate on purpose: an admin key is a credential
for changing who may spend, and a leaked client key must never reach that; an admin key sends
completions only when it is also given the client role (`roles = ["admin", "client"]`). A third
role, `metrics`, reads `/metrics` and nothing else: what Prometheus scrapes with, since that page
names every key and its spend (an admin key reads it too; a client key alone does not). A fourth,
`report`, reads the dashboard under `/ui/` (router.dashboard) and nothing else: costs, quality and
spend of every key, read-only, for an operator who must not change who may spend.

Every value here is checked where it is made (`check_name`, `check_roles`, `Limits`), so the
admin API, the CLI and the config import refuse the same things with the same words.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

from router.admission.quota import Quota
from router.config import KEY_NAME_PATTERN, ApiKeyEntry, reserved_name
from router.errors import RequestError

NAME = re.compile(KEY_NAME_PATTERN)  # fullmatch: a "$" alone also matches before a final newline
USER_MAX_CHARS = 256  # OpenAI's `user` field is free text: longer ones are refused at the admin API
ROLES = ("admin", "client", "metrics", "report")
DEFAULT_USER = "*"  # a team's user-limit row that covers every user without a row of their own
# the largest whole-number limit: PostgreSQL's INTEGER column, and the same on SQLite so that a
# limit one store takes the other takes too (past it the driver fails with a 500, not a 400)
MAX_WHOLE_LIMIT = 2**31 - 1


class ControlError(RequestError):
    """A control-plane request that cannot be done as asked (a bad name, an unknown team): 400,
    or 404 (`NotFound`), or 409 (`Conflict`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="invalid_control_request")


class NotFound(ControlError):
    pass


class Conflict(ControlError):
    pass


def check_name(kind: str, name: str) -> str:
    """A key's or team's name: the pattern, and none the service uses for itself (`reserved_name`)."""
    problem = reserved_name(name) if isinstance(name, str) else None
    if problem is not None:
        raise ControlError(f"a {kind} may not be named so: {problem}")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ControlError(f"a {kind} name is 1-64 characters of letters, digits and _.@- (got {str(name)[:80]!r})")
    return name


def check_user(user: str) -> str:
    """An end user's name as an admin sets it: plain printable text. `str.isprintable` is false
    for every control character (newline, ESC), format character (U+202E RIGHT-TO-LEFT OVERRIDE,
    the bidi isolates, U+200B, U+FEFF) and separator but the ASCII space: names that would rewrite
    a terminal or reorder a log line where the limit rows and the audit target are shown."""
    if not isinstance(user, str) or not user or len(user) > USER_MAX_CHARS:
        raise ControlError(f"a user is 1-{USER_MAX_CHARS} characters (OpenAI's `user` field), or '*' for every user")
    bad = next((i for i, c in enumerate(user) if not c.isprintable()), None)
    if bad is not None:
        raise ControlError(
            f"a user is printable text: no control, format or bidi characters (U+{ord(user[bad]):04X} at "
            f"position {bad}, in {user[:bad][:40]!r})"
        )
    return user


def check_roles(roles: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    found = tuple(sorted(set(roles)))
    if not found or any(r not in ROLES for r in found):
        raise ControlError(f"roles must be a non-empty subset of {list(ROLES)} (got {list(roles)})")
    return found


@dataclass(frozen=True)
class Limits:
    """A level's limits; None: no limit of that kind."""

    usd_per_day: float | None = None
    usd_per_month: float | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ControlError(f"{f.name} must be a finite number (got {value!r})")
            if f.name.startswith("usd") and value < 0:
                raise ControlError(f"{f.name} must be >= 0 (got {value!r})")
            if not f.name.startswith("usd") and (int(value) != value or not 1 <= value <= MAX_WHOLE_LIMIT):
                raise ControlError(f"{f.name} must be a whole number from 1 to {MAX_WHOLE_LIMIT} (got {value!r})")

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def quota(self, level: Any, name: str, team: str | None = None) -> Quota:
        return Quota(level, name, team, **self.as_dict())


@dataclass(frozen=True)
class KeyRecord:
    """One API key as stored: never the key itself, only its salted hash."""

    name: str
    hash: str
    roles: tuple[str, ...] = ("client",)
    team: str | None = None
    limits: Limits = Limits()
    models: tuple[str, ...] | None = None  # None: every model; else 'auto' and tier names it may ask for
    allow_tests: bool = False
    expires_at: float | None = None
    revoked_at: float | None = None
    created_at: float = 0.0
    created_by: str = ""

    @classmethod
    def from_entry(cls, e: ApiKeyEntry, *, created_at: float = 0.0) -> KeyRecord:
        """A config key (`[[server.api_keys]]`) as a record."""
        return cls(
            name=e.name,
            hash=e.hash,
            roles=check_roles(list(e.roles)),
            limits=Limits(e.usd_per_day, e.usd_per_month, e.requests_per_minute, e.tokens_per_minute),
            allow_tests=e.allow_tests,
            created_at=created_at,
            created_by="config",
        )

    def live(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def public(self) -> dict[str, Any]:
        """What the admin API and `keys list` show: everything but the hash."""
        return {
            "name": self.name,
            "roles": list(self.roles),
            "team": self.team,
            **self.limits.as_dict(),
            "models": None if self.models is None else list(self.models),
            "allow_tests": self.allow_tests,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "created_at": self.created_at,
            "created_by": self.created_by,
        }


@dataclass(frozen=True)
class TeamRecord:
    name: str
    limits: Limits = Limits()
    created_at: float = 0.0

    def public(self) -> dict[str, Any]:
        return {"name": self.name, **self.limits.as_dict(), "created_at": self.created_at}


@dataclass(frozen=True)
class UserLimit:
    """An end user's limits within a team (user '*': every user of the team without a row)."""

    team: str
    user: str
    limits: Limits = Limits()

    def public(self) -> dict[str, Any]:
        return {"team": self.team, "user": self.user, **self.limits.as_dict()}


@dataclass(frozen=True)
class Snapshot:
    """Everything a replica authenticates and limits with, read in one transaction."""

    version: int
    keys: dict[str, KeyRecord]
    teams: dict[str, TeamRecord]
    users: dict[tuple[str, str], UserLimit]

    def user_quota(self, team: str, user: str) -> Quota | None:
        found = self.users.get((team, user)) or self.users.get((team, DEFAULT_USER))
        if found is None:
            return None
        return found.limits.quota("user", user, team)


def config_snapshot(entries: list[ApiKeyEntry]) -> Snapshot:
    """The config's keys alone: what a service without a ledger database authenticates with."""
    return Snapshot(0, {e.name: KeyRecord.from_entry(e) for e in entries}, {}, {})
