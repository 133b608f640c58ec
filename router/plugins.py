"""One registry mechanism for everything that plugs in: verifiers, backends, eval suites and
request stages.

Each kind has an entry-point group (``tierroute.verifiers``, ``tierroute.backends``,
``tierroute.suites``, ``tierroute.stages``). Each entry point names a callable ``register_X(register)``;
``register(name, factory)`` adds a factory. The built-ins are registered through the same
entry points in pyproject.toml, exactly as a third-party package registers its own, so only the
composition roots (`router.engine`, the CLIs) ever learn a concrete class, and only by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from router.errors import ConfigError
from router.verification import SharedVerifier, Verifier, VerifierContext, VerifierError, VerifierFactory

if TYPE_CHECKING:
    from router.backends.base import Backend
    from router.config import Settings, TierSettings

F = TypeVar("F")

VERIFIERS = "tierroute.verifiers"
BACKENDS = "tierroute.backends"
SUITES = "tierroute.suites"
STAGES = "tierroute.stages"


class PluginError(ConfigError):
    """A plugin name is unknown or registered twice."""


class Registry(Generic[F]):
    """Factories of one kind by name."""

    kind = "plugin"

    def __init__(self) -> None:
        self._factories: dict[str, F] = {}

    def register(self, name: str, factory: F) -> None:
        if name in self._factories:
            raise self._error(f"{self.kind} '{name}' registered twice")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def get(self, name: str) -> F:
        try:
            return self._factories[name]
        except KeyError:
            raise self._error(f"unknown {self.kind} '{name}'; known: {', '.join(self.names())}") from None

    def _error(self, message: str) -> Exception:
        return PluginError(message)

    def load(self, group: str) -> None:
        """Add every factory the installed entry points of `group` register."""
        for ep in entry_points(group=group):
            ep.load()(self.register)


class RegisterVerifier(Protocol):
    """The `register` callable a verifier plugin's entry point receives."""

    def __call__(self, name: str, factory: VerifierFactory, check: Callable[[], str | None] | None = None) -> None: ...


class VerifierRegistry(Registry[VerifierFactory]):
    """Verifier factories by name. A verifier that needs something of the machine (the code
    sandbox) registers a `check` with it: a callable that returns None when it can run here, or
    the reason it cannot, which `config check` and start-up report."""

    kind = "verifier"

    def __init__(self) -> None:
        super().__init__()
        self._checks: dict[str, Callable[[], str | None]] = {}

    def register(self, name: str, factory: VerifierFactory, check: Callable[[], str | None] | None = None) -> None:
        super().register(name, factory)
        if check is not None:
            self._checks[name] = check

    def unavailable(self, name: str) -> str | None:
        """Why the verifier `name` cannot run on this machine, or None when it can."""
        check = self._checks.get(name)
        return None if check is None else check()

    def _error(self, message: str) -> Exception:
        return VerifierError(message)

    def create(self, name: str, params: dict[str, Any], ctx: VerifierContext) -> Verifier:
        factory = self.get(name)
        try:
            return factory(dict(params), ctx)
        except (TypeError, ValueError) as exc:
            raise VerifierError(f"verifier '{name}': bad params {params!r}: {exc}") from None

    @classmethod
    def from_entry_points(cls) -> VerifierRegistry:
        reg = cls()
        reg.load(VERIFIERS)
        return reg


class SharedRegistry(VerifierRegistry):
    """A verifier registry for one tier: the same name and params give the same SharedVerifier,
    so a feature verifier a tier also runs itself is scored once per answer."""

    def __init__(self, registry: VerifierRegistry) -> None:
        super().__init__()
        self._factories = registry._factories
        self._checks = registry._checks
        self._made: dict[str, SharedVerifier] = {}

    def create(self, name: str, params: dict[str, Any], ctx: VerifierContext) -> Verifier:
        key = json.dumps([name, params], sort_keys=True, default=str)
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = SharedVerifier(super().create(name, params, ctx))
        made.users += 1
        return made


BackendFactory = Callable[["TierSettings", "Settings"], "Backend"]


class BackendRegistry(Registry[BackendFactory]):
    kind = "backend"

    @classmethod
    def from_entry_points(cls) -> BackendRegistry:
        reg = cls()
        reg.load(BACKENDS)
        return reg

    def create(self, tier: TierSettings, settings: Settings) -> Backend:
        return self.get(tier.backend)(tier, settings)
