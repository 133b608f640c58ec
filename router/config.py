"""Typed, validated configuration.

`config.toml` is read into `Settings` through pydantic-settings. Precedence, highest first:
keyword arguments, environment variables (prefix ``TIERROUTE_``, nested keys joined with ``__``,
e.g. ``TIERROUTE_SERVER__PORT=9000``), then the TOML file. Every model forbids unknown keys, so a
typo is refused at start-up with the key's path in the message instead of silently ignored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from router.config_tiers import (
    DeploymentSettings as DeploymentSettings,
)
from router.config_tiers import (
    LlamaCppSettings as LlamaCppSettings,
)
from router.config_tiers import (
    OpenAIBackendSettings as OpenAIBackendSettings,
)
from router.config_tiers import (
    PrerouterSettings as PrerouterSettings,
)
from router.config_tiers import (
    PriceSettings as PriceSettings,
)
from router.config_tiers import (
    ShadowSettings as ShadowSettings,
)
from router.config_tiers import (
    SpecCascadeSettings as SpecCascadeSettings,
)
from router.config_tiers import (
    TaskPolicySettings as TaskPolicySettings,
)
from router.config_tiers import (
    TierSettings as TierSettings,
)
from router.config_tiers import (
    VerifierSpec as VerifierSpec,
)
from router.config_tiers import (  # re-exported: the tier settings live there
    _Strict as _Strict,
)
from router.errors import ConfigError

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "config.toml"
SHADOW_KEY = "_shadow"  # the operator account shadow work is charged to (the ledger's key)
ANONYMOUS_KEY = "anonymous"  # every caller of a server without keys (its ledger rows, cache scope, feedback)
# Names the service gives callers and actors of its own. A key or team of one of these names (in
# any case) would pass for them: a key named 'anonymous' read a formerly keyless server's cache
# and could label that era's requests; an admin key named 'config' writes audit rows that read
# as config imports. Refused wherever a key or team is made (router.control.records.check_name).
RESERVED_NAMES: dict[str, str] = {
    ANONYMOUS_KEY: "every caller of a server without keys is 'anonymous' (its requests, cache entries and feedback)",
    "config": "the audit log's actor for keys imported from the config",
    SHADOW_KEY: "the ledger's key for shadow work",
}


def reserved_name(name: str) -> str | None:
    """Why `name` is the service's own, or None when a key or team may take it."""
    why = RESERVED_NAMES.get(name.lower())
    return None if why is None else f"'{name}' is a reserved name: {why}"


def _client_only() -> list[Literal["client", "admin", "metrics", "report"]]:
    return ["client"]


# a key's or team's name (the admin API's rule, here so a config key follows it too): its counters
# are kept under its bare name, a team's under 'team:NAME', an end user's under 'user:TEAM:USER'
KEY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"


