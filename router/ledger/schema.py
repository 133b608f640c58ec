"""The ledger's tables, described once: both stores' DDL and their column lists are generated here.

The schema used to be written twice, in two dialects (SQLite's in the store, PostgreSQL's in its
first migration), and a column added to one had to be remembered in the other. Now `TABLES` is
the one description (tables, columns, types, nullability, keys, indexes, and what each column
holds), and everything else is made from it: `sqlite_ddl()` (run on every open of a SQLite
ledger), `sqlite_added_columns()` (what an older file gains), `postgres_migration(n)` (the
statements of PostgreSQL migration n) and `postgres_ddl()` (the whole PostgreSQL schema at once).

Every table, column and index says when it appeared in each store: `sqlite` is the SQLite schema
version (`meta.schema_version`), `postgres` the PostgreSQL migration number; `None` means never in
that store (SQLite's `meta`, PostgreSQL's shared limits), and on a column or index `WITH_TABLE`
means it came with its table. The latest version of each store is the highest one named here.

PostgreSQL migrations that were released are applied as they were written, never regenerated
(`router.ledger.postgres_migrations.RELEASED`); a test holds the description to them token for token. A
later change is one edit here: a nullable column, a table or an index with the next version in
each store gives SQLite files their `ALTER TABLE` and PostgreSQL its next migration. Anything
else (a type change, a dropped column) is refused by the generator: write that migration by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal["text", "real", "integer"]
Store = Literal["sqlite", "postgres"]

WITH_TABLE = 0  # a column or index that came with its table, in each store the table is in
# the control plane's version in each store (keys, teams, user limits, audit: router.control); the
# lead may renumber these at a merge, so code and tests read them through `latest`, never as numbers
CONTROL_SQLITE = 8
CONTROL_POSTGRES = 5
# who gave a label (feedback.role and feedback.team): calibration reads whose labels it uses by them
FEEDBACK_GIVER_SQLITE = 11
FEEDBACK_GIVER_POSTGRES = 8
# the API surface a request came through (requests.surface)
SURFACE_SQLITE = 12
SURFACE_POSTGRES = 9
# each kind's type name in each dialect (SQLite's REAL and PostgreSQL's DOUBLE PRECISION are both
# 8-byte IEEE floats: a cost reads back as the same float from either store)
_TYPES: dict[Store, dict[Kind, str]] = {
    "sqlite": {"text": "TEXT", "real": "REAL", "integer": "INTEGER"},
    "postgres": {"text": "TEXT", "real": "DOUBLE PRECISION", "integer": "INTEGER"},
}
_RESERVED = frozenset({"user"})  # reserved words in PostgreSQL: quoted in every statement, in both stores


class SchemaError(Exception):
    """The description asks for a change the generator cannot make safely (write that migration by hand)."""


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    doc: str
    null: bool = False
    references: str | None = None  # "table (column)": the row goes with the row it belongs to
    sqlite: int | None = WITH_TABLE
    postgres: int | None = WITH_TABLE

    @property
    def quoted(self) -> str:
        return f'"{self.name}"' if self.name in _RESERVED else self.name


@dataclass(frozen=True)
class Index:
    name: str
    columns: tuple[str, ...]
    sqlite: int | None = WITH_TABLE
    postgres: int | None = WITH_TABLE


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    sqlite: int | None
    postgres: int | None
    indexes: tuple[Index, ...] = ()


TABLES: tuple[Table, ...] = (
    Table(
        "meta",
        "the SQLite file's own facts: `schema_version`",
        (Column("key", "text", "the fact's name"), Column("value", "text", "its value")),
        ("key",),
        sqlite=1,
        postgres=None,  # PostgreSQL records its migrations in schema_migrations
    ),
    Table(
        "requests",
        "one row per served request",
        (
            Column("request_id", "text", "the id the client received"),
            Column("ts", "real", "unix seconds (UTC) when the answer settled"),
            Column("key_id", "text", "the API key's name, never the key"),
            Column("model", "text", "what the client asked for: 'auto' or a tier name"),
            Column("tier", "text", "the tier that answered"),
            Column("escalated", "integer", "1 when more than one tier was tried"),
            Column("unverified", "integer", "1: a lower tier's answer, returned because the next tier was down"),
            Column("n_attempts", "integer", "how many attempts rows it has"),
            Column("prompt_tokens", "integer", "every attempt's prompt tokens"),
            Column("completion_tokens", "integer", "every attempt's completion tokens"),
            Column("latency_ms", "real", "admission to settled answer, as the router measured it"),
            Column("cost_usd", "real", "every attempt's generation and verifier cost, as the client was told"),
            Column("verifier_cost_usd", "real", "the part of cost_usd the verifiers spent"),
            Column("counterfactual_usd", "real", "had the request gone straight to the top tier"),
            Column("task", "text", "the request's task (router.tasks); NULL if unknown", null=True, sqlite=3),
            Column("task_why", "text", "why it was given that task", null=True, sqlite=3),
            Column(
                "user",
                "text",
                "OpenAI's `user` field as the client sent it, unchecked",
                null=True,
                sqlite=5,
                postgres=2,
            ),
            Column(
                "deployment",
                "text",
                "which deployment of the answering tier answered (router.backends.openai.deployments); NULL: "
                "a local tier, or a row written before deployments",
                null=True,
                sqlite=6,
                postgres=3,
            ),
            Column(
                "team",
                "text",
                "the key's team when the request was admitted (router.control); NULL: no team",
                null=True,
                sqlite=CONTROL_SQLITE,
                postgres=CONTROL_POSTGRES,
            ),
            Column(
                "surface",
                "text",
                "the API it came through: chat.completions, completions, responses or messages; NULL: a "
                "shadow generation, or a row written before surfaces were recorded",
                null=True,
                sqlite=SURFACE_SQLITE,
                postgres=SURFACE_POSTGRES,
            ),
        ),
        ("request_id",),
        sqlite=1,
        postgres=1,
        indexes=(Index("requests_ts", ("ts",)), Index("requests_key_ts", ("key_id", "ts"))),
    ),
    Table(
        "pending",
        "a request admitted and not yet settled: it counts at its reservation until its row replaces it",
        (
            Column("request_id", "text", "the request's id; its requests row, once settled, replaces this one"),
            Column("ts", "real", "unix seconds (UTC) at admission"),
            Column("key_id", "text", "the API key's name"),
            Column("model", "text", "what the client asked for"),
            Column("reserved_usd", "real", "the most the request can cost: its budget reservation"),
            Column("expires_at", "real", "the reservation stops counting then (its replica died)", sqlite=None),
            Column(
                "team",
                "text",
                "the key's team at admission: the team's reservations are summed by it",
                null=True,
                sqlite=CONTROL_SQLITE,
                postgres=CONTROL_POSTGRES,
            ),
            Column(
                "user",
                "text",
                "OpenAI's `user` field: a team's end user's reservations are summed by it",
                null=True,
                sqlite=CONTROL_SQLITE,
                postgres=CONTROL_POSTGRES,
            ),
        ),
        ("request_id",),
        sqlite=2,
        postgres=1,
        indexes=(Index("pending_key", ("key_id", "expires_at"), sqlite=None),),
    ),
    Table(
        "attempts",
        "one row per tier a request tried, as the client saw it in `tierroute.attempts`",
        (
            Column("request_id", "text", "the request", references="requests (request_id)"),
            Column("idx", "integer", "the attempt's place in the cascade, from 0"),
            Column("tier", "text", "the tier tried"),
            Column(
                "decision",
                "text",
                "accepted | rejected | skipped (pre-router) | error | abandoned (the client went away)",
            ),
            Column("reason", "text", "why, in words"),
            Column("error", "text", "the backend's error, if it failed", null=True),
            Column("score", "real", "the combined verifier score (NULL: every verifier abstained)", null=True),
            Column("threshold", "real", "the score it needed"),
            Column("scores_json", "text", 'each verifier\'s score, {"name": value}'),
            Column("prompt_tokens", "integer", "prompt tokens of its generation"),
            Column("completion_tokens", "integer", "completion tokens of its generation"),
            Column("finish_reason", "text", "the generation's finish reason", null=True),
            Column("latency_ms", "real", "the generation's latency", null=True),
            Column(
                "busy_ms", "real", "compute time the backend measured (what time-priced tiers charge for)", null=True
            ),
            Column("verify_ms", "real", "time spent verifying"),
            Column("cost_usd", "real", "the generation's cost"),
            Column("verifier_cost_usd", "real", "what its verifiers cost"),
            Column("verifier_tokens", "integer", "tokens its verifiers used"),
        ),
        ("request_id", "idx"),
        sqlite=1,
        postgres=1,
    ),
    Table(
        "shadow_pairs",
        "an accepted answer compared with a larger tier's answer to the same request (router.quality.shadow)",
        (
            Column("request_id", "text", "the client's request (its row in `requests`)"),
            Column("shadow_request_id", "text", "the shadow generation's row in `requests` (key_id '_shadow')"),
            Column("ts", "real", "unix seconds (UTC) when the pair was compared"),
            Column("tier", "text", "the tier that answered and was accepted"),
            Column("target", "text", "the tier asked in the shadow"),
            Column("task", "text", "the request's task (router.tasks), NULL if unknown", null=True),
            Column("score", "real", "the tier's combined verifier score at the time (NULL: all abstained)", null=True),
            Column("threshold", "real", "the threshold it was accepted at"),
            Column("scores_json", "text", 'each verifier\'s score then, {"name": value}'),
            Column("agree", "integer", "1 when the agreement rule says the two answers agree, else 0"),
            Column("rule", "text", "which rule decided: number | choice | code_tests | text"),
            Column("detail", "text", 'why, in words (e.g. "similarity 0.93 >= 0.80")'),
            Column(
                "answer_extracted",
                "text",
                "the accepted answer's extracted form (number, letter, normalised text)",
                null=True,
            ),
            Column("shadow_extracted", "text", "the shadow answer's extracted form", null=True),
            Column("prompt_sha256", "text", "SHA-256 of the prompt as canonical JSON (see `prompt_json`)"),
            Column("answer_sha256", "text", "SHA-256 of the accepted answer's UTF-8 text"),
            Column("shadow_sha256", "text", "SHA-256 of the shadow answer's UTF-8 text"),
            Column("shadow_cost_usd", "real", "what the shadow generation cost (charged to '_shadow')"),
            Column(
                "prompt_json",
                "text",
                'NULL unless ledger.store_prompts: {"messages": [{"role", "content"}]} or {"prompt": "..."}, '
                "canonical JSON (sorted keys, no spaces)",
                null=True,
            ),
            Column("answer_text", "text", "NULL unless ledger.store_prompts: the accepted answer in full", null=True),
            Column("shadow_text", "text", "NULL unless ledger.store_prompts: the shadow answer in full", null=True),
        ),
        ("request_id",),
        sqlite=4,
        postgres=1,
        indexes=(Index("shadow_pairs_ts", ("ts",)),),
    ),
    Table(
        "feedback",
        "a label a client posted for one of its requests (POST /v1/feedback, router.quality.feedback): "
        "several per request, each kept with its time",
        (
            Column("feedback_id", "text", "the label's own id, as the client received it"),
            Column("request_id", "text", "the request labelled", references="requests (request_id)"),
            Column("ts", "real", "unix seconds (UTC) when the label was received"),
            Column("key_id", "text", "the API key's name that posted it, never the key"),
            Column("score", "real", "the label: 0 (wrong) to 1 (right); a boolean is stored as 0 or 1"),
            Column("label", "text", "the client's name for the label (e.g. thumbs_down), unchecked", null=True),
            Column("comment", "text", "the client's comment, unchecked", null=True),
            Column(
                "role",
                "text",
                "the giver's standing when it posted: 'admin' (a reviewer's key) or 'client' (the key that made "
                "the request); NULL: a label posted before it was recorded, read as a client's",
                null=True,
                sqlite=FEEDBACK_GIVER_SQLITE,
                postgres=FEEDBACK_GIVER_POSTGRES,
            ),
            Column(
                "team",
                "text",
                "the giver's team when it posted (router.control); NULL: none, or not recorded",
                null=True,
                sqlite=FEEDBACK_GIVER_SQLITE,
                postgres=FEEDBACK_GIVER_POSTGRES,
            ),
        ),
        ("feedback_id",),
        sqlite=9,
        postgres=6,
        indexes=(Index("feedback_request", ("request_id", "ts")), Index("feedback_ts", ("ts",))),
    ),
    # what PostgreSQL replicas need to agree on a key's limits (router.admission.limits.SharedLimits);
    # one SQLite process keeps these in memory
    Table(
        "limit_keys",
        "one row per key: admissions lock it (SELECT ... FOR UPDATE), so a key's admissions are serial",
        (Column("key_id", "text", "the API key's name"),),
        ("key_id",),
        sqlite=None,
        postgres=1,
    ),
    Table(
        "key_spend",
        "settled cost per key and UTC day or month, added to in the settling transaction",
        (
            Column("key_id", "text", "the API key's name"),
            Column("kind", "text", "'day' or 'month'"),
            Column("start", "real", "the period's first second, unix seconds (UTC)"),
            Column("usd", "real", "what the key's settled requests cost in it"),
        ),
        ("key_id", "kind", "start"),
        sqlite=None,
        postgres=1,
    ),
    Table(
        "rate_events",
        "one row per admission of a rate-limited key, on the database's clock",
        (Column("key_id", "text", "the API key's name"), Column("ts", "real", "when it was admitted")),
        (),
        sqlite=None,
        postgres=1,
        indexes=(Index("rate_events_key_ts", ("key_id", "ts")),),
    ),
    # the control plane (router.control): keys, teams and end users' limits, read by every replica
    # and changed by the admin API; `control_version` is the one row a replica polls for changes
    Table(
        "api_keys",
        "one row per API key: its SHA-256 digest (never the key), roles, team, limits, models and expiry",
        (
            Column("name", "text", "the key's name: what the ledger, logs and metrics call it"),
            Column(
                "hash", "text", "'sha256$digest' of the key ('sha256$salt$digest' for keys made before December 2026)"
            ),
            Column("roles", "text", "'client', 'admin' or 'admin,client'"),
            Column("team", "text", "the team it belongs to (at most one); NULL: none", null=True),
            Column("usd_per_day", "real", "the key's daily budget (UTC days); NULL: none", null=True),
            Column("usd_per_month", "real", "its monthly budget (UTC months); NULL: none", null=True),
            Column("requests_per_minute", "integer", "its request rate limit; NULL: none", null=True),
            Column("tokens_per_minute", "integer", "its token rate limit (input + output); NULL: none", null=True),
            Column("models", "text", "JSON list of the models it may use ('auto', tier names); NULL: all", null=True),
            Column("allow_tests", "integer", "1: it may send tierroute.tests (code run on this host)"),
            Column("expires_at", "real", "unix seconds after which it is refused; NULL: never", null=True),
            Column("revoked_at", "real", "unix seconds when it was revoked; NULL: live", null=True),
            Column("created_at", "real", "unix seconds when it was created or imported"),
            Column("created_by", "text", "who created it: an admin key's name, 'cli:USER' or 'config'"),
        ),
        ("name",),
        sqlite=CONTROL_SQLITE,
        postgres=CONTROL_POSTGRES,
    ),
    Table(
        "teams",
        "one row per team: the limits all its keys share",
        (
            Column("name", "text", "the team's name"),
            Column("usd_per_day", "real", "daily budget of all its keys together; NULL: none", null=True),
            Column("usd_per_month", "real", "monthly budget; NULL: none", null=True),
            Column("requests_per_minute", "integer", "request rate of all its keys; NULL: none", null=True),
            Column("tokens_per_minute", "integer", "token rate of all its keys; NULL: none", null=True),
            Column("created_at", "real", "unix seconds when it was created"),
        ),
        ("name",),
        sqlite=CONTROL_SQLITE,
        postgres=CONTROL_POSTGRES,
    ),
    Table(
        "user_limits",
        "limits of one end user (OpenAI's `user` field) within a team; end_user '*' is every user's default",
        (
            Column("team", "text", "the team whose keys' requests it covers"),
            Column("end_user", "text", "the `user` field's value, or '*' for any user without a row of its own"),
            Column("usd_per_day", "real", "the user's daily budget; NULL: none", null=True),
            Column("usd_per_month", "real", "monthly budget; NULL: none", null=True),
            Column("requests_per_minute", "integer", "request rate; NULL: none", null=True),
            Column("tokens_per_minute", "integer", "token rate; NULL: none", null=True),
        ),
        ("team", "end_user"),
        sqlite=CONTROL_SQLITE,
        postgres=CONTROL_POSTGRES,
    ),
    Table(
        "audit",
        "one row per admin action: who, what, when (never a key or its hash)",
        (
            Column("ts", "real", "unix seconds when it was done"),
            Column("actor", "text", "who: an admin key's name, 'cli:USER' or 'config'"),
            Column("action", "text", "what: key.create, key.update, key.revoke, team.create, ..."),
            Column("target", "text", "the key, team or team/user it was done to"),
            Column("detail", "text", "JSON of the fields it set"),
        ),
        (),
        sqlite=CONTROL_SQLITE,
        postgres=CONTROL_POSTGRES,
        indexes=(Index("audit_ts", ("ts",)),),
    ),
    Table(
        "control_version",
        "one row (id 1): its version grows with every change to keys, teams or user limits",
        (
            Column("id", "integer", "always 1"),
            Column("version", "integer", "how many changes have been committed"),
            Column("changed_at", "real", "unix seconds of the last change"),
        ),
        ("id",),
        sqlite=CONTROL_SQLITE,
        postgres=CONTROL_POSTGRES,
    ),
    Table(
        "token_events",
        "tokens per limited subject and admission, on the database's clock: reserved, then settled",
        (
            Column("subject", "text", "a key's name, 'team:NAME' or 'user:TEAM:USER'"),
            Column("request_id", "text", "the request"),
            Column("ts", "real", "when it was admitted"),
            Column("tokens", "integer", "its worst case until it settles, then its real input + output"),
        ),
        (),
        sqlite=None,
        postgres=CONTROL_POSTGRES,
        indexes=(Index("token_events_subject_ts", ("subject", "ts")), Index("token_events_request", ("request_id",))),
    ),
    # the exact-match response cache (router.cache): in the ledger's database, so replicas share it
    Table(
        "cache_entries",
        "one cached answer per cache key: what a repeated deterministic request is answered with (router.cache)",
        (
            Column("cache_key", "text", "SHA-256 of the canonical request, its scope and the tier policy version"),
            Column("scope", "text", "whose entry it is (the API key's name under scope 'key'); read back only by it"),
            Column("policy", "text", "the tier policy version it was answered under (router.cache.keys)"),
            Column(
                "shape",
                "text",
                "chat.completion | text_completion | response | message: the endpoint that answered",
            ),
            Column("tier", "text", "the tier that answered"),
            Column("request_id", "text", "the request whose answer it is"),
            Column("created", "real", "unix seconds (UTC) when it was stored: the oldest are evicted first"),
            Column("expires_at", "real", "unix seconds (UTC) past which it is never served"),
            Column("size", "integer", "bytes of `body`"),
            Column("body", "text", "the answer as JSON: model, choices, usage, task (checked whole on every read)"),
            Column("digest", "text", "SHA-256 of cache_key, scope and body: a row altered or moved is refused"),
        ),
        ("cache_key",),
        sqlite=7,
        postgres=4,
        indexes=(
            Index("cache_entries_created", ("created",)),
            Index("cache_entries_expires", ("expires_at",)),
            # one scope's oldest, for its own bound (cache.max_entries_per_scope)
            Index("cache_entries_scope_created", ("scope", "created"), sqlite=10, postgres=7),
        ),
    ),
)


def _version(item: Table | Column | Index, store: Store, table: Table | None = None) -> int | None:
    """When `item` appeared in `store` (None: never); a column's or index's WITH_TABLE is its table's."""
    if table is not None and _version(table, store) is None:
        return None  # nothing of a table is in a store the table is not in
    version = item.sqlite if store == "sqlite" else item.postgres
    return _version(table, store) if version == WITH_TABLE and table is not None else version


