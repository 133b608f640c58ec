"""A quota: one level's limits (a key's, its team's, or an end user's within the team).

Kept apart from admission so the caller's identity (`router.admission.auth.Principal`) and the
limits that decide on it (`router.admission.limits`) both build on it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from router.config import ApiKeyEntry

Level = Literal["key", "team", "user"]


@dataclass(frozen=True)
class Quota:
    """One level's limits: a key's, its team's (every key of the team together), or an end
    user's within the team (OpenAI's `user` field). A request is admitted only if it fits every
    quota it falls under; each keeps its counters under `subject`."""

    level: Level
    name: str  # the key's, team's or user's name
    team: str | None = None  # an end user's team
    usd_per_day: float | None = None
    usd_per_month: float | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @property
    def subject(self) -> str:
        """The id its counters (spend, rate and token windows, row lock) are kept under: a key's
        name as before teams existed, 'team:NAME', 'user:TEAM:USER' (names hold no ':')."""
        if self.level == "key":
            return self.name
        if self.level == "team":
            return f"team:{self.name}"
        return f"user:{self.team}:{self.name}"

    @property
    def label(self) -> str:
        if self.level == "user":
            return f"user '{self.name}' of team '{self.team}'"
        return f"{self.level} '{self.name}'"

    @property
    def has_budget(self) -> bool:
        return self.usd_per_day is not None or self.usd_per_month is not None

    @property
    def limited(self) -> bool:
        return self.has_budget or self.requests_per_minute is not None or self.tokens_per_minute is not None

    @classmethod
    def of_key(cls, entry: ApiKeyEntry) -> Quota:
        return cls(
            "key",
            entry.name,
            usd_per_day=entry.usd_per_day,
            usd_per_month=entry.usd_per_month,
            requests_per_minute=entry.requests_per_minute,
            tokens_per_minute=getattr(entry, "tokens_per_minute", None),
        )