class ApiKeyEntry(_Strict):
    name: str = Field(pattern=KEY_NAME_PATTERN, description="1-64 letters, digits and _.@- (no ':').")
    hash: str = Field(
        description="'sha256$digest' as printed by `tierroute keys create` (the older salted "
        "'sha256$salt$digest' is accepted)."
    )
    usd_per_day: float | None = Field(None, ge=0)
    usd_per_month: float | None = Field(None, ge=0)
    requests_per_minute: int | None = Field(None, ge=1, le=2**31 - 1)  # PostgreSQL INTEGER
    allow_tests: bool = Field(
        False, description="May send `tierroute.tests`: code that runs on this host (in the sandbox)."
    )
    tokens_per_minute: int | None = Field(None, ge=1, le=2**31 - 1, description="Input + output tokens per minute.")
    roles: list[Literal["client", "admin", "metrics", "report"]] = Field(
        default_factory=_client_only,
        min_length=1,
        description="'client': /v1 (completions, models); 'admin': the admin API (/admin/); 'metrics': "
        "/metrics only (a scraper's key); 'report': the dashboard under /ui/ only (read-only). An admin key "
        "sends completions only if it is also a client. "
        "With a ledger, config keys are imported into its database once (docs/keys.md).",
    )

    @field_validator("name", mode="before")  # before the pattern: '_shadow' is refused for what it is
    @classmethod
    def _not_reserved(cls, value: Any) -> Any:
        problem = reserved_name(value) if isinstance(value, str) else None
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("hash")
    @classmethod
    def _hash_form(cls, value: str) -> str:
        # a mistyped hash would match no key, silently: the key it was meant for gets 401s
        if not re.fullmatch(r"sha256\$(?:[^$\s]{1,128}\$)?[0-9a-f]{64}", value):
            raise ValueError("a key's hash is 'sha256$' and 64 hex digits, as `tierroute keys create` prints it")
        return value


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    allow_unauthenticated: bool = Field(
        False, description="Serve without API keys. Must be explicit; refused on public addresses."
    )
    allow_public_without_keys: bool = Field(False, description="Override the public-bind refusal.")
    allow_client_tests_without_keys: bool = Field(
        False,
        description="When serving without keys, let any client send `tierroute.tests` (code run on this "
        "host). With keys, each key's own allow_tests decides.",
    )
    api_keys: list[ApiKeyEntry] = Field(default_factory=list)
    max_body_bytes: int = Field(1_000_000, ge=1024, description="Larger request bodies get 413.")
    max_in_flight: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description="Requests to the /v1/ surfaces served at once; one more is answered 503 with Retry-After "
        "at once, before its key is checked or its body parsed (router.api.shedding), instead of waiting.",
    )
    shed_lag_ms: float | None = Field(
        None,
        gt=0,
        le=60_000,
        description="While the event loop runs this much late (every new request would wait as long), new "
        "requests to the /v1/ surfaces get 503 with Retry-After at once unless none is in flight. Unset (the "
        "default): only max_in_flight sheds; a machine shared with other work runs late often enough to shed "
        "at low load.",
    )
    metrics_public: bool = Field(
        False, description="Serve /metrics to anyone (it names every key and its spend); else admin and metrics keys."
    )
    docs: bool | None = Field(
        None,
        description="Serve /docs, /redoc and /openapi.json (behind the API keys when there are keys). "
        "Unset: on only for keyless serving on a loopback address.",
    )
    keys_poll_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="How often a replica checks the ledger's database for changed keys, teams and "
        "limits; a change made on another replica is seen within this plus 1 s (one reload, docs/keys.md).",
    )
    allowed_hosts: list[str] | None = Field(
        None,
        description="Host header names (any port) the server answers; others get 400. '*' allows any. "
        "Unset: 127.0.0.1, localhost and [::1] for keyless serving on a loopback address (against DNS "
        "rebinding), any host otherwise.",
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        cleaned = [h.strip().lower().rstrip(".") for h in v]
        for raw, host in zip(v, cleaned, strict=False):
            bracketed = host.startswith("[") and host.endswith("]")  # an IPv6 address, as in a Host header
            if not host or any(c.isspace() or c in "/@" for c in host) or (":" in host and not bracketed):
                raise ValueError(f"not a host name: {raw!r} (names like 'api.example.com' or '[::1]', no port)")
        return cleaned


class CascadeSettings(_Strict):
    on_unavailable: Literal["error", "best_effort"] = Field(
        "error",
        description="When an escalation target is down: 503 with Retry-After, or the best lower-tier "
        "answer marked unverified.",
    )
    retry_after_s: int = Field(
        30,
        ge=1,
        description="Retry-After sent when an upstream tier fails and neither the upstream nor its "
        "breaker says how long to wait.",
    )
    task_classifier: bool = Field(
        True,
        description="Label the requests no task rule claims with the committed learned classifier "
        "(router/data/task_model.json); false: rules alone, the rest are open_ended.",
    )


class SandboxSettings(_Strict):
    """The host's limit on sandboxed runs (model-written and client-sent code), shared by every
    verifier that runs code on every tier; each verifier's own `max_concurrency` applies within it."""

    max_concurrency: int = Field(
        0, ge=0, le=1024, description="Sandboxes running at once in this process; 0: the machine's CPU count."
    )
    max_queue: int = Field(
        0, ge=0, le=65536, description="Runs waiting for a sandbox; 0: four per slot. Beyond it a run is refused (503)."
    )

    @property
    def slots(self) -> int:
        return self.max_concurrency or os.cpu_count() or 2

    @property
    def queue(self) -> int:
        return self.max_queue or 4 * self.slots


class ModelsSettings(_Strict):
    cache_dir: Path | None = Field(None, description="Where pulled models live; default XDG cache.")


_SECRET_KEYWORDS = frozenset({"password", "sslpassword"})


def postgres_url_problem(url: str) -> str | None:
    """Why `url` cannot name a PostgreSQL ledger, or None when it can. Never echoes the URL: it may
    hold the very secret it is refused for."""
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket, say; its message would quote the URL
        return "ledger.url is not a URL (see libpq's connection URI format)"
    if parts.scheme not in ("postgresql", "postgres"):
        return "ledger.url must be a postgresql://user@host:port/db URL"
    # read as libpq reads it: it decodes percent-encoded keywords, so `passwor%64=` is a password
    # as surely as `password=` is, and a search for the literal text misses it
    from psycopg import Error as PsycopgError
    from psycopg.conninfo import conninfo_to_dict

    try:
        keywords = conninfo_to_dict(url)
    except PsycopgError:  # libpq's message quotes the offending part, which may be the secret
        return "ledger.url is not a PostgreSQL URL libpq can read (see libpq's connection URI format)"
    if parts.password is not None or _SECRET_KEYWORDS & set(keywords):
        return (
            "ledger.url must not carry a password: put it in an environment variable and name it in ledger.password_env"
        )
    return None


class LedgerSettings(_Strict):
    path: Path = Field(Path("tierroute-ledger.sqlite3"), description="SQLite file of served requests.")
    url: str | None = Field(
        None,
        description="A PostgreSQL ledger shared by every replica, postgresql://user@host:port/db (no "
        "password here: see password_env); set, it replaces `path`, and key budgets and rate limits are "
        "enforced across all replicas through it.",
    )
    password_env: str | None = Field(
        None,
        description="Name of the environment variable holding the PostgreSQL password (read at start-up); "
        "unset: libpq's own PGPASSWORD or ~/.pgpass.",
    )
    pool_size: int = Field(8, ge=2, le=256, description="PostgreSQL connections per replica.")
    synchronous_commit: Literal["off", "local", "on", "remote_write", "remote_apply"] = Field(
        "off",
        description="PostgreSQL's synchronous_commit for the ledger's sessions. 'off' (the default) is the "
        "SQLite store's promise: a commit is visible to every replica at once and survives any replica "
        "dying, and a crash of the database server itself may lose its last fraction of a second; 'on' "
        "also waits for the flush to disk (one fsync per request, which bounds a replica's write rate).",
    )
    connect_timeout_s: float = Field(
        5.0,
        gt=0,
        le=120,
        description="How long a PostgreSQL connect or admission may wait before the request gets 503.",
    )
    prune_every_s: float = Field(
        60.0,
        ge=0.05,
        le=86400,
        description="PostgreSQL: how often each replica deletes counter rows no admission reads again "
        "(idle end users', events past the window, past days' spend); one replica at a time.",
    )
    enabled: bool = True
    store_prompts: bool = Field(
        False,
        description="Keep the prompt and both answers of each shadow pair in the ledger (for `eval import`); "
        "off: hashes and extracted answers only.",
    )

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, url: str | None) -> str | None:
        problem = None if url is None else postgres_url_problem(url)
        if problem is not None:
            raise ValueError(problem)
        return url

    @property
    def location(self) -> str:
        """What the ledger is, for logs and `open_store`: the PostgreSQL URL, or the file's path."""
        return self.url if self.url is not None else str(self.path)


