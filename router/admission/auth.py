"""API keys: stored only as SHA-256 digests, found by one dictionary lookup.

Keys are 32 random bytes (`new_key`), so a plain SHA-256 of the key is enough: there is no
dictionary to attack, a salt would protect nothing, and a slow KDF would cost every request tens
of milliseconds for nothing. Unsalted, the digest of the presented key names its record directly,
so a request costs one hash however many keys are stored, and a guessed key costs the same as a
valid one. (Salted digests, `sha256$salt$digest`, were written before and are still accepted:
each has to be tried in turn, so those alone are scanned; replacing such a key with a new one
moves off them, and `tierroute serve` counts them at start.)

That scan is the one costly step (4 microseconds a salted key: 40 ms a guess at 10,000 of them),
and anyone can ask for it with a key never sent before. The routes authenticate on the event loop
(`authenticate_async`), so a scan runs on one thread of its own instead, one at a time: a flood of
guesses queues there and costs one core, while the loop goes on answering everything else. A key
the scan found is remembered apart from the guesses (checked again at each use, for as long as
it is stored), so no number of guesses makes its owner wait behind them again.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from router.admission.quota import Quota
from router.config import ANONYMOUS_KEY, ApiKeyEntry, ServerSettings
from router.control.records import KeyRecord, Snapshot, config_snapshot
from router.errors import AuthError, ConfigError, OverloadedError
from router.generation import Tenant

KEY_PREFIX = "trk-"
# a key is 'trk-' and 43 characters; one an operator hashed by hand is allowed up to this. A
# longer one is refused before any stored hash is compared with it: a guess is compared with
# every salted hash, so a 1 MB header was 1 MB hashed per salted key
MAX_KEY_CHARS = 256
SEEN_MAX = 65_536  # unknown keys remembered per snapshot, and salted keys found; each about 10 MB at most
# keys waiting for the scanning thread: past this a key that needs a scan gets 503 at once. At 4 µs
# a salted hash, 10,000 of them scan about 25 keys a second, so an unbounded queue let a flood of
# guesses hold its connections open and put a salted key's first use behind a minute of guesses
SCAN_QUEUE_MAX = 64


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str, salt: str | None = None) -> str:
    """'sha256$DIGEST', what the database and the config store; with `salt`, the older salted
    form 'sha256$SALT$DIGEST' (still accepted, see the module's docstring)."""
    if salt is None:
        return f"sha256${hashlib.sha256(key.encode()).hexdigest()}"
    digest = hashlib.sha256(f"{salt}:{key}".encode()).hexdigest()
    return f"sha256${salt}${digest}"


def lookup_digest(stored: str) -> str | None:
    """The digest an unsalted stored hash is found by, or None for a salted (or unknown) one."""
    scheme, _, digest = stored.partition("$")
    if scheme != "sha256" or "$" in digest or len(digest) != 64:
        return None
    return digest


def salted_keys(snapshot: Snapshot) -> list[str]:
    """The names of the keys stored with a salted hash, which every unknown key is checked
    against (the older form, see the module's docstring)."""
    return sorted(r.name for r in snapshot.keys.values() if lookup_digest(r.hash) is None)


def _matches(key: str, stored: str) -> bool:
    parts = stored.split("$")
    if parts[0] != "sha256" or len(parts) not in (2, 3):
        return False
    salted = f"{parts[1]}:{key}" if len(parts) == 3 else key
    candidate = hashlib.sha256(salted.encode()).hexdigest()
    return hmac.compare_digest(candidate, parts[-1])


@dataclass(frozen=True)
class _Index:
    """A snapshot's keys arranged for lookup: unsalted ones by digest, salted ones to scan."""

    by_digest: dict[str, KeyRecord]
    salted: tuple[KeyRecord, ...]

    @classmethod
    def of(cls, snapshot: Snapshot) -> _Index:
        by_digest: dict[str, KeyRecord] = {}
        salted: list[KeyRecord] = []
        for record in snapshot.keys.values():
            digest = lookup_digest(record.hash)
            if digest is None:
                salted.append(record)
            else:
                by_digest.setdefault(digest, record)
        return cls(by_digest, tuple(salted))


@dataclass(frozen=True)
class Principal:
    """Who is calling: a key's name (never the key), or 'anonymous' when keys are off.

    `may_send_tests`: whether the caller may send `tierroute.tests`, code that the service runs on
    its host. Only an operator grants that: per key (`keys create --allow-tests`), or for every
    client of a keyless server (`server.allow_client_tests_without_keys`).

    `roles`: 'client' (the /v1 API) and/or 'admin' (the admin API); `team`: the key's team, if
    any; `models`: the models it may ask for (None: all); `key_quotas`: the key's own and its
    team's limits (an end user's are added per request, from its `user` field)."""

    key_id: str
    entry: ApiKeyEntry | None
    may_send_tests: bool = False
    roles: frozenset[str] = frozenset({"client"})
    team: str | None = None
    models: frozenset[str] | None = None
    key_quotas: tuple[Quota, ...] | None = None

    def may_use(self, model: str) -> bool:
        """Whether the caller may ask for `model` ('auto' or a tier name), served or not."""
        return self.models is None or model in self.models

    def visible(self, served: list[str]) -> list[str]:
        """The served models this caller may ask for, in the service's order: all that any route
        shows it (the model list, a card, the names a refusal offers), so a key held to some
        models never learns the others' names, upstream models or prices."""
        return [m for m in served if self.may_use(m)]

    @property
    def tenant(self) -> Tenant:
        """Whose state (cached answers, a local tier's prompt KV) this caller reads and leaves."""
        return Tenant(self.key_id, self.team)

    @property
    def quotas(self) -> tuple[Quota, ...]:
        if self.key_quotas is not None:
            return self.key_quotas
        return (Quota.of_key(self.entry),) if self.entry is not None else ()


ANONYMOUS = Principal(ANONYMOUS_KEY, None)


def is_admin(principal: Principal) -> bool:
    """Whether the caller holds an admin key (the admin API's role). For routes outside /admin/
    that let an admin act for any key, e.g. labelling another key's request."""
    return "admin" in principal.roles


def is_client(principal: Principal) -> bool:
    """Whether the caller may use the /v1 API (completions, models)."""
    return "client" in principal.roles


class Authenticator:
    """Finds the key a request presents among the keys `keys()` returns now (the control plane's
    snapshot, which another replica's change replaces within the poll bound; without a ledger,
    the config's keys)."""

    def __init__(self, server: ServerSettings, keys: Callable[[], Snapshot] | None = None) -> None:
        config = config_snapshot(list(server.api_keys))
        self.keys: Callable[[], Snapshot] = keys if keys is not None else (lambda: config)
        self.allow_unauthenticated = server.allow_unauthenticated
        self.anonymous = Principal(ANONYMOUS_KEY, None, may_send_tests=server.allow_client_tests_without_keys)
        # the snapshot's keys by digest (built once per snapshot), and what the scan over its
        # salted hashes found, by the presented key's SHA-256: `_found` the name and stored hash of
        # the key it matched (checked again at each use, so it outlives a snapshot), `_missed` those that
        # matched none under this snapshot. Each bounded: past SEEN_MAX entries it starts afresh.
        self._index: tuple[Snapshot | None, _Index] = (None, _Index({}, ()))
        self._found: dict[str, tuple[str, str]] = {}
        self._missed: tuple[Snapshot | None, set[str]] = (None, set())
        # one scan at a time, whichever thread asks (module docstring); the routes' scans run on
        # `_scanner`, made at the first one
        self._scan_lock = threading.Lock()
        self._queued = 0  # keys waiting for, or on, the scanning thread (counted on the loop)
        self._scanner: ThreadPoolExecutor | None = None

    @property
    def open(self) -> bool:
        return self.allow_unauthenticated and not self.keys().keys

    async def authenticate_async(self, authorization: str | None) -> Principal:
        """`authenticate`, for a caller on the event loop: a key that would be compared with every
        salted hash is looked up on the scanning thread, so the loop never waits on a scan."""
        if not self._scans(authorization):
            return self.authenticate(authorization)
        if self._queued >= SCAN_QUEUE_MAX:
            raise OverloadedError("Too many API keys are being checked at once; retry shortly.", retry_after=1.0)
        if self._scanner is None:
            self._scanner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tierroute-key-scan")
        self._queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._scanner, self.authenticate, authorization)
        finally:
            self._queued -= 1

    def close(self) -> None:
        """Let the scanning thread go (at the app's stop); a later scan makes another."""
        scanner, self._scanner = self._scanner, None
        if scanner is not None:
            scanner.shutdown(wait=False, cancel_futures=True)

    def _scans(self, authorization: str | None) -> bool:
        """Whether authenticating this header would scan the salted hashes."""
        snapshot = self.keys()
        index = self._index_of(snapshot)
        if not index.salted or (self.allow_unauthenticated and not snapshot.keys):
            return False
        try:
            key = _presented(authorization)
        except AuthError:
            return False
        digest = hashlib.sha256(key.encode()).hexdigest()
        if digest in index.by_digest or self._missed_under(snapshot, digest):
            return False
        found = self._found.get(digest)
        if found is None:
            return True
        # found before: `_lookup` checks it with one hash, unless that key is gone or stored anew
        # since, when it would scan (on the loop, behind the thread's scan: so not here)
        known = snapshot.keys.get(found[0])
        return known is None or known.hash != found[1]

    def _missed_under(self, snapshot: Snapshot, digest: str) -> bool:
        owner, missed = self._missed
        return owner is snapshot and digest in missed

    def authenticate(self, authorization: str | None, now: float | None = None) -> Principal:
        snapshot = self.keys()
        if self.allow_unauthenticated and not snapshot.keys:
            return self.anonymous
        key = _presented(authorization)
        found = self._lookup(snapshot, key)
        if found is None:
            raise AuthError("Incorrect API key provided.", reason="unknown_key")
        at = time.time() if now is None else now
        if found.revoked_at is not None:
            raise AuthError("This API key has been revoked.", reason="revoked", key_id=found.name)
        if found.expires_at is not None and at >= found.expires_at:
            raise AuthError("This API key has expired.", reason="expired", key_id=found.name)
        team = snapshot.teams.get(found.team) if found.team is not None else None
        quotas = [found.limits.quota("key", found.name)]
        if team is not None:
            quotas.append(team.limits.quota("team", team.name))
        return Principal(
            found.name,
            None,
            may_send_tests=found.allow_tests,
            roles=frozenset(found.roles),
            team=found.team,
            models=None if found.models is None else frozenset(found.models),
            key_quotas=tuple(quotas),
        )

    def _index_of(self, snapshot: Snapshot) -> _Index:
        indexed, index = self._index
        if indexed is not snapshot:
            index = _Index.of(snapshot)
            self._index = (snapshot, index)
            self._missed = (snapshot, set())  # a salted key may have come since
        return index

    def _lookup(self, snapshot: Snapshot, key: str) -> KeyRecord | None:
        """The stored key `key` is, or None. An unsalted stored key is found by the presented
        key's digest in one lookup. Salted ones (written before) are each hashed with their own
        salt: a key the scan found before costs one hash (its record's, checked again); a key
        that matched none under this snapshot costs nothing; any other is compared with every
        salted hash, one scan at a time (module docstring), so the time taken does not reveal
        which one matched. With no salted keys stored, a guess costs one hash like a valid key."""
        index = self._index_of(snapshot)
        digest = hashlib.sha256(key.encode()).hexdigest()
        record = index.by_digest.get(digest)
        if record is not None:
            return record
        if not index.salted:
            return None
        seen = self._found.get(digest)
        if seen is not None:
            known = snapshot.keys.get(seen[0])
            if known is not None and _matches(key, known.hash):
                return known
            self._found.pop(digest, None)  # that key is gone, or now stored another way
        if self._missed_under(snapshot, digest):
            return None
        with self._scan_lock:
            found: KeyRecord | None = None
            for candidate in index.salted:  # check every entry: timing does not reveal which one matched
                if _matches(key, candidate.hash) and found is None:
                    found = candidate
        if found is not None:
            if len(self._found) >= SEEN_MAX:
                self._found.clear()
            self._found[digest] = (found.name, found.hash)
        else:
            # a miss is remembered for the snapshot scanned only: if the loop moved to a newer one
            # meanwhile (a salted key imported, say), it has a set of its own
            owner, missed = self._missed
            if owner is snapshot:
                if len(missed) >= SEEN_MAX:
                    missed.clear()
                missed.add(digest)
        return found


