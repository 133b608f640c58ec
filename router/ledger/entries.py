"""What the ledger records, and the interface a store keeps it behind.

One served request is a `LedgerEntry` with every tier attempt it took (`AttemptEntry`); a streamed
request is first a `PendingEntry`, written ahead of its answer at its worst-case cost. These are
plain values, the same for every store: they hold the floats the client received, never
recomputed, so a report reads back exactly what was charged.

Shadow pairs (`router.quality.shadow`): a sampled share of accepted answers is also asked of a
larger tier, off the client's path; the shadow generation is an ordinary `LedgerEntry` charged to
the operator key `_shadow` (so `report costs --by key` shows it), and the comparison of the two
answers is one `ShadowPair`. Without `ledger.store_prompts` a pair keeps hashes and extracted
answers only: enough for agreement rates, drift and deduplication, not to replay the prompt to
another model.

Feedback (`router.quality.feedback`): a label posted for a request by the key that made it or by an
admin reviewer, by the request's id; a request may have several, each kept with its time. A label
holds the score, the label name and comment, and who gave it (the key's name, its role and team
then): no prompt, no answer.

`LedgerStore` is the storage interface both stores implement (`router.ledger.store.SQLiteStore`,
`router.ledger.postgres.PostgresStore`); the tables behind it are described in
`router.ledger.schema`, and `router.ledger.rows` maps these values to and from their rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from router.config import SHADOW_KEY as SHADOW_KEY  # the operator key shadow rows are written under

if TYPE_CHECKING:
    from router.cascade import Attempt, CascadeResult


@dataclass(frozen=True)
class AttemptEntry:
    """One tier's try at a request, as the client saw it in `tierroute.attempts`."""

    idx: int
    tier: str
    decision: str  # accepted | rejected | skipped (pre-router) | error | abandoned (the client went away)
    reason: str
    error: str | None
    score: float | None
    threshold: float
    scores: dict[str, float]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    latency_ms: float | None
    busy_ms: float | None  # compute time the backend measured (what time-priced tiers charge for)
    verify_ms: float
    cost_usd: float
    verifier_cost_usd: float
    verifier_tokens: int

    @classmethod
    def from_attempt(cls, idx: int, a: Attempt) -> AttemptEntry:
        g = a.generation
        if a.abandoned:
            decision = "abandoned"
        elif a.accepted:
            decision = "accepted"
        elif a.error:
            decision = "error"
        elif a.skipped:
            decision = "skipped"  # the pre-router passed the tier over: nothing generated, nothing rejected
        else:
            decision = "rejected"
        return cls(
            idx=idx,
            tier=a.tier,
            decision=decision,
            reason=a.reason,
            error=a.error,
            score=a.score,
            threshold=a.threshold,
            scores={name: s.value for name, s in a.scores.items() if s.value is not None},
            prompt_tokens=g.prompt_tokens if g else 0,
            completion_tokens=g.completion_tokens if g else 0,
            finish_reason=g.finish_reason if g else None,
            latency_ms=g.latency_s * 1000 if g else None,
            busy_ms=g.busy_s * 1000 if g and g.busy_s is not None else None,
            verify_ms=a.verify_s * 1000,
            cost_usd=a.cost_usd,
            verifier_cost_usd=a.verifier_cost_usd,
            verifier_tokens=a.verifier_cost.prompt_tokens + a.verifier_cost.completion_tokens,
        )


