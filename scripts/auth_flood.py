"""What guessed keys cost a valid client: the figures of docs/keys.md.

    PYTHONPATH=. .venv/bin/python scripts/auth_flood.py [--keys 10000] [--json docs/bench/auth-flood.json]

`tierroute serve` (the test model, a SQLite ledger) with `--keys` stored API keys, imported
from the config once, either as the SHA-256 digests `tierroute keys create` writes now or in the
older salted form. One valid client calls `GET /v1/models` (authenticated, no model work) in a
closed loop, first alone for `--seconds`, then while `--attackers` clients send random
`trk-` keys at `--rate` requests per second in all, each a key never sent before (the worst case
for the salted form: every stored hash is compared with it). Per store form and phase: the valid
client's median and p95 latency and how many requests it made, and how many guesses were
answered 401. Run from the repository root; prints a table and writes the raw figures as JSON
with the machine's load average beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from router.admission.auth import hash_key, new_key  # noqa: E402 - after the path is set
from tests.support.config import smol_config  # noqa: E402
from tests.support.servers import serve_process  # noqa: E402


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def keys_block(n: int, valid: str, salted: bool) -> str:
    def digest(key: str) -> str:
        return hash_key(key, secrets.token_hex(16)) if salted else hash_key(key)

    lines = [f'[[server.api_keys]]\nname = "k{i}"\nhash = "{digest(new_key())}"\n' for i in range(n - 1)]
    lines.append(f'[[server.api_keys]]\nname = "valid"\nhash = "{digest(valid)}"\n')
    return "".join(lines)


async def valid_loop(url: str, key: str, until: float) -> list[float]:
    took: list[float] = []
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        while time.monotonic() < until:
            started = time.perf_counter()
            response = await client.get("/v1/models")
            took.append(time.perf_counter() - started)
            response.raise_for_status()
            await asyncio.sleep(0.02)
    return took


async def attacker(url: str, interval: float, until: float, refused: list[int]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        next_at = time.monotonic()
        while time.monotonic() < until:
            response = await client.get("/v1/models", headers={"Authorization": f"Bearer {new_key()}"})
            refused.append(response.status_code)
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def phase(url: str, key: str, seconds: float, attackers: int, rate: float) -> dict[str, object]:
    until = time.monotonic() + seconds
    refused: list[int] = []
    interval = attackers / rate if attackers else 0.0
    tasks = [attacker(url, interval, until, refused) for _ in range(attackers)]
    took = (await asyncio.gather(valid_loop(url, key, until), *tasks))[0]
    assert took is not None
    return {
        "attackers": attackers,
        "valid_requests": len(took),
        "valid_p50_ms": round(statistics.median(took) * 1000, 2),
        "valid_p95_ms": round(_q(took, 0.95) * 1000, 2),
        "guesses": len(refused),
        "guesses_401": sum(1 for s in refused if s == 401),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def run(n: int, salted: bool, seconds: float, attackers: int, rate: float) -> list[dict[str, object]]:
    valid = new_key()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = smol_config(Path(tmp), large="none", server=keys_block(n, valid, salted))
        with serve_process(cfg, log_path=Path(tmp) / "serve.log", log_level="warning") as (_, url, _):
            rows = []
            for flood in (0, attackers):
                row = asyncio.run(phase(url, valid, seconds, flood, rate))
                rows.append({"stored": "salted" if salted else "digest", "keys": n, **row})
            return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--attackers", type=int, default=16)
    parser.add_argument("--rate", type=float, default=50.0, help="guesses per second, all attackers together")
    parser.add_argument("--forms", default="digest,salted")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    for form in args.forms.split(","):
        rows += run(args.keys, form == "salted", args.seconds, args.attackers, args.rate)
    print(f"{'stored':8} {'keys':>6} {'attackers':>9} {'valid p50 ms':>12} {'p95 ms':>8} {'requests':>8} {'401s':>6}")
    for r in rows:
        print(
            f"{r['stored']!s:8} {r['keys']!s:>6} {r['attackers']!s:>9} {r['valid_p50_ms']!s:>12} "
            f"{r['valid_p95_ms']!s:>8} {r['valid_requests']!s:>8} {r['guesses_401']!s:>6}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
