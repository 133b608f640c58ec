"""`tierroute eval import --ledger`: a ledger's shadow pairs as import records, graded by the labels
clients posted where there are any, and by shadow agreement where there are none.

A shadow pair (`router.quality.shadow`) holds the request, the answer a tier accepted and a
larger tier's answer to the same request. With `ledger.store_prompts` on it keeps their text, and
then it can become an item of an eval run (`evals.importer`): two tiers' answers, each labelled.

How the two answers are labelled:

- **feedback**, where the client labelled the request (POST /v1/feedback; the verdict is the
  latest label, `router.quality.feedback`): the accepted answer is right or wrong as the label
  says. The larger tier's answer is read through the agreement rule the pair was judged by: right
  when it agreed with a right answer, wrong when it agreed with a wrong one or disagreed with a
  right one. Where it disagreed with an answer labelled wrong nothing says which is right, and it
  is taken as right, the proxy's assumption (the record says so: `top_by_proxy`, and the run's
  manifest names the proxy tier);
- **shadow agreement**, where no label exists, as before: the larger tier right, the accepted
  answer right when the two agreed. A proxy, flagged in the manifest (`proxy_reference_tier`).

So `eval calibrate --write` recalibrates from production labels wherever clients send them.
Labelled requests without a stored pair (no shadow sampled, or `store_prompts` off) cannot become
items, since the ledger keeps no prompt for them; they are counted, and `tierroute report
quality` reads their labels.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.importer import FEEDBACK, SHADOW_AGREEMENT, ImportFormatError, Record, parse_line
from router.config import LedgerSettings
from router.errors import ConfigError
from router.ledger.entries import AttemptEntry, ShadowPair
from router.quality.feedback import Verdict, verdicts


@dataclass
class LedgerRead:
    records: list[Record]
    pairs: int  # shadow pairs in the ledger (in the time window)
    without_text: int  # kept hashes and extracted answers only (ledger.store_prompts off)
    other_tiers: int  # pairs of another (tier, target) than the one imported
    labelled: int = 0  # records graded by their clients' labels
    labelled_elsewhere: int = 0  # labelled requests that are no record (no stored pair of these tiers)


def read_ledger(
    location: str | Path,
    *,
    tiers: Sequence[str] | None = None,
    since: float | None = None,
    settings: LedgerSettings | None = None,
) -> LedgerRead:
    """The ledger's shadow pairs (SQLite file or `postgresql://` URL, read through the same store
    the service writes with; see router/ledger/store.py) as records, labelled as the module says.
    Only pairs that kept their prompt and both answers (`ledger.store_prompts`) can become items;
    one (tier, target) pair of tiers per run: `tiers` when given, else the most frequent.
    `settings` gives a PostgreSQL ledger its password variable."""
    from router.ledger.stores import open_store

    if tiers is not None and len(tiers) != 2:
        raise ConfigError("--tiers for shadow pairs names two tiers: the accepting tier, then the shadow target")
    store = open_store(location, read_only=True, settings=settings)
    store.open()  # ConfigError naming the ledger when it is not there or cannot be reached
    try:
        pairs = list(store.pairs(since))
        labels = verdicts(store.feedback(since))  # a label comes after its request
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
    return LedgerRead(
        records, len(pairs), len(chosen) - len(usable), len(pairs) - len(chosen), labelled, len(labels) - labelled
    )


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