def credentials(authorization: str | None, api_key: str | None) -> str | None:
    """The Authorization header a request presents, with Anthropic's `x-api-key: KEY` (what its
    clients send) read as `Bearer KEY`. A request that presents two different keys is refused
    rather than answered under either (401); the same key twice is one key, whatever the case of
    its scheme (`bearer KEY`: RFC 7235's schemes are case-insensitive, as `_presented` reads them)."""
    if api_key is None:
        return authorization
    bearer = f"Bearer {api_key.strip()}"
    if authorization is not None:
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or key.strip() != api_key.strip():
            raise AuthError("Two different API keys presented (Authorization and x-api-key); send one.")
    return bearer


def _presented(authorization: str | None) -> str:
    """The key an Authorization header presents (AuthError for none, a malformed header or a key
    longer than any stored one could be)."""
    if not authorization:
        raise AuthError("You didn't provide an API key. Send it as 'Authorization: Bearer KEY' (or 'x-api-key: KEY').")
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise AuthError("Malformed Authorization header; expected 'Bearer KEY'.")
    key = key.strip()
    if len(key) > MAX_KEY_CHARS:
        raise AuthError("Incorrect API key provided.", reason="unknown_key")
    return key


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def _keyless_loopback(server: ServerSettings) -> bool:
    return server.allow_unauthenticated and not server.api_keys and is_loopback(server.host)


