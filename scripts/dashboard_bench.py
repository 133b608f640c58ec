"""The dashboard on a big ledger: build a ledger of N requests, serve it, time each page's endpoint.

    python scripts/dashboard_bench.py build --requests 1000000 --ledger /tmp/dash-1m.sqlite3
    python scripts/dashboard_bench.py time --ledger /tmp/dash-1m.sqlite3 --out docs/bench/dashboard

`build` writes synthetic traffic through the ledger's own row mapping (`router.ledger.rows`) and
its own schema, so the rows are what `tierroute serve` writes: two tiers, five tasks, 40 keys in
five teams, a third of the requests escalated, 2% shadow-sampled with a pair, 1% labelled, spread
evenly over `--days` days ending now. A `postgresql://` URL fills a PostgreSQL ledger instead.

`time` starts `tierroute serve` on that ledger (tiers behind an unreachable loopback port: no
request is ever sent to them) with a report key, and asks each page's endpoint for each window
`--repeat` times, in order (a key named after the run: config keys are imported into the ledger's
database once, so a second run's key must be new), printing and writing the median and worst wall time of each. Run it
under `nice -n -10` on a shared machine, as the committed results were.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from router.admission.auth import hash_key, new_key
from router.ledger import rows
from router.ledger.entries import AttemptEntry, Feedback, LedgerEntry, ShadowPair
from router.ledger.stores import open_store

TASKS = ("maths", "code", "choice", "structured", "open_ended")
PAGES = ("overview", "quality", "latency", "keys", "evals")
WINDOWS = ("24h", "7d", "30d")


def _attempt(idx: int, tier: str, decision: str, rng: random.Random, threshold: float) -> AttemptEntry:
    p, c = rng.randint(20, 400), rng.randint(5, 300)
    small = tier == "small"
    busy = rng.uniform(50, 900) if small else None
    cost = (busy or 0) / 3.6e6 * 0.10 if small else (p * 0.6 + c * 2.4) / 1e6
    return AttemptEntry(
        idx=idx,
        tier=tier,
        decision=decision,
        reason="score below threshold" if decision == "rejected" else "last tier: accepted" if not small else "ok",
        error=None,
        score=rng.random(),
        threshold=threshold,
        scores={"confidence": rng.random()},
        prompt_tokens=p,
        completion_tokens=c,
        finish_reason="stop",
        latency_ms=rng.lognormvariate(5.5 if small else 6.5, 0.6),
        busy_ms=busy,
        verify_ms=rng.uniform(0.1, 3),
        cost_usd=cost,
        verifier_cost_usd=0.0,
        verifier_tokens=0,
    )


def synthetic(i: int, ts: float, rng: random.Random) -> tuple[LedgerEntry, ShadowPair | None, Feedback | None]:
    """One request of the synthetic traffic, and its shadow pair and label when it has them."""
    task = TASKS[i % len(TASKS)]
    key = f"key{i % 40:02d}"
    team = f"team{i % 5}"
    escalated = rng.random() < 0.33
    first = _attempt(0, "small", "rejected" if escalated else "accepted", rng, 0.9)
    atts = (first, _attempt(1, "large", "accepted", rng, 0.5)) if escalated else (first,)
    top = atts[-1] if escalated else _attempt(1, "large", "accepted", rng, 0.5)
    entry = LedgerEntry(
        request_id=f"r{i:08d}",
        ts=ts,
        key_id=key,
        model="auto",
        tier=atts[-1].tier,
        escalated=escalated,
        unverified=False,
        latency_ms=sum(a.latency_ms or 0 for a in atts) + 2,
        cost_usd=sum(a.cost_usd + a.verifier_cost_usd for a in atts),
        counterfactual_usd=top.cost_usd,
        attempts=atts,
        task=task,
        task_why="rule",
        team=team,
        surface="chat.completions",
    )
    pair = None
    if not escalated and rng.random() < 0.02:
        pair = ShadowPair(
            request_id=entry.request_id,
            shadow_request_id=f"s{i:08d}",
            ts=ts + 1,
            tier="small",
            target="large",
            task=task,
            score=first.score,
            threshold=0.9,
            scores={},
            agree=rng.random() < 0.8,
            rule="exact",
            detail="",
            answer_extracted=None,
            shadow_extracted=None,
            prompt_sha256="0" * 64,
            answer_sha256="1" * 64,
            shadow_sha256="2" * 64,
            shadow_cost_usd=top.cost_usd,
        )
    label = None
    if rng.random() < 0.01:
        label = Feedback(f"f{i:08d}", entry.request_id, ts + 5, key, float(rng.random() < 0.85), role="client")
    return entry, pair, label


def cmd_build(args: argparse.Namespace) -> int:
    location = args.ledger
    if "://" not in location and Path(location).exists():
        print(f"error: {location} exists; remove it first", file=sys.stderr)
        return 1
    store = open_store(location)
    store.open()
    store.close()  # the schema, made by the store itself
    rng = random.Random(args.seed)
    now = time.time()
    span = args.days * 86400.0
    started = time.monotonic()
    if "://" in location:
        _build_postgres(location, args.requests, now, span, rng)
    else:
        _build_sqlite(location, args.requests, now, span, rng)
    print(f"built {args.requests} requests in {time.monotonic() - started:.0f} s: {location}")
    return 0


def _batches(n: int, now: float, span: float, rng: random.Random, size: int = 20000) -> Any:
    batch: tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]
    batch = ([], [], [], [])
    for i in range(n):
        ts = now - span + span * (i + 0.5) / n
        entry, pair, label = synthetic(i, ts, rng)
        batch[0].append(rows.request_values(entry))
        batch[1].extend(rows.attempt_values(entry))
        if pair is not None:
            batch[2].append(rows.pair_values(pair))
        if label is not None:
            batch[3].append(rows.feedback_values(label))
        if len(batch[0]) >= size or i == n - 1:
            yield batch
            batch = ([], [], [], [])
            print(f"  {i + 1} / {n}", file=sys.stderr, flush=True)


def _build_sqlite(path: str, n: int, now: float, span: float, rng: random.Random) -> None:
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    for requests, attempts, pairs, labels in _batches(n, now, span, rng):
        conn.execute("BEGIN")
        conn.executemany(rows.insert("requests", "sqlite"), requests)
        conn.executemany(rows.insert("attempts", "sqlite"), attempts)
        conn.executemany(rows.insert("shadow_pairs", "sqlite"), pairs)
        conn.executemany(rows.insert("feedback", "sqlite"), labels)
        conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def _build_postgres(url: str, n: int, now: float, span: float, rng: random.Random) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=False) as conn:
        for requests, attempts, pairs, labels in _batches(n, now, span, rng):
            with conn.cursor() as cur:
                cur.executemany(rows.insert("requests", "postgres"), requests)
                cur.executemany(rows.insert("attempts", "postgres"), attempts)
                cur.executemany(rows.insert("shadow_pairs", "postgres"), pairs)
                cur.executemany(rows.insert("feedback", "postgres"), labels)
            conn.commit()
        conn.autocommit = True
        conn.execute("ANALYZE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(directory: Path, ledger: str, key: str) -> Path:
    where = f'url = "{ledger}"' if "://" in ledger else f'path = "{ledger}"'
    tiers = "".join(
        f"""
