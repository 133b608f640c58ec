"""Prometheus metrics, one registry per app (never the process-global one, so apps built side by
side in tests or in one process do not share counters).

Served requests are observed from their ledger entry, so /metrics and the ledger count the same
numbers. Queue depth and sequences in flight (and, for a tier with deployments, each deployment's
breaker, requests in flight, Retry-After mark and probe) are read from the backends at scrape time; resident
memory comes from prometheus-client's process collector. Every HTTP response is counted by route
and status, which covers what never reaches the cascade (401, 429, 503, 4xx).

Speculative decoding's counts (tokens drafted and accepted, by tier and draft source) are the
engines' own running totals, read at scrape time as counters: the engine counts every drafted
token once, including those of requests no ledger entry records (shadow, eval scoring).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.backends.base import Backend
from router.ledger.entries import LedgerEntry
from router.tasks import TASKS

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_SCORE_BUCKETS = tuple(round(0.1 * i, 1) for i in range(1, 11))


class _BackendCollector(Collector):
    """Each backend's own gauges (`Backend.stats()`), read when Prometheus scrapes."""

    def __init__(self, backends: Callable[[], Mapping[str, Backend]]) -> None:
        self.backends = backends

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families: dict[str, GaugeMetricFamily] = {}
        for tier, backend in self.backends().items():
            for stat, value in backend.stats().items():
                family = families.get(stat)
                if family is None:
                    family = families[stat] = GaugeMetricFamily(
                        f"tierroute_backend_{stat}", f"Backend gauge '{stat}' per tier.", labels=["tier"]
                    )
                family.add_metric([tier], value)
        yield from families.values()


class _DeploymentCollector(Collector):
    """Each deployment's own gauges (`Backend.deployment_stats()`: its breaker, requests in flight,
    Retry-After mark, probe, attempts), read when Prometheus scrapes."""

    def __init__(self, backends: Callable[[], Mapping[str, Backend]]) -> None:
        self.backends = backends

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families: dict[str, GaugeMetricFamily] = {}
        for tier, backend in self.backends().items():
            for deployment, stats in backend.deployment_stats().items():
                for stat, value in stats.items():
                    family = families.get(stat)
                    if family is None:
                        family = families[stat] = GaugeMetricFamily(
                            f"tierroute_deployment_{stat}",
                            f"Deployment gauge '{stat}' per tier and deployment.",
                            labels=["tier", "deployment"],
                        )
                    family.add_metric([tier, deployment], value)
        yield from families.values()