def _present(item: Table | Column | Index, store: Store, at: int | None, table: Table | None = None) -> bool:
    version = _version(item, store, table)
    return version is not None and (at is None or version <= at)


def latest(store: Store, tables: Sequence[Table] = TABLES) -> int:
    """The store's current version: the highest one the description names."""
    found = [_version(t, store) for t in tables]
    for t in tables:
        found += [_version(c, store, t) for c in t.columns] + [_version(i, store, t) for i in t.indexes]
    return max(v for v in found if v is not None)


def versions(store: Store, tables: Sequence[Table] = TABLES) -> list[int]:
    """Every version of `store` the description names, in order. Branches number their changes
    ahead of a merge, so a version may be missing (its migration comes with its branch)."""
    found = {_version(t, store) for t in tables}
    for t in tables:
        found |= {_version(c, store, t) for c in t.columns} | {_version(i, store, t) for i in t.indexes}
    return sorted(v for v in found if v is not None and v != WITH_TABLE)


def table(name: str, tables: Sequence[Table] = TABLES) -> Table:
    return {t.name: t for t in tables}[name]


def columns(name: str, store: Store, tables: Sequence[Table] = TABLES) -> tuple[Column, ...]:
    """The table's columns in `store` today, in the order the stores write and read them."""
    t = table(name, tables)
    return tuple(c for c in t.columns if _present(c, store, None, t))


