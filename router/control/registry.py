"""The keys, teams and user limits one replica serves with, kept current by polling one row.

Every change to the control tables bumps `control_version` in its own transaction
(`router.control.store.record`). Each replica reads that one row every `server.keys_poll_s`
(default 1 s) and, when it moved, reloads the whole snapshot (keys, teams, user limits) in one
read: so a key created, changed or revoked on any replica is seen by every other within
`keys_poll_s` plus one reload (tens of milliseconds for thousands of keys), and the replica that
made the change reloads before its admin call returns. A poll costs one primary-key read;
LISTEN/NOTIFY would be faster but ties the design to PostgreSQL, and SQLite has nothing like it.

If the database cannot be read, the replica keeps serving with the snapshot it has (a warning
each time), so an outage of the control tables does not stop traffic; what it cannot do then
is see changes made elsewhere.

Without a ledger database (`ledger.enabled = false`) the config's keys are the whole snapshot
and the admin API is off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from router.admission.auth import salted_keys
from router.admission.quota import Quota
from router.config import Settings, reserved_name
from router.control.admin import ControlPlane
from router.control.records import KeyRecord, Snapshot, config_snapshot
from router.control.store import ControlStore

log = logging.getLogger(__name__)


class KeyRegistry:
    """This replica's view of the control plane: `snapshot` is what it authenticates with now."""

    def __init__(self, settings: Settings, *, models: Iterable[str] | None = None) -> None:
        self.poll_s = settings.server.keys_poll_s
        self.config_keys = list(settings.server.api_keys)
        self.snapshot: Snapshot = config_snapshot(self.config_keys)
        self.store = ControlStore(settings.ledger.location, settings.ledger) if settings.ledger.enabled else None
        self.plane = ControlPlane(self.store, models=models, on_change=self.refresh) if self.store is not None else None
        self._task: asyncio.Task[None] | None = None

    def open(self) -> None:
        """Blocking: open the tables, import the config's keys the database lacks, read them all."""
        if self.store is None or self.plane is None:
            self._warn_salted()
            return
        self.store.open()
        imported = self.plane.import_config(self.config_keys)
        if imported:
            log.info("keys: imported %d config key(s) into the ledger's database: %s", len(imported), imported)
        self.refresh()
        self._warn_config_drift()
        self._warn_salted()
        self._warn_reserved()

    def _warn_reserved(self) -> None:
        """A key or team stored before its name was reserved (`router.config.RESERVED_NAMES`) is
        still served, but passes for the service's own: say so at every start."""
        fix = {"key": "revoke it and make its holder a key of another name", "team": "move its keys to another team"}
        for kind, names in (("key", self.snapshot.keys), ("team", self.snapshot.teams)):
            for name in sorted(names):
                problem = reserved_name(name)
                revoked = kind == "key" and self.snapshot.keys[name].revoked_at is not None
                if problem is not None and not revoked:
                    log.warning("keys: the %s '%s' was stored before: %s; %s", kind, name, problem, fix[kind])

    def _warn_salted(self) -> None:
        """Keys made before digests were unsalted are still served, but every request with a key
        not seen before is checked against each of them in turn (router.admission.auth): name
        them, so an operator with many replaces them."""
        salted = salted_keys(self.snapshot)
        if salted:
            shown = ", ".join(salted[:10]) + (f" and {len(salted) - 10} more" if len(salted) > 10 else "")
            log.warning(
                "keys: %d key(s) are stored with an older salted hash, which every unknown key is checked "
                "against (one SHA-256 each per request); replace them with new keys to serve in one lookup: %s",
                len(salted),
                shown,
            )

    def _warn_config_drift(self) -> None:
        """A config key edited after its import changes nothing (docs/keys.md). An operator who
        rotates a leaked key by editing config.toml, as before, would keep the old one valid
        unawares: say so at every start, naming the key and never its secret or hash."""
        for entry in self.config_keys:
            stored = self.snapshot.keys.get(entry.name)
            if stored is None:
                continue
            config = KeyRecord.from_entry(entry)
            differs = [
                what
                for what, same in (
                    ("its secret", stored.hash == config.hash),
                    ("its limits", stored.limits == config.limits),
                    ("its roles", stored.roles == config.roles),
                    ("its tests permission", stored.allow_tests == config.allow_tests),
                )
                if not same
            ]
            if differs:
                log.warning(
                    "keys: config key '%s' differs from the database's in %s; the database's is served "
                    "(config keys are imported once: change it with `tierroute keys update`/`revoke` or "
                    "the admin API)",
                    entry.name,
                    ", ".join(differs),
                )

    def refresh(self) -> None:
        """Reload the snapshot now (blocking); an older one never replaces a newer one."""
        if self.store is None:
            return
        found = self.store.snapshot()
        if found.version >= self.snapshot.version:
            self.snapshot = found

    async def start(self) -> None:
        await asyncio.to_thread(self.open)
        if self.store is not None:
            self._task = asyncio.create_task(self._poll(), name="tierroute-keys-poll")

    async def _poll(self) -> None:
        assert self.store is not None
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                if await asyncio.to_thread(self.store.version) != self.snapshot.version:
                    await asyncio.to_thread(self.refresh)
            except Exception as exc:  # noqa: BLE001 - keep serving with the keys we have
                log.warning("keys: cannot read the control tables (serving with the last snapshot): %s", exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.store is not None:
            await asyncio.to_thread(self.store.close)

    def user_quota(self, team: str, user: str) -> Quota | None:
        return self.snapshot.user_quota(team, user)