[[tiers]]
name = "{name}"
backend = "openai"
[tiers.openai]
base_url = "http://127.0.0.1:9/v1"
model = "none"
[tiers.price]
usd_per_1m_input_tokens = {price_in}
usd_per_1m_output_tokens = {price_out}
"""
        for name, price_in, price_out in (("small", 0.1, 0.4), ("large", 0.6, 2.4))
    )
    text = f"""[server]
[[server.api_keys]]
name = "viewer-{key[-8:].replace("_", "-")}"
hash = "{hash_key(key)}"
roles = ["report"]
[ledger]
{where}
[dashboard]
eval_report = "{Path("docs/eval").resolve()}"
{tiers}"""
    path = directory / "bench.toml"
    path.write_text(text)
    return path


def cmd_time(args: argparse.Namespace) -> int:
    key = new_key()
    results: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "niced": os.nice(0),
        "ledger": args.ledger,
        "repeat": args.repeat,
        "pages": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(Path(tmp), args.ledger, key)
        port = _free_port()
        tierroute = str(Path(sys.executable).with_name("tierroute"))
        log = open(Path(tmp) / "serve.log", "wb")  # noqa: SIM115 - closed below, after the process
        proc = subprocess.Popen(
            [tierroute, "--config", str(cfg), "serve", "--port", str(port), "--log-level", "warning"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ},
        )
        base = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(base_url=base, timeout=600, headers={"Authorization": f"Bearer {key}"}) as client:
                for _ in range(600):
                    try:
                        if client.get("/readyz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    time.sleep(0.5)
                for page in PAGES:
                    for window in args.windows.split(",") if page != "evals" else ("-",):
                        times = []
                        for _ in range(args.repeat):
                            started = time.perf_counter()
                            r = client.get(f"/ui/api/{page}", params={} if window == "-" else {"since": window})
                            times.append(time.perf_counter() - started)
                            r.raise_for_status()
                        body = r.json()
                        shown = {
                            "median_s": round(statistics.median(times), 3),
                            "max_s": round(max(times), 3),
                            "requests_in_window": body.get("window", {}).get("requests"),
                            "under_1s": max(times) < 1.0,
                        }
                        results["pages"][f"{page} {window}"] = shown
                        print(f"{page:9} {window:4} {json.dumps(shown)}", flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            log.close()
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write a synthetic ledger")
    b.add_argument("--requests", type=int, default=1_000_000)
    b.add_argument("--days", type=float, default=30.0)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--ledger", required=True, help="a new SQLite file, or a postgresql:// URL of an empty database")
    b.set_defaults(run=cmd_build)
    t = sub.add_parser("time", help="serve a ledger and time each page's endpoint")
    t.add_argument("--ledger", required=True)
    t.add_argument("--repeat", type=int, default=3)
    t.add_argument("--windows", default=",".join(WINDOWS), help="comma-separated `since` values to time")
    t.add_argument("--out", default=None, help="write the results here (.json)")
    t.set_defaults(run=cmd_time)
    args = parser.parse_args()
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