def column_list(name: str, store: Store, prefix: str = "") -> str:
    """The table's columns for a SELECT or an INSERT: 'a, b, "user"' (`prefix` 'r.' qualifies each)."""
    return ", ".join(prefix + c.quoted for c in columns(name, store))


def _create_table(t: Table, store: Store, at: int | None, guard: str) -> str:
    cols = [c for c in t.columns if _present(c, store, at, t)]
    width = max(len(c.quoted) for c in cols)
    lines = []
    for c in cols:
        words = [c.quoted.ljust(width), _TYPES[store][c.kind]]
        if t.primary_key == (c.name,):
            words.append("PRIMARY KEY")
        elif not c.null:
            words.append("NOT NULL")
        if c.references:
            words.append(f"REFERENCES {c.references} ON DELETE CASCADE")
        lines.append(" ".join(words))
    if len(t.primary_key) > 1:
        lines.append(f"PRIMARY KEY ({', '.join(t.primary_key)})")
    body = ",\n    ".join(lines)
    return f"CREATE TABLE {guard}{t.name} (\n    {body}\n);"


def _create_index(t: Table, index: Index, guard: str) -> str:
    return f"CREATE INDEX {guard}{index.name} ON {t.name} ({', '.join(index.columns)});"


def _add_column(t: Table, c: Column, store: Store) -> str:
    if not c.null or c.references:
        # an existing table's rows have no value for it: only a nullable column can be added in place
        raise SchemaError(
            f"{t.name}.{c.name}: a column added to an existing table must be nullable, without REFERENCES"
        )
    return f"ALTER TABLE {t.name} ADD COLUMN {c.quoted} {_TYPES[store][c.kind]};"