class _DraftCollector(Collector):
    """Each backend's speculative decoding totals (`Backend.draft_counts()`), read when scraped."""

    def __init__(self, backends: Callable[[], Mapping[str, Backend]]) -> None:
        self.backends = backends

    def collect(self) -> Iterator[CounterMetricFamily]:
        drafted = CounterMetricFamily(
            "tierroute_draft_tokens",
            "Tokens drafted for speculative decoding, by tier and source"
            " (model: the draft model; rejected: a lower tier's rejected answer).",
            labels=["tier", "source"],
        )
        accepted = CounterMetricFamily(
            "tierroute_draft_accepted_tokens",
            "Drafted tokens the tier's model accepted, by tier and source.",
            labels=["tier", "source"],
        )
        for tier, backend in self.backends().items():
            for source, (n_drafted, n_accepted) in backend.draft_counts().items():
                drafted.add_metric([tier, source], n_drafted)
                accepted.add_metric([tier, source], n_accepted)
        yield drafted
        yield accepted


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, backends: Callable[[], Mapping[str, Backend]]) -> None:
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # process_resident_memory_bytes, cpu seconds, open fds
        r.register(_BackendCollector(backends))
        r.register(_DraftCollector(backends))
        r.register(_DeploymentCollector(backends))
        self.requests = Counter(
            "tierroute_requests",
            "Requests by final tier, outcome"
            " (accepted, escalated, unverified; cached: from the response cache; abandoned or failed: no answer,"
            " work spent)"
            " and task (structured, choice, code, maths, open_ended).",
            ["tier", "outcome", "task"],
            registry=r,
        )
        self.surfaces = Counter(
            "tierroute_surface_requests",
            "Requests settled, by the API surface they came through (chat.completions, completions, responses,"
            " messages).",
            ["surface"],
            registry=r,
        )
        self.stage_actions = Counter(
            "tierroute_stage_actions",
            "What request stages did (router.pipeline.stages), by stage, action (a guard's block, redact, "
            "keep_local, log_only, restore), kind (an entity kind, never its text) and where (request or answer).",
            ["stage", "action", "kind", "where"],
            registry=r,
        )
        self.refused = Counter(
            "tierroute_requests_refused", "Requests refused before generation, by reason.", ["reason"], registry=r
        )
        self.escalations = Counter(
            "tierroute_escalations",
            "Answers rejected at one tier and sent to the next.",
            ["from_tier", "to_tier"],
            registry=r,
        )
        self.attempts = Counter(
            "tierroute_attempts",
            "Tier attempts by decision (accepted, rejected, skipped, error, abandoned, cached).",
            ["tier", "decision"],
            registry=r,
        )
        self.scores = Histogram(
            "tierroute_verifier_score",
            "Verifier scores per tier; verifier='combined' is the score compared with the threshold.",
            ["tier", "verifier"],
            buckets=_SCORE_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "tierroute_tokens", "Tokens processed per tier (prompt, completion).", ["tier", "kind"], registry=r
        )
        self.cost = Counter(
            "tierroute_cost_usd", "Priced cost per tier, generation plus verification.", ["tier"], registry=r
        )
        self.key_cost = Counter("tierroute_key_cost_usd", "Priced cost per API key name.", ["key"], registry=r)
        self.counterfactual = Counter(
            "tierroute_counterfactual_cost_usd",
            "What the served requests would have cost sent straight to the top tier.",
            registry=r,
        )
        self.attempt_latency = Histogram(
            "tierroute_attempt_latency_seconds",
            "Generation latency per tier attempt.",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.request_latency = Histogram(
            "tierroute_request_latency_seconds",
            "Admission to settled answer, by answering tier.",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.deployment_requests = Counter(
            "tierroute_deployment_requests",
            "Requests answered, by tier and the deployment that answered (tiers with deployments only).",
            ["tier", "deployment"],
            registry=r,
        )
        self.in_flight = Gauge("tierroute_requests_in_flight", "Admitted requests not yet settled.", registry=r)
        self.http = Counter(
            "tierroute_http_responses", "HTTP responses by route and status.", ["path", "status"], registry=r
        )
        self.shadow = ShadowMetrics(r)

    def observe(self, entry: LedgerEntry) -> None:
        end = entry.attempts[-1].decision if entry.attempts else "accepted"
        if end in ("abandoned", "error"):  # spent work of a request that got no answer
            outcome = "abandoned" if end == "abandoned" else "failed"
        elif end == "cached":  # answered from the response cache (router.cache): nothing generated
            outcome = "cached"
        else:
            outcome = "unverified" if entry.unverified else "escalated" if entry.escalated else "accepted"
        # the label takes only the five task names, so a series count never grows with traffic
        task = entry.task if entry.task in TASKS else "open_ended"
        self.requests.labels(entry.tier, outcome, task).inc()
        if entry.surface is not None:
            self.surfaces.labels(entry.surface).inc()
        self.key_cost.labels(entry.key_id).inc(entry.cost_usd)
        self.counterfactual.inc(entry.counterfactual_usd)
        self.request_latency.labels(entry.tier).observe(entry.latency_ms / 1000)
        if entry.deployment is not None:
            self.deployment_requests.labels(entry.tier, entry.deployment).inc()
        for a, nxt in zip(entry.attempts, [*entry.attempts[1:], None], strict=False):
            self.attempts.labels(a.tier, a.decision).inc()
            if nxt is not None:
                self.escalations.labels(a.tier, nxt.tier).inc()
            self.tokens.labels(a.tier, "prompt").inc(a.prompt_tokens)
            self.tokens.labels(a.tier, "completion").inc(a.completion_tokens)
            self.cost.labels(a.tier).inc(a.cost_usd + a.verifier_cost_usd)
            if a.latency_ms is not None:
                self.attempt_latency.labels(a.tier).observe(a.latency_ms / 1000)
            if a.score is not None and a.scores:
                self.scores.labels(a.tier, "combined").observe(a.score)
            for name, value in a.scores.items():
                self.scores.labels(a.tier, name).observe(value)

    def observe_shadow(self, entry: LedgerEntry) -> None:
        """A shadow generation (router.quality.shadow): its money and tokens, under the operator key. It
        is not a served request, so the request, attempt and escalation counts leave it out."""
        self.key_cost.labels(entry.key_id).inc(entry.cost_usd)
        for a in entry.attempts:
            self.tokens.labels(a.tier, "prompt").inc(a.prompt_tokens)
            self.tokens.labels(a.tier, "completion").inc(a.completion_tokens)
            self.cost.labels(a.tier).inc(a.cost_usd + a.verifier_cost_usd)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ShadowMetrics:
    """Shadow escalation and drift (router.quality.shadow, router.quality.drift). Rates are gauges set as pairs
    arrive; `threshold` labels take only the configured thresholds, so series stay few."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.sampled = Counter(
            "tierroute_shadow_sampled", "Accepted answers sampled for a shadow request, per tier.", ["tier"], registry=r
        )
        self.dropped = Counter(
            "tierroute_shadow_dropped",
            "Sampled shadow requests not run: queue_full, budget (the day's shadow budget is spent), "
            "failed (the target tier failed), stopped (the service shut down), local_only (a guard keeps the request "
            "on the machine and the target is remote).",
            ["tier", "reason"],
            registry=r,
        )
        self.pairs = Counter(
            "tierroute_shadow_pairs", "Shadow pairs compared, by agreement.", ["tier", "target", "agree"], registry=r
        )
        self.spend = Gauge(
            "tierroute_shadow_spend_today_usd", "Shadow spend of this UTC day, per sampled tier.", ["tier"], registry=r
        )
        self.queue = Gauge("tierroute_shadow_queue_depth", "Shadow requests waiting, per tier.", ["tier"], registry=r)
        self.acceptance = Gauge(
            "tierroute_shadow_acceptance_rate",
            "Share of the tier's answers accepted, per threshold (requests routed 'auto').",
            ["tier", "threshold"],
            registry=r,
        )
        self.agreement = Gauge(
            "tierroute_shadow_agreement_rate",
            "Share of shadow pairs whose answers agree, per tier and threshold.",
            ["tier", "threshold"],
            registry=r,
        )
        self.agreement_low = Gauge(
            "tierroute_shadow_agreement_wilson_low", "95% Wilson interval, low.", ["tier", "threshold"], registry=r
        )
        self.agreement_high = Gauge(
            "tierroute_shadow_agreement_wilson_high", "95% Wilson interval, high.", ["tier", "threshold"], registry=r
        )
        self.accuracy = Gauge(
            "tierroute_shadow_accuracy_estimate",
            "Estimated accuracy of the tier's accepted answers: agreement with the larger tier as its proxy.",
            ["tier", "threshold"],
            registry=r,
        )
        self.alarm = Gauge(
            "tierroute_shadow_drift_alarm",
            "1 while a drift alarm is raised (router.quality.drift), per tier, task, signal and direction.",
            ["tier", "task", "signal", "direction"],
            registry=r,
        )
        self.alarms = Counter(
            "tierroute_drift_alarms", "Drift alarms raised.", ["tier", "task", "signal", "direction"], registry=r
        )
        self.statistic = Gauge(
            "tierroute_drift_statistic",
            "Each drift detector's CUSUM over its alarm level (an alarm at 1).",
            ["tier", "task", "signal", "direction"],
            registry=r,
        )


def _template_regex(template: str) -> re.Pattern[str]:
    """'/v1/models/{model}' -> ^/v1/models/[^/]+$"""
    parts = re.split(r"\{[^/}]+\}", template)
    return re.compile("^" + "[^/]+".join(re.escape(p) for p in parts) + "$")


class RouteTemplates:
    """The route template a path matches, or None: what names a request where a name must stay
    one of few (a metric's label, a span's name), whatever paths a scanner sends."""

    def __init__(self, routes: Callable[[], Iterable[str]]) -> None:
        self.routes = routes  # route templates, read on the first request (all routes exist by then)
        self._patterns: list[tuple[re.Pattern[str], str]] | None = None

    def match(self, path: str) -> str | None:
        if self._patterns is None:
            self._patterns = [(_template_regex(t), t) for t in self.routes()]
        for pattern, template in self._patterns:
            if pattern.match(path):
                return template
        return None


class ResponseCounter:
    """ASGI middleware: count every HTTP response by route template and status. Paths that match
    no route are folded into one label, so a scanner cannot blow up the series count."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: Callable[[], Iterable[str]]) -> None:
        self.app = app
        self.metrics = metrics
        self.templates = RouteTemplates(routes)

    def label(self, path: str) -> str:
        return self.templates.match(path) or "other"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        label = self.label(scope.get("path", ""))

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.http.labels(label, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)
