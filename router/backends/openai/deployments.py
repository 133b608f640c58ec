"""The deployments of an `openai` tier: each with its own client, breaker and health, and the pool a
request picks one from.

A tier lists one deployment (its `base_url`) or several (`[[tiers.openai.deployments]]`): replicas,
regions or providers serving the same model in the operator's judgement. Each `Deployment` keeps
what is true of that one server and of no other:

- its SDK client (its own base URL and key), and the optional parameters it refuses (learned from
  requests of the tier's own only, `router.backends.openai.refusals`);
- whether a 5xx it gives is its failure or the request's, also asked of a request of the tier's own
  (`router.backends.openai.outages`);
- its `CircuitBreaker` (`router.backends.openai.breaker`): an open breaker takes no traffic until its
  cool-down ends, when one request probes it (half-open);
- a `Retry-After` mark: a 429 or 503 that says how long to wait marks this deployment until then,
  and no other (the tier's other deployments go on answering);
- passive health from results (the breaker hears every attempt) and, with `probe_interval_s`, an
  active probe of `GET /models`: a deployment whose probe fails takes no new requests until it
  passes again `probe_successes` times in a row (hysteresis: one that flaps between probes is
  never re-admitted at each pass, and an open breaker closes only after `breaker_successes` good
  probes in a row);
- its requests in flight from this replica (`outstanding`), against its `max_concurrent`.

A deployment whose key's environment variable (`api_key_env`) is not set when the tier starts
is down until the router restarts with it set: it takes no requests, the log says so at ERROR
naming it and the variable, and /metrics shows it (`tierroute_deployment_key_missing` 1), while
the tier serves from its other deployments. A tier none of whose deployments has its key refuses
to start, naming each deployment and variable: it could answer nothing.

What a client is told of a deployment's failure (its breaker's and `Failures`' messages) names the
tier, and the deployment only by a name the operator gave it: never its address, which an
unnamed deployment's default name is. The address goes to the log with the upstream's own words.

`Pool.pick` offers a request the deployments that may take it now and lets the tier's strategy
(`router.backends.openai.balancing`) choose. Breakers and `max_concurrent` are hard limits; a
`Retry-After` mark and a failed probe only steer: when every deployment a request may still try is
marked or failing its probe, it goes to one anyway rather than failing unasked (with one
deployment, this is exactly how a tier with a single `base_url` always behaved).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import openai

from router.backends.openai.balancing import STRATEGIES
from router.backends.openai.breaker import CircuitBreaker
from router.backends.openai.client import missing_key, new_client
from router.backends.openai.failures import Failures
from router.backends.openai.outages import Outages
from router.backends.openai.refusals import Refusals
from router.errors import CircuitOpenError, ConfigError, OverloadedError

if TYPE_CHECKING:
    from router.config import DeploymentSettings, OpenAIBackendSettings

log = logging.getLogger(__name__)

_FULL_RETRY_AFTER_S = 1.0  # every deployment at its max_concurrent: a slot frees soon


class Deployment:
    """One server of a tier (see the module docstring)."""

    def __init__(
        self,
        tier: str,
        config: OpenAIBackendSettings,
        settings: DeploymentSettings,
        *,
        label: str,
        shown: str | None = None,
        timeout_s: float,
        retry_after_s: float,
        breaker: CircuitBreaker | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = settings.label
        # what a client's `tierroute` object calls it: the operator's name, or its place in the
        # list ('#2'); never its address, which is the default name the ledger and /metrics keep
        self.shown = shown
        # for the log only: its name and where it is (host:port, never the URL's user or password)
        parts = urlsplit(settings.base_url)
        address = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
        self.logged = self.name if self.name == address else f"{self.name} ({address})"
        self.tier = tier
        self.settings = settings
        self.config = config
        self.model = settings.model or config.model
        self.timeout_s = timeout_s
        self._clock = clock
        self.breaker = breaker or CircuitBreaker(
            label,
            failures=config.breaker_failures,
            cooldown_s=config.breaker_cooldown_s,
            successes=config.resolved_breaker_successes,
            clock=clock,
        )
        self.failures = Failures(label, timeout_s=timeout_s, breaker=self.breaker, retry_after_s=retry_after_s)
        self.refused: set[str] = set() if config.logprobs else {"logprobs"}
        # what it is learned to refuse, only from requests of the tier's own (`refusals`)
        self.refusals = Refusals(tier, self.logged, self.refused, clock=clock)
        # whether a 5xx it gives is its own or the request's, asked of a request of the tier's own
        self.outages = Outages(tier, self.logged, clock=clock)
        self.outstanding = 0
        self.marked_until = 0.0
        self.probe_ok = True
        self._probes_passed = 0  # passing probes in a row: `probe_successes` of them after a failure
        self.client: openai.AsyncOpenAI | None = None
        self.attempts_total = 0
        self.failed_attempts_total = 0
        self.answered_total = 0
        self.key_missing: str | None = None  # its api_key_env, unset when the tier started: down

    @property
    def weight(self) -> float:
        return self.settings.weight

    @property
    def full(self) -> bool:
        limit = self.settings.max_concurrent
        return limit is not None and self.outstanding >= limit

    @property
    def marked(self) -> bool:
        return self._clock() < self.marked_until

    @property
    def admits(self) -> bool:
        """Its breaker would let a call through now (closed, or half-open with no probe out)."""
        return self.breaker.retry_after() <= 0

    @property
    def available(self) -> bool:
        return self.admits and not self.full and not self.marked and self.probe_ok

    def answered(self) -> None:
        """An attempt here was answered."""
        self.answered_total += 1
        self.outages.answered()

    def mark(self, seconds: float) -> None:
        """A `Retry-After` from this deployment: steer requests elsewhere for that long."""
        self.marked_until = max(self.marked_until, self._clock() + seconds)

    def ensure_client(self) -> openai.AsyncOpenAI:
        if self.client is None:
            self.client = new_client(self.config, self.settings, tier=self.tier, timeout_s=self.timeout_s)
        return self.client

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.close()

    def stats(self) -> dict[str, float]:
        return {
            **self.breaker.stats(),
            "outstanding": float(self.outstanding),
            "marked": 1.0 if self.marked else 0.0,
            "probe_ok": 1.0 if self.probe_ok else 0.0,
            "attempts_total": float(self.attempts_total),
            "failed_attempts_total": float(self.failed_attempts_total),
            "answered_total": float(self.answered_total),
            "key_missing": 1.0 if self.key_missing else 0.0,
            "refusal_probes_total": float(self.refusals.probes_total),
            "outage_probes_total": float(self.outages.probes_total),
        }

    async def probe(self) -> None:
        """One active health check: `GET /models` answered within the tier's timeout (at most 10 s)."""
        try:
            async with asyncio.timeout(min(self.timeout_s, 10.0)):
                await self.ensure_client().models.list()
            ok = True
        except Exception as exc:  # any failure to answer is a failed probe
            ok = False
            if self.probe_ok:
                log.warning("tier %s: deployment %s fails its probe: %s", self.tier, self.logged, type(exc).__name__)
        if not ok:
            self._probes_passed = 0
            self.probe_ok = False
            return
        self._probes_passed += 1
        # hysteresis: a deployment that flaps between probes is not sent traffic at each pass
        if not self.probe_ok and self._probes_passed >= self.config.probe_successes:
            log.info("tier %s: deployment %s passes its probe again", self.tier, self.logged)
            self.probe_ok = True


