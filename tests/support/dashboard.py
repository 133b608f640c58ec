"""A seeded ledger for the dashboard's tests: requests, shadow pairs and labels over three UTC
days, written through the SQLite store itself, with names that try markup in every field a
tenant controls (key and team names are limited to letters, digits and _.@-, so the markup
rides on what is free text: the model asked for, the task, a label's comment, a tier's name
in a shadow pair's target)."""

from __future__ import annotations

import time
from pathlib import Path

from router.ledger.entries import Feedback, LedgerEntry, ShadowPair
from router.ledger.store import SQLiteStore
from tests.support.ledger import attempt

XSS = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'
TASKS = ("maths", "code", XSS)


def seed(path: Path, *, now: float | None = None, requests: int = 60) -> dict[str, int]:
    """`requests` requests over the last three days: every third escalated, tasks in turn by twos
    (one a script tag), keys 'ana' and 'bob' (team 'blue'); a shadow pair for every fifth accepted one
    and a label for every seventh request. Returns the counts written."""
    now = time.time() if now is None else now
    store = SQLiteStore(path)
    store.open()
    pairs = labels = 0
    try:
        for i in range(requests):
            ts = now - 3 * 86400 + (3 * 86400 - 60) * i / requests
            escalated = i % 3 == 0
            atts = (
                (attempt(0, "small", "rejected", 1.25e-7 * (i + 1)), attempt(1, "large", "accepted", 3.3e-5))
                if escalated
                else (attempt(0, "small", "accepted", 1.25e-7 * (i + 1)),)
            )
            key = "ana" if i % 2 else "bob"
            entry = LedgerEntry(
                request_id=f"req-{i}",
                ts=ts,
                key_id=key,
                model="auto" if i % 4 else XSS,
                tier=atts[-1].tier,
                escalated=escalated,
                unverified=False,
                latency_ms=20.0 + i,
                cost_usd=sum(a.cost_usd + a.verifier_cost_usd for a in atts),
                counterfactual_usd=3.3e-5 + 1e-7 * i,
                attempts=atts,
                task=TASKS[(i // 2) % len(TASKS)],
                team="blue" if key == "bob" else None,
            )
            store.write(entry)
            if not escalated and i % 5 == 1:
                store.write_pair(
                    ShadowPair(
                        request_id=entry.request_id,
                        shadow_request_id=f"shadow-{i}",
                        ts=ts + 1,
                        tier="small",
                        target="large",
                        task=entry.task,
                        score=0.5,
                        threshold=0.4,
                        scores={},
                        agree=i % 10 != 1,
                        rule="exact",
                        detail=XSS,
                        answer_extracted=XSS,
                        shadow_extracted=None,
                        prompt_sha256="0" * 64,
                        answer_sha256="1" * 64,
                        shadow_sha256="2" * 64,
                        shadow_cost_usd=3.3e-5,
                    )
                )
                pairs += 1
            if i % 7 == 0:
                store.write_feedback(
                    Feedback(f"fb-{i}", entry.request_id, ts + 2, key, float(i % 14 == 0), label=XSS, comment=XSS)
                )
                labels += 1
    finally:
        store.close()
    return {"requests": requests, "pairs": pairs, "labels": labels}
