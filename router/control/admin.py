"""The control plane's operations: what the admin API and `tierroute keys ...` both call.

Each operation checks its input (`router.control.records`), changes the rows, and writes its
audit row and the version bump in the same transaction (`router.control.store.record`), then
tells this replica at once (`on_change`: the registry reloads before the call returns, so a key
revoked here is refused here by the next request). Other replicas see the new version at their
next poll (`router.control.registry`).

The audit row says who (`actor`: an admin key's name, `cli:USER`, or `config`), what (`action`),
to what (`target`) and the fields set (`detail`): never a key, and never its hash.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from router.admission.auth import hash_key, new_key
from router.admission.limits import day_start, month_start
from router.config import ApiKeyEntry
from router.control.records import (
    Conflict,
    ControlError,
    KeyRecord,
    Limits,
    NotFound,
    TeamRecord,
    UserLimit,
    check_name,
    check_roles,
    check_user,
)
from router.control.store import ControlStore, insert_key, record

LIMIT_FIELDS = ("usd_per_day", "usd_per_month", "requests_per_minute", "tokens_per_minute")
KEY_FIELDS = (*LIMIT_FIELDS, "team", "roles", "models", "allow_tests", "expires_at")


# the furthest expiry a key may be given (the CLI's --expires-in-days is held to it too)
MAX_EXPIRY_DAYS = 3_652_500


class ControlPlane:
    """Keys, teams and user limits, changed with an audit row each."""

    def __init__(
        self,
        store: ControlStore,
        *,
        models: Iterable[str] | None = None,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.models = None if models is None else frozenset(models)  # what a key may be restricted to
        self.on_change = on_change
        self.clock = clock

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # -- keys ------------------------------------------------------------------------------------

    def create_key(
        self,
        actor: str,
        name: str,
        *,
        roles: Iterable[str] = ("client",),
        team: str | None = None,
        limits: Limits | None = None,
        models: Iterable[str] | None = None,
        allow_tests: bool = False,
        expires_at: float | None = None,
    ) -> tuple[str, KeyRecord]:
        """A new key: (the key, shown once and never stored; its record)."""
        check_name("key", name)
        key = new_key()
        found = KeyRecord(
            name=name,
            hash=hash_key(key),
            roles=check_roles(list(roles)),
            team=None if team is None else check_name("team", team),
            limits=limits if limits is not None else Limits(),
            models=self._models(models),
            allow_tests=allow_tests,
            expires_at=self._expiry(expires_at),
            created_at=self.clock(),
            created_by=actor,
        )
        with self.store.transaction() as sql:
            if team is not None:
                self._team_exists(sql, team)
            if not insert_key(sql, found):
                raise Conflict(f"the ledger's database already has a key named '{name}' (a revoked key keeps its name)")
            detail = {k: v for k, v in found.public().items() if k not in ("name", "created_at", "created_by")}
            record(sql, actor, "key.create", name, detail)
        self._changed()
        return key, found

    def update_key(self, actor: str, name: str, changes: Mapping[str, Any]) -> KeyRecord:
        """Set the given fields (a limit of None: no limit; team None: no team; models None: all)."""
        unknown = set(changes) - set(KEY_FIELDS)
        if unknown:
            raise ControlError(f"cannot change {sorted(unknown)} of a key; changeable: {list(KEY_FIELDS)}")
        values: dict[str, Any] = dict(changes)
        Limits(**{k: values[k] for k in LIMIT_FIELDS if k in values})  # checked
        if "roles" in values:
            values["roles"] = ",".join(check_roles(list(values["roles"] or ())))
        if "models" in values:
            checked = self._models(values["models"])
            values["models"] = None if checked is None else json.dumps(list(checked))
        if "team" in values and values["team"] is not None:
            check_name("team", values["team"])
        if "allow_tests" in values:
            values["allow_tests"] = int(bool(values["allow_tests"]))
        if "expires_at" in values:
            values["expires_at"] = self._expiry(values["expires_at"])
        with self.store.transaction() as sql:
            if sql.run("SELECT name FROM api_keys WHERE name = ?", (name,)).one() is None:
                raise NotFound(f"no key named '{name}'")
            if values.get("team") is not None:
                self._team_exists(sql, values["team"])
            if values:
                sets = ", ".join(f"{k} = ?" for k in values)
                sql.run(f"UPDATE api_keys SET {sets} WHERE name = ?", (*values.values(), name))
            record(sql, actor, "key.update", name, dict(changes))
        self._changed()
        return self.key(name)

    def revoke_key(self, actor: str, name: str) -> KeyRecord:
        with self.store.transaction() as sql:
            sql.run("UPDATE api_keys SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL", (self.clock(), name))
            if sql.count == 0:
                exists = sql.run("SELECT revoked_at FROM api_keys WHERE name = ?", (name,)).one()
                if exists is None:
                    raise NotFound(f"no key named '{name}'")
            else:
                record(sql, actor, "key.revoke", name, {})
        self._changed()
        return self.key(name)

    def key(self, name: str) -> KeyRecord:
        found = self.store.snapshot().keys.get(name)
        if found is None:
            raise NotFound(f"no key named '{name}'")
        return found

    def import_config(self, entries: Iterable[ApiKeyEntry]) -> list[str]:
        """The config's `[[server.api_keys]]` that the database lacks, imported once each: from
        then on the database holds them (a key of that name, even revoked, is never replaced)."""
        imported = []
        now = self.clock()
        with self.store.transaction() as sql:
            for e in entries:
                found = KeyRecord.from_entry(e, created_at=now)
                if insert_key(sql, found):
                    detail = {k: v for k, v in found.public().items() if k not in ("name", "created_at", "created_by")}
                    record(sql, "config", "key.import", e.name, detail)
                    imported.append(e.name)
        if imported:
            self._changed()
        return imported

    # -- teams and users -------------------------------------------------------------------------

    def create_team(self, actor: str, name: str, limits: Limits | None = None) -> TeamRecord:
        check_name("team", name)
        limits = limits if limits is not None else Limits()
        with self.store.transaction() as sql:
            sql.run(
                f"INSERT INTO teams (name, {', '.join(LIMIT_FIELDS)}, created_at) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (name) DO NOTHING",
                (name, *limits.as_dict().values(), self.clock()),
            )
            if sql.count == 0:
                raise Conflict(f"a team named '{name}' exists")
            record(sql, actor, "team.create", name, limits.as_dict())
        self._changed()
        return self.team(name)

    def update_team(self, actor: str, name: str, changes: Mapping[str, Any]) -> TeamRecord:
        unknown = set(changes) - set(LIMIT_FIELDS)
        if unknown:
            raise ControlError(f"cannot change {sorted(unknown)} of a team; changeable: {list(LIMIT_FIELDS)}")
        Limits(**dict(changes))  # checked
        with self.store.transaction() as sql:
            self._team_exists(sql, name)
            if changes:
                sets = ", ".join(f"{k} = ?" for k in changes)
                sql.run(f"UPDATE teams SET {sets} WHERE name = ?", (*changes.values(), name))
            record(sql, actor, "team.update", name, dict(changes))
        self._changed()
        return self.team(name)

    def teams(self) -> list[TeamRecord]:
        """Every team, by name (`GET /admin/teams`, `tierroute keys team list`)."""
        return sorted(self.store.snapshot().teams.values(), key=lambda t: t.name)

    def team(self, name: str) -> TeamRecord:
        found = self.store.snapshot().teams.get(name)
        if found is None:
            raise NotFound(f"no team named '{name}'")
        return found

    def set_user_limits(self, actor: str, team: str, user: str, limits: Limits) -> UserLimit:
        check_user(user)
        values = tuple(limits.as_dict().values())
        with self.store.transaction() as sql:
            self._team_exists(sql, team)
            sql.run(
                f"INSERT INTO user_limits (team, end_user, {', '.join(LIMIT_FIELDS)}) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (team, end_user) DO UPDATE SET " + ", ".join(f"{k} = excluded.{k}" for k in LIMIT_FIELDS),
                (team, user, *values),
            )
            record(sql, actor, "user.set", f"{team}/{user}", limits.as_dict())
        self._changed()
        return UserLimit(team, user, limits)

    def delete_user_limits(self, actor: str, team: str, user: str) -> UserLimit:
        """Remove a user's limits (the team's default then applies); return what was removed, so
        the operator (and the audit row) can see what no longer holds."""
        with self.store.transaction() as sql:
            where = "FROM user_limits WHERE team = ? AND end_user = ?"
            row = sql.run(f"SELECT {', '.join(LIMIT_FIELDS)} {where}", (team, user)).one()
            if row is None:
                raise NotFound(f"team '{team}' has no limits for user '{user}'")
            removed = UserLimit(team, user, Limits(*row))
            sql.run(f"DELETE {where}", (team, user))
            record(sql, actor, "user.delete", f"{team}/{user}", removed.limits.as_dict())
        self._changed()
        return removed

    # -- spend -----------------------------------------------------------------------------------

    def spend(self, *, key: str | None = None, team: str | None = None, user: str | None = None) -> dict[str, Any]:
        """Spend so far (UTC day and month) of a key, a team, or a user within a team."""
        now = self.clock()
        params: tuple[str, ...]
        if key is not None:
            self.key(key)
            where, params, target = "key_id = ?", (key,), {"key": key}
        elif team is not None and user is None:
            self.team(team)
            where, params, target = "team = ?", (team,), {"team": team}
        elif team is not None and user is not None:
            self.team(team)
            where, params, target = 'team = ? AND "user" = ?', (team, user), {"team": team, "user": user}
        else:
            raise ControlError("spend of a key, a team, or a team's user")
        return {**target, **self.store.spend(where, params, day_start(now), month_start(now))}

    # -- helpers ---------------------------------------------------------------------------------

    def _models(self, models: Iterable[str] | None) -> tuple[str, ...] | None:
        if models is None:
            return None
        found = tuple(dict.fromkeys(models))
        if not found:
            raise ControlError("models: an empty list would allow nothing; leave it unset to allow every model")
        if self.models is not None:
            unknown = [m for m in found if m not in self.models]
            if unknown:
                raise ControlError(f"models: {unknown} are not served here; known: {sorted(self.models)}")
        return found

    def _expiry(self, expires_at: float | None) -> float | None:
        # NaN compares false with everything (SQLite stores it as NULL: never expires), and an
        # infinite one is 'never' in words no JSON answer can carry: both are refused
        if expires_at is not None and (isinstance(expires_at, bool) or not math.isfinite(expires_at)):
            raise ControlError(f"expires_at must be a finite unix time (got {expires_at!r}); leave it unset for never")
        if expires_at is not None and expires_at <= self.clock():
            raise ControlError("expires_at is in the past")
        if expires_at is not None and expires_at - self.clock() > MAX_EXPIRY_DAYS * 86400:
            raise ControlError(f"expires_at is too far ahead (at most {MAX_EXPIRY_DAYS} days, ten thousand years)")
        return expires_at

    @staticmethod
    def _team_exists(sql: Any, team: str) -> None:
        if sql.run("SELECT name FROM teams WHERE name = ?", (team,)).one() is None:
            raise NotFound(f"no team named '{team}'")