class Pool:
    """A tier's deployments and its strategy; the active probe, when configured, runs as one task
    per deployment."""

    def __init__(
        self,
        tier: str,
        config: OpenAIBackendSettings,
        *,
        timeout_s: float,
        retry_after_s: float,
        breaker: CircuitBreaker | None = None,
        rng: random.Random | None = None,
    ) -> None:
        found = config.resolved_deployments()
        single = len(found) == 1
        self.tier = tier
        self.deployments = [
            Deployment(
                tier,
                config,
                settings,
                # what clients hear it called: one deployment speaks as the tier always did; of
                # several, one the operator named says its name, and never its address (an unnamed
                # deployment's default name is its host:port, which stays in the log and /metrics)
                label=f"{tier}/{settings.name}" if settings.name and not single else tier,
                shown=settings.name or (None if single else f"#{i + 1}"),
                timeout_s=timeout_s,
                retry_after_s=retry_after_s,
                breaker=breaker if i == 0 else None,
            )
            for i, settings in enumerate(found)
        ]
        self.down: list[Deployment] = []  # without their key: never offered a request
        self.strategy = STRATEGIES[config.strategy]
        self.probe_interval_s = config.probe_interval_s
        self._rng = rng or random.Random()
        self._probers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._set_aside_keyless()
        for d in self.deployments:
            d.ensure_client()
        if self.probe_interval_s is not None and not self._probers:
            # one loop per deployment: a probe that hangs must not hold the others' probes
            interval_s = self.probe_interval_s
            self._probers = [asyncio.create_task(_probe_forever(d, interval_s)) for d in self.deployments]

    def _set_aside_keyless(self) -> None:
        """Deployments whose key's variable is not set are down (module docstring); a tier with
        none left is a ConfigError naming every deployment and variable."""
        for d in self.deployments:
            d.key_missing = missing_key(d.settings)
        keyless = [d for d in self.deployments if d.key_missing]
        if not keyless:
            return
        if len(keyless) == len(self.deployments):
            if len(keyless) == 1:
                raise ConfigError(
                    f"tier {self.tier}: tiers.openai.api_key_env names {keyless[0].key_missing}, which is not set"
                )
            said = "; ".join(f"deployment {d.logged}: api_key_env {d.key_missing} is not set" for d in keyless)
            raise ConfigError(f"tier {self.tier}: no deployment has its key ({said})")
        for d in keyless:
            log.error(
                "tier %s: deployment %s is DOWN: its api_key_env names %s, which is not set; it takes no "
                "requests until the router restarts with it set (the tier serves from its other %d)",
                self.tier,
                d.logged,
                d.key_missing,
                len(self.deployments) - len(keyless),
            )
        self.down += keyless
        self.deployments = [d for d in self.deployments if not d.key_missing]

    async def close(self) -> None:
        probers, self._probers = self._probers, []
        for prober in probers:
            prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await prober
        for d in self.deployments:
            await d.close()

    def pick(self, candidates: Sequence[Deployment]) -> Deployment:
        return candidates[self.strategy.pick(candidates, self._rng)]

    def fresh(self, left: Sequence[Deployment], failed: set[str]) -> Deployment | None:
        """A deployment the request may go to at once: available, and not one it failed on."""
        ready = [d for d in left if d.available and d.name not in failed]
        return self.pick(ready) if ready else None

    def after_pause(self, left: Sequence[Deployment]) -> Deployment:
        """After a pause, where a retry goes: an available deployment (the one that failed
        included), else one that is only marked or failing its probe (they steer, they do not
        refuse); when every one is held by its breaker or is full, the typed error that says so."""
        ready = [d for d in left if d.available]
        if ready:
            return self.pick(ready)
        soft = [d for d in left if d.admits and not d.full]
        if soft:
            return min(soft, key=lambda d: d.marked_until)
        full = [d for d in left if d.full and d.admits]
        if full:
            raise OverloadedError(
                f"tier {self.tier}: every deployment is at its max_concurrent", retry_after=_FULL_RETRY_AFTER_S
            )
        soonest = min(left, key=lambda d: d.breaker.retry_after())
        soonest.breaker.acquire()  # raises CircuitOpenError: held open, or a probe is out
        raise CircuitOpenError(f"tier {self.tier}: no deployment admits a request", retry_after=1.0)  # pragma: no cover

    def stats(self) -> dict[str, dict[str, float]]:
        return {d.name: d.stats() for d in [*self.deployments, *self.down]}


async def _probe_forever(deployment: Deployment, interval_s: float) -> None:
    while True:
        await deployment.probe()
        await asyncio.sleep(interval_s)