@dataclass(frozen=True)
class LedgerEntry:
    """One served request. Costs are the same floats the client received, not recomputed."""

    request_id: str
    ts: float  # unix seconds (UTC) when the answer settled
    key_id: str  # the API key's name, never the key
    model: str  # what the client asked for: 'auto' or a tier name
    tier: str  # the tier that answered
    escalated: bool
    unverified: bool
    latency_ms: float  # admission to settled answer, as the router measured it
    cost_usd: float  # every attempt's generation and verifier cost
    counterfactual_usd: float  # had the request gone straight to the top tier
    attempts: tuple[AttemptEntry, ...] = field(default_factory=tuple)
    task: str | None = None  # the request's task (router.tasks); None in rows written before tasks existed
    task_why: str | None = None  # why it was given that task
    user: str | None = None  # OpenAI's `user` request field: the client's own end-user id, unchecked
    team: str | None = None  # the key's team at admission (router.control); its spend is the team's
    deployment: str | None = None  # which deployment of the answering tier answered; None: a local tier
    # the API surface it came through: "chat.completions", "completions", "responses", "messages";
    # None in rows written before surfaces were recorded, and for shadow generations
    surface: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(a.prompt_tokens for a in self.attempts)

    @property
    def completion_tokens(self) -> int:
        return sum(a.completion_tokens for a in self.attempts)

    @property
    def verifier_cost_usd(self) -> float:
        return sum(a.verifier_cost_usd for a in self.attempts)

    @classmethod
    def from_result(
        cls,
        request_id: str,
        key_id: str,
        result: CascadeResult,
        *,
        latency_s: float,
        ts: float | None = None,
        user: str | None = None,
        team: str | None = None,
    ) -> LedgerEntry:
        return cls(
            request_id=request_id,
            ts=time.time() if ts is None else ts,
            key_id=key_id,
            model=result.model,
            tier=result.final.tier,
            escalated=result.escalated,
            unverified=result.unverified,
            latency_ms=latency_s * 1000,
            cost_usd=result.cost_usd,
            counterfactual_usd=result.counterfactual_usd,
            attempts=tuple(AttemptEntry.from_attempt(i, a) for i, a in enumerate(result.attempts)),
            task=result.task.task if result.task else None,
            task_why=result.task.why if result.task else None,
            user=user,
            team=team,
            deployment=result.final.generation.deployment if result.final.generation else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PendingEntry:
    """A request admitted and not yet settled, written ahead of its answer. `reserved_usd` is the
    most it can cost (its budget reservation): what it counts for until its entry replaces it."""

    request_id: str
    ts: float  # unix seconds (UTC) at admission
    key_id: str
    model: str
    reserved_usd: float
    team: str | None = None  # the key's team: the team's budget holds this reservation too
    user: str | None = None  # OpenAI's `user` field: so does that end user's, within the team


@dataclass(frozen=True)
class ShadowPair:
    """An accepted answer and a larger tier's answer to the same request, compared (see the
    `shadow_pairs` table in `router.ledger.schema`, column for column)."""

    request_id: str
    shadow_request_id: str
    ts: float
    tier: str
    target: str
    task: str | None
    score: float | None
    threshold: float
    scores: dict[str, float]
    agree: bool
    rule: str
    detail: str
    answer_extracted: str | None
    shadow_extracted: str | None
    prompt_sha256: str
    answer_sha256: str
    shadow_sha256: str
    shadow_cost_usd: float
    prompt_json: str | None = None
    answer_text: str | None = None
    shadow_text: str | None = None


@dataclass(frozen=True)
class Feedback:
    """One label posted for a request, by the key that made it or by an admin reviewer (see the
    `feedback` table in `router.ledger.schema`); what a label means, and whose counts for what,
    is `router.quality.feedback`'s business."""

    feedback_id: str
    request_id: str
    ts: float  # unix seconds (UTC) when it was received
    key_id: str  # the name of the key that posted it, never the key
    score: float  # 0 (wrong) to 1 (right); a boolean label is 0 or 1
    label: str | None = None
    comment: str | None = None
    role: str | None = None  # 'admin' or 'client', the giver's standing when it posted; None: not recorded
    team: str | None = None  # the giver's team when it posted


@dataclass(frozen=True)
class LabelCount:
    """A request's labels before one more was written: all of them, and the giver's own (what the
    per-giver cap counts)."""

    request: int
    giver: int


@dataclass(frozen=True)
class CacheRow:
    """One stored answer of the response cache (`router.cache`), as its `cache_entries` row holds
    it (see that table in `router.ledger.schema`, column for column). The store only keeps it:
    what `body` holds is checked by the cache on every read."""

    cache_key: str
    scope: str
    policy: str
    shape: str
    tier: str
    request_id: str
    created: float
    expires_at: float
    size: int
    body: str
    digest: str


class RejectedEntry(Exception):
    """The store refuses this row's values for good (a NUL in PostgreSQL text, a number past its
    column, a constraint): writing it again would fail again, so it is never kept for a retry, where
    it would stand before every later write and none could be written (found by the outside review)."""


class DuplicateEntry(Exception):
    """The store already holds a row with this request id: writing it again would fail again
    (SQLite's own `sqlite3.IntegrityError` says the same for the SQLite store)."""


class LedgerStore(Protocol):
    """Storage for ledger entries. Methods are synchronous and called from one thread only."""

    def open(self) -> None:
        """Connect and create the schema if needed."""

    def begin(self, pending: PendingEntry) -> None:
        """Store the pending row of an admitted request."""

    def write(self, entry: LedgerEntry) -> None:
        """Store the entry and its attempts, and drop its pending row, atomically: all or nothing."""

    def drop(self, request_id: str) -> None:
        """Drop the pending row of a request that ended without an entry and cost nothing."""

    def spend_by_key(self, since: float) -> dict[str, float]:
        """USD per limit subject (a key's name; the SQLite store also 'team:T' and 'user:T:U', see
        `router.admission.quota.Quota.subject`) at or after `since` (unix seconds): settled requests
        at their cost, pending ones at their reservation."""

    def pending(self) -> Iterator[PendingEntry]:
        """The pending rows, oldest first: requests admitted and never settled."""

    def entries(self, since: float | None = None, until: float | None = None) -> Iterator[LedgerEntry]:
        """Entries with since <= ts < until, oldest first, each with its attempts."""

    def write_pair(self, pair: ShadowPair, entry: LedgerEntry | None = None) -> None:
        """Store one shadow pair (a second write for the same request replaces it); with `entry`
        (the shadow generation's own request row), both in one transaction."""

    def pairs(self, since: float | None = None, until: float | None = None) -> Iterator[ShadowPair]:
        """Shadow pairs with since <= ts < until, oldest first."""

    def entry(self, request_id: str) -> LedgerEntry | None:
        """The settled request with this id and its attempts; None when there is none."""

    def write_feedback(self, feedback: Feedback, limit: int | None = None) -> LabelCount:
        """Store one label (its request's row must exist) unless its giver (`key_id`) has given
        the request `limit` labels already; return how many it had before, all and the giver's,
        counted in the insert's own transaction."""

    def feedback(
        self, since: float | None = None, until: float | None = None, request_id: str | None = None
    ) -> Iterator[Feedback]:
        """Labels with since <= ts < until (of one request, given `request_id`), oldest first."""

    def cache_get(self, cache_key: str, scope: str, now: float) -> CacheRow | None:
        """The unexpired cached answer stored under this key for this scope, if any."""

    def cache_put(self, row: CacheRow, max_entries: int | None, max_per_scope: int | None = None) -> None:
        """Store the answer (replacing one under the same key) and drop expired entries; with
        `max_per_scope`, also evict the oldest of the row's own scope past it, and with
        `max_entries` the oldest of all past it; in one transaction."""

    def cache_drop(self, cache_key: str) -> None:
        """Forget one entry (it failed its checks on reading)."""

    def close(self) -> None:
        """Commit nothing further and release the connection."""
