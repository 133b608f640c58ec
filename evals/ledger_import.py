"""`tierroute eval import --ledger`: a ledger's shadow pairs as import records, graded by the labels
of the givers it trusts where there are any, and by shadow agreement where there are none.

A shadow pair (`router.quality.shadow`) holds the request, the answer a tier accepted and a
larger tier's answer to the same request. With `ledger.store_prompts` on it keeps their text, and
then it can become an item of an eval run (`evals.importer`): two tiers' answers, each labelled.

Whose labels: a threshold calibrated here applies to every tenant, and any client key may label
its own requests (POST /v1/feedback). One key labelling its answers "right" moved a threshold
from 1 to 0 for everyone. So an import reads only labels it trusts (`Givers`): by default an
admin reviewer's (a label posted by a key with the admin role, as the ledger recorded when it was
posted), and a client's only where the operator names its key or team (`--labels-from key:NAME`,
`team:NAME`, or `all` for a service whose one client is the operator's own application). A
request's verdict among those is `router.quality.feedback`'s (a reviewer's latest over any
client's). The labels left out are counted per giver, and the run's manifest says whose labels
graded how many items and whose were left out (`provenance`).

How the two answers are labelled:

- **feedback**, where a trusted giver labelled the request: the accepted answer is right or wrong
  as the label says. The larger tier's answer is read through the agreement rule the pair was
  judged by: right when it agreed with a right answer, wrong when it agreed with a wrong one or
  disagreed with a right one. Where it disagreed with an answer labelled wrong nothing says which
  is right, and it is taken as right, the proxy's assumption (the record says so: `top_by_proxy`,
  and the run's manifest names the proxy tier);
- **shadow agreement**, where no trusted label exists, as before: the larger tier right, the
  accepted answer right when the two agreed. A proxy, flagged in the manifest
  (`proxy_reference_tier`).

So `eval calibrate --write` recalibrates from production labels wherever reviewers (or the
clients named) send them. Labelled requests without a stored pair (no shadow sampled, or
`store_prompts` off) cannot become items, since the ledger keeps no prompt for them; they are
counted, and `tierroute report quality` reads their labels.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.importer import FEEDBACK, SHADOW_AGREEMENT, ImportFormatError, Record, parse_line
from router.config import LedgerSettings
from router.errors import ConfigError
from router.ledger.entries import AttemptEntry, Feedback, ShadowPair
from router.quality.feedback import ADMIN, CLIENT, Verdict, reviewed, verdicts

ALL = "all"  # --labels-from all: every key's labels, as before givers were told apart


@dataclass(frozen=True)
class Givers:
    """Whose labels grade an import: admin reviewers' always, and the client keys and teams the
    operator names (or every key's, `everyone`)."""

    keys: frozenset[str] = frozenset()
    teams: frozenset[str] = frozenset()
    everyone: bool = False

    @classmethod
    def parse(cls, named: Sequence[str]) -> Givers:
        """From `--labels-from` values: 'key:NAME', 'team:NAME' or 'all'."""
        keys: set[str] = set()
        teams: set[str] = set()
        everyone = False
        for value in named:
            kind, sep, name = value.partition(":")
            if value == ALL:
                everyone = True
            elif sep and name and kind == "key":
                keys.add(name)
            elif sep and name and kind == "team":
                teams.add(name)
            else:
                raise ConfigError(
                    f"--labels-from {value!r}: name a client key (key:NAME), a team (team:NAME), or 'all'; "
                    "admin reviewers' labels are always read"
                )
        return cls(frozenset(keys), frozenset(teams), everyone)

    def trusts(self, label: Feedback) -> bool:
        if reviewed(label) or self.everyone or label.key_id in self.keys:
            return True
        return label.team is not None and label.team in self.teams

    @property
    def named(self) -> list[str]:
        """The policy in `--labels-from`'s words, as the manifest records it: ['admin', ...]."""
        if self.everyone:
            return [ADMIN, ALL]
        return [ADMIN, *(f"key:{k}" for k in sorted(self.keys)), *(f"team:{t}" for t in sorted(self.teams))]


@dataclass
class LedgerRead:
    records: list[Record]
    pairs: int  # shadow pairs in the ledger (in the time window)
    without_text: int  # kept hashes and extracted answers only (ledger.store_prompts off)
    other_tiers: int  # pairs of another (tier, target) than the one imported
    labelled: int = 0  # records graded by trusted labels
    labelled_elsewhere: int = 0  # requests with trusted labels that are no record (no stored pair of these tiers)
    givers: Givers = field(default_factory=Givers)
    used: dict[str, int] = field(default_factory=dict)  # per giver (key name), the records its label decided
    left_out: dict[str, int] = field(default_factory=dict)  # per untrusted giver, the records it labelled
    roles: dict[str, str] = field(default_factory=dict)  # each of those givers' role: admin or client

    def provenance(self) -> dict[str, Any]:
        """Whose labels graded the records, for the run's manifest (`import.labels`)."""
        return {"from": self.givers.named, "used": self.used, "left_out": self.left_out, "roles": self.roles}


def read_ledger(
    location: str | Path,
    *,
    tiers: Sequence[str] | None = None,
    since: float | None = None,
    settings: LedgerSettings | None = None,
    givers: Givers | None = None,
) -> LedgerRead:
    """The ledger's shadow pairs (SQLite file or `postgresql://` URL, read through the same store
    the service writes with; see router/ledger/store.py) as records, labelled as the module says
    by the labels of `givers` (default: admin reviewers only).
    Only pairs that kept their prompt and both answers (`ledger.store_prompts`) can become items;
    one (tier, target) pair of tiers per run: `tiers` when given, else the most frequent.
    `settings` gives a PostgreSQL ledger its password variable."""
    from router.ledger.stores import open_store

    trusted = givers if givers is not None else Givers()
    if tiers is not None and len(tiers) != 2:
        raise ConfigError("--tiers for shadow pairs names two tiers: the accepting tier, then the shadow target")
    store = open_store(location, read_only=True, settings=settings)
    store.open()  # ConfigError naming the ledger when it is not there or cannot be reached
    try:
        pairs = list(store.pairs(since))
        given = list(store.feedback(since))  # a label comes after its request
        labels = verdicts(fb for fb in given if trusted.trusts(fb))
        combos = Counter((p.tier, p.target) for p in pairs)
        pair = tuple(tiers) if tiers else (combos.most_common(1)[0][0] if combos else ("", ""))
        chosen = [p for p in pairs if (p.tier, p.target) == pair]
        usable = [p for p in chosen if None not in (p.prompt_json, p.answer_text, p.shadow_text)]
        wanted = {rid for p in usable for rid in (p.request_id, p.shadow_request_id)}
        # a pair is written once both requests settled: their rows are no older than the oldest pair
        attempts: dict[str, tuple[AttemptEntry, ...]] = {}
        if wanted:
            for entry in store.entries(since=min(p.ts for p in usable) - _ENTRY_SLACK_S):
                if entry.request_id in wanted:
                    attempts[entry.request_id] = entry.attempts
    finally:
        store.close()
    where = str(location)
    records = [_pair_record(p, n, where, attempts, labels.get(p.request_id)) for n, p in enumerate(usable, 1)]
    labelled = sum(1 for p in usable if p.request_id in labels)
    read = LedgerRead(
        records,
        len(pairs),
        len(chosen) - len(usable),
        len(pairs) - len(chosen),
        labelled,
        len(labels) - labelled,
        givers=trusted,
    )
    _count_givers(read, usable, labels, given)
    return read


def _count_givers(
    read: LedgerRead, usable: Sequence[ShadowPair], labels: Mapping[str, Verdict], given: Sequence[Feedback]
) -> None:
    """Per giver (key name), the records its label decided, and the records each giver left out labelled."""
    items = {p.request_id for p in usable}
    on_items = [fb for fb in given if fb.request_id in items]
    read.used = dict(sorted(Counter(labels[rid].by for rid in items if rid in labels).items()))
    untrusted = {(fb.request_id, fb.key_id) for fb in on_items if not read.givers.trusts(fb)}
    read.left_out = dict(sorted(Counter(key for _, key in untrusted).items()))
    admins = {fb.key_id for fb in on_items if reviewed(fb)}
    read.roles = {key: ADMIN if key in admins else CLIENT for key in sorted({*read.used, *read.left_out})}


def whose_labels(labels: Mapping[str, Any]) -> str:
    """A manifest's `import.labels` in words, for the import: whose were read, whose graded how
    many items, whose were left out (and how to use them)."""
    said = f"from {', '.join(labels['from'])}{' (the default)' if labels['from'] == [ADMIN] else ''}; "
    said += f"used: {', '.join(f'{k} {n}' for k, n in labels['used'].items()) or 'none'}"
    left = labels["left_out"]
    if left:
        named = " ".join(f"--labels-from key:{k}" for k in left)
        said += f"; left out: {', '.join(f'{k} {n}' for k, n in left.items())} (not trusted; {named} to use them)"
    return said


def grading_said(imported: Mapping[str, Any]) -> str:
    """How an imported run's items were graded, and by whose labels, in words (`eval calibrate`
    says it beside the thresholds it chose on them)."""
    labels = imported.get("labels")
    parts = []
    for kind, n in sorted(imported.get("grading", {}).items()):
        part = f"{n} by {kind.replace('_', ' ')}"
        if kind == FEEDBACK and labels is not None:
            part += f" (labels of {', '.join(f'{k}: {m}' for k, m in labels['used'].items())})"
        parts.append(part)
    said = ", ".join(parts)
    if labels is not None and labels["left_out"]:
        left = ", ".join(f"{k} ({n} items)" for k, n in labels["left_out"].items())
        said += f"; labels left out: {left} (eval import --labels-from reads them)"
    return said


# how much older than its shadow pair a request's row may be: a shadow request can take a tier's
# whole timeout after the answer it shadows was settled and written
_ENTRY_SLACK_S = 3600.0


def _pair_record(
    p: ShadowPair, n: int, where: str, attempts: Mapping[str, tuple[AttemptEntry, ...]], verdict: Verdict | None
) -> Record:
    assert p.prompt_json is not None and p.answer_text is not None and p.shadow_text is not None
    try:
        prompt = json.loads(p.prompt_json)
    except json.JSONDecodeError:
        raise ImportFormatError(f"{where} shadow pair {p.request_id}: prompt_json is not JSON") from None
    line: dict[str, Any] = {
        "id": p.request_id,
        **({"messages": prompt["messages"]} if "messages" in prompt else {"prompt": prompt.get("prompt")}),
        "answers": {
            p.tier: {"text": p.answer_text, **_attempt(attempts.get(p.request_id, ()), p.tier)},
            p.target: {"text": p.shadow_text, **_attempt(attempts.get(p.shadow_request_id, ()), p.target)},
        },
    }
    if p.task is not None:
        line["task"] = p.task
    agree = p.agree or p.answer_text == p.shadow_text
    extra: dict[str, Any]
    if verdict is None:
        line["label"] = {"correct": {p.tier: agree, p.target: True}}
        extra = {"source": SHADOW_AGREEMENT}
    else:
        # the larger tier through the agreement rule; unknown only beside a wrong answer it disagreed with
        by_proxy = not agree and not verdict.right
        top = verdict.right if agree else not verdict.right
        line["label"] = {"correct": {p.tier: verdict.right, p.target: top}}
        extra = {"source": FEEDBACK, "top_by_proxy": by_proxy}
    rec = parse_line(json.dumps(line), n, where=f"{where} shadow pair")
    assert rec.key is not None
    return Record(rec.line, rec.id, rec.messages, rec.task, rec.group, rec.answers, {**rec.key, **extra})


def _attempt(attempts: Sequence[AttemptEntry], tier: str) -> dict[str, Any]:
    """Tokens and time of the tier's (last) attempt at a request, from its ledger row."""
    mine = [a for a in attempts if a.tier == tier]
    if not mine:
        return {"prompt_tokens": 0, "completion_tokens": 0}
    a = max(mine, key=lambda a: a.idx)
    out: dict[str, Any] = {"prompt_tokens": a.prompt_tokens, "completion_tokens": a.completion_tokens}
    if a.finish_reason in ("stop", "length"):
        out["finish_reason"] = a.finish_reason
    if a.latency_ms is not None:
        out["latency_s"] = a.latency_ms / 1000
    if a.busy_ms is not None:
        out["busy_s"] = a.busy_ms / 1000
    return out