def allowed_hosts(server: ServerSettings) -> frozenset[str] | None:
    """The Host header names the server answers (any port), or None for any.

    A keyless server on loopback trusts whoever can reach the port, and a web page can reach it
    through the browser: it points a name it controls at 127.0.0.1 (DNS rebinding) and sends
    requests that the browser labels with that name. Answering only loopback names stops it. With
    keys the page has no key, and a reverse proxy in front usually forwards its public name, so
    the default there is any host."""
    if server.allowed_hosts is not None:
        return None if "*" in server.allowed_hosts else frozenset(server.allowed_hosts)
    return frozenset(LOOPBACK_NAMES) if _keyless_loopback(server) else None


def docs_enabled(server: ServerSettings) -> bool:
    """Whether /docs, /redoc and /openapi.json exist. By default only where every other route is
    already open to the caller anyway: keyless serving on loopback."""
    return server.docs if server.docs is not None else _keyless_loopback(server)


def check_bind(server: ServerSettings, *, stored_keys: bool = False) -> None:
    """Refuse to serve without keys unless that is explicit, and never on a public address unless
    told twice. `stored_keys`: the ledger's database holds keys (made with the admin API or CLI)."""
    if server.api_keys or stored_keys:
        return
    if not server.allow_unauthenticated:
        raise ConfigError(
            "server.api_keys is empty: create a key with `tierroute keys create NAME`, or set "
            "server.allow_unauthenticated = true to serve without keys"
        )
    if not is_loopback(server.host) and not server.allow_public_without_keys:
        raise ConfigError(
            f"server.host = {server.host!r} is not a loopback address and no API keys are configured; "
            "add keys, or set server.allow_public_without_keys = true"
        )