def sqlite_ddl(tables: Sequence[Table] = TABLES) -> str:
    """Every SQLite table and index, created if missing (run on every read-write open)."""
    statements = []
    for t in tables:
        if _present(t, "sqlite", None):
            statements.append(_create_table(t, "sqlite", None, "IF NOT EXISTS "))
            statements += [_create_index(t, i, "IF NOT EXISTS ") for i in t.indexes if _present(i, "sqlite", None, t)]
    return "\n".join(statements) + "\n"


def sqlite_added_columns(tables: Sequence[Table] = TABLES) -> dict[str, dict[str, str]]:
    """Per table, the columns added after its first release, each with its ALTER TABLE statement:
    a file written by an older version gains them on open (older rows hold NULL), so no file is
    ever rewritten or lost."""
    added: dict[str, dict[str, str]] = {}
    for t in tables:
        first = _version(t, "sqlite")
        for c in t.columns:
            version = _version(c, "sqlite", t)
            if first is not None and version is not None and version > first:
                added.setdefault(t.name, {})[c.name] = _add_column(t, c, "sqlite")
    return added


def postgres_migration(version: int, tables: Sequence[Table] = TABLES) -> str:
    """The statements of PostgreSQL migration `version`: the tables it creates (with their
    indexes), then, in tables that existed, the columns and indexes it adds."""
    statements = []
    for t in tables:
        if _version(t, "postgres") == version:
            statements.append(_create_table(t, "postgres", version, ""))
            statements += [_create_index(t, i, "") for i in t.indexes if _version(i, "postgres", t) == version]
        elif _present(t, "postgres", version):
            statements += [_add_column(t, c, "postgres") for c in t.columns if _version(c, "postgres", t) == version]
            statements += [_create_index(t, i, "") for i in t.indexes if _version(i, "postgres", t) == version]
    if not statements:
        raise SchemaError(f"PostgreSQL migration {version}: the description adds nothing at that version")
    return "\n".join(statements) + "\n"


def postgres_why(version: int, tables: Sequence[Table] = TABLES) -> str:
    """What migration `version` adds, in words (recorded in schema_migrations.why)."""
    said = []
    for t in tables:
        if _version(t, "postgres") == version:
            said.append(f"the {t.name} table: {t.doc}")
            continue
        said += [f"{t.name}.{c.name}: {c.doc}" for c in t.columns if _version(c, "postgres", t) == version]
        said += [f"index {i.name}" for i in t.indexes if _version(i, "postgres", t) == version]
    return "; ".join(said)


def postgres_ddl(tables: Sequence[Table] = TABLES) -> str:
    """The whole PostgreSQL schema as one script (what every migration together makes)."""
    statements = []
    for t in tables:
        if _present(t, "postgres", None):
            statements.append(_create_table(t, "postgres", None, ""))
            statements += [_create_index(t, i, "") for i in t.indexes if _present(i, "postgres", None, t)]
    return "\n".join(statements) + "\n"