class CacheSettings(_Strict):
    """The exact-match response cache (router.cache; docs/cache.md). Off by default."""

    enabled: bool = Field(False, description="Answer a repeated deterministic request from the cache.")
    ttl_s: float = Field(3600.0, gt=0, le=30 * 86400, description="How long an answer may be served from the cache.")
    max_entries: int = Field(
        10_000, ge=1, le=10_000_000, description="Entries kept in all; past it the oldest are evicted."
    )
    max_entry_bytes: int = Field(
        262_144,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Larger answers are not stored (and a larger stored row is refused on reading).",
    )
    scope: Literal["key", "team", "global"] = Field(
        "key",
        description="Who shares entries: 'key', each API key its own (one tenant never receives another's "
        "answer); 'team', the keys of one team (a key without a team keeps its own); 'global', every "
        "caller (one tenant only).",
    )
    allow_nondeterministic: bool = Field(
        False,
        description="Also cache requests sampled with temperature > 0 and no seed (every repeat then gets "
        "the first sample).",
    )
    namespace: str = Field(
        "", max_length=64, description="Mixed into every key: change it to stop serving every earlier entry."
    )
    max_entries_per_scope: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="Entries one scope (a key, or a team) keeps; past it that scope's oldest are evicted, "
        "so one tenant's many distinct requests push out only its own. Unset: a tenth of max_entries. "
        "Not applied under scope 'global', nor to a keyless server's one tenant.",
    )

    @model_validator(mode="after")
    def _scope_share(self) -> CacheSettings:
        if self.max_entries_per_scope is not None and self.max_entries_per_scope > self.max_entries:
            raise ValueError(
                f"cache.max_entries_per_scope ({self.max_entries_per_scope}) is more than cache.max_entries "
                f"({self.max_entries}): one tenant could still evict every other's entries"
            )
        return self

    @property
    def scope_share(self) -> int:
        """Entries one scope keeps: `max_entries_per_scope`, or a tenth of `max_entries`."""
        if self.max_entries_per_scope is not None:
            return self.max_entries_per_scope
        return max(1, self.max_entries // 10)


class TelemetrySettings(_Strict):
    """OpenTelemetry traces (`router.telemetry`): off unless an endpoint is set here or the standard
    OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_SERVICE_NAME is set."""

    endpoint: str | None = Field(
        None,
        description="OTLP/HTTP (protobuf) traces endpoint, e.g. http://collector:4318/v1/traces. Unset: "
        "the OTEL_EXPORTER_OTLP_* environment variables decide, and with none of them set tracing is off.",
    )
    service_name: str | None = Field(
        None, description="service.name of the exported spans; unset: OTEL_SERVICE_NAME, else 'tierroute'."
    )
    export_timeout_s: float = Field(10.0, gt=0, le=120, description="How long one OTLP export may take.")

    @field_validator("endpoint")
    @classmethod
    def _http_endpoint(cls, v: str | None) -> str | None:
        if v is not None and urlsplit(v).scheme not in ("http", "https"):
            raise ValueError(f"an OTLP/HTTP endpoint is an http(s) URL, not {v!r}")
        return v


class LoggingSettings(_Strict):
    format: Literal["text", "json"] = Field(
        "text",
        description="'json': one JSON object per line for the service's, uvicorn's and the per-request "
        "log lines (request id, key name, task, tiers, tokens, cost, latency, status).",
    )


class DashboardSettings(_Strict):
    """The dashboard under /ui/ (router.dashboard; docs/dashboard.md): read-only pages for admin
    and report keys."""

    enabled: bool = Field(True, description="Serve the dashboard under /ui/ (admin and report keys only).")
    eval_report: Path | None = Field(
        None,
        description="A directory written by `tierroute eval report` (its sweep.csv) for the Evals page, such "
        "as the committed docs/eval; unset: the page says none is set.",
    )


class StageSpec(_Strict):
    """A request stage (router.pipeline.stages): a built-in or a plugin's, by registered name."""

    name: str = Field(description="Registered stage name (entry-point group tierroute.stages), e.g. 'deny_phrases'.")
    params: dict[str, Any] = Field(default_factory=dict, description="Passed to the stage's factory.")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TIERROUTE_", env_nested_delimiter="__", extra="forbid", toml_file=None
    )

    server: ServerSettings = Field(default_factory=ServerSettings)
    models: ModelsSettings = Field(default_factory=ModelsSettings)
    cascade: CascadeSettings = Field(default_factory=CascadeSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    tiers: list[TierSettings] = Field(min_length=1)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)
    stages: list[StageSpec] = Field(
        default_factory=list,
        description="Request stages run on every request, in this order, after admission and the exact cache "
        "(docs/plugins.md, 'Request stages').",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    @model_validator(mode="after")
    def _unique_tiers(self) -> Settings:
        names = [t.name for t in self.tiers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate tier names: {', '.join(dupes)}")
        for i, t in enumerate(self.tiers):
            if t.shadow is None:
                continue
            where = f"tiers[{i}] ({t.name}).shadow.target"
            target = self.shadow_target(t)
            if target is None:
                raise ValueError(f"{where}: the last tier has no next tier; name a target tier")
            if target not in names:
                raise ValueError(f"{where}: no tier named {target!r}; known: {', '.join(names)}")
            if target == t.name:
                raise ValueError(f"{where}: a tier cannot shadow itself")
        if any(k.name == SHADOW_KEY for k in self.server.api_keys):
            raise ValueError(f"server.api_keys: the key name {SHADOW_KEY!r} is the operator's shadow account")
        return self

    @model_validator(mode="after")
    def _cache_needs_ledger(self) -> Settings:
        if self.cache.enabled and not self.ledger.enabled:
            raise ValueError("cache.enabled: the response cache is kept in the ledger's database; enable the ledger")
        return self

    def shadow_target(self, tier: TierSettings) -> str | None:
        """The tier `tier`'s shadow work goes to: its named target, else the next tier."""
        if tier.shadow is not None and tier.shadow.target is not None:
            return tier.shadow.target
        names = [t.name for t in self.tiers]
        i = names.index(tier.name)
        return names[i + 1] if i + 1 < len(names) else None

    def tier(self, name: str) -> TierSettings:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)


def _loc(loc: tuple[Any, ...], data: dict[str, Any] | None) -> str:
    parts: list[str] = []
    for i, part in enumerate(loc):
        if isinstance(part, int):
            label = f"[{part}]"
            if i > 0 and loc[i - 1] == "tiers" and data:
                try:
                    label = f"[{part}] ({data['tiers'][part]['name']})"
                except (KeyError, IndexError, TypeError):
                    pass
            parts.append(label)
        else:
            parts.append(("." if parts else "") + str(part))
    return "".join(parts)


def load_settings(path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Read, validate and return the settings; raise ConfigError naming the offending key."""
    config_path = Path(path) if path is not None else DEFAULT_CONFIG
    if not config_path.is_file():
        raise ConfigError(f"config file not found: {config_path}")
    bound = type("Settings", (Settings,), {"model_config": {**Settings.model_config, "toml_file": config_path}})
    try:
        settings: Settings = bound(**overrides)
        return settings
    except ValidationError as exc:
        raw: dict[str, Any] | None = None
        try:
            import tomllib

            raw = tomllib.loads(config_path.read_text())
        except Exception:  # the error below is the one that matters
            raw = None
        lines = [
            f"  {_loc(tuple(err['loc']), raw) or '(top level)'}: {err['msg']}"
            + (
                f" (got {err['input']!r})"
                if err["type"] != "missing" and _short(err.get("input")) and tuple(err["loc"]) not in _SECRET_INPUTS
                else ""
            )
            for err in exc.errors()
        ]
        raise ConfigError(f"invalid config {config_path}:\n" + "\n".join(lines)) from None
    except ValueError as exc:  # TOML syntax errors surface as ValueError subclasses
        raise ConfigError(f"invalid config {config_path}: {exc}") from None


# settings whose refused value may be a secret (a password in a URL): never echoed in an error
_SECRET_INPUTS = frozenset({("ledger", "url")})


def _short(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and len(repr(value)) < 60
