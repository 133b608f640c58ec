"""Gateways side by side against one instant upstream: the direct call, tierroute, LiteLLM's proxy.

    scripts/gateway_bench.py --rates 50,200,500,1000 --seconds 10 --json docs/bench/gateway/run.json \
        [--litellm /tmp/litellm-venv/bin/litellm] [--ledger postgresql://...] [--profile DIR]

One run starts the instant upstream (`router.bench.instant_upstream`), then per server in turn
(the direct call, `tierroute serve` with one `openai` tier and an API key, LiteLLM's proxy with no
database when `--litellm` names its executable) drives every rate open-loop (even gaps) with the
lean client (`router.bench.raw_load`), each level after a short warm-up, and writes the table:
latency p50/p99, and for the gateways what they add over the direct call at the same rate, with
every reply counted (200, 503 with Retry-After, other statuses, lost: timeouts and closed
connections). For tierroute the ledger is then read back: every 200 must have its row, at its
exact cost. `--profile DIR` runs tierroute under py-spy at the given rates instead of timing it.

Every process it starts (upstream, servers, the client) can run under `nice -n -10` when the
script itself does (a shared machine: say what else ran in the committed result).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router.admission.auth import hash_key  # noqa: E402
from router.bench import raw_load  # noqa: E402
from router.bench.stats import percentile  # noqa: E402

KEY = "tr-bench-key-0123456789"
BODY = json.dumps(
    {"model": "gw", "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 16, "temperature": 0}
).encode()
PRICE_IN, PRICE_OUT = 0.60, 2.40  # per 1M tokens; the upstream answers 12 in, 2 out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float = 60.0, headers: dict[str, str] | None = None) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=2):
                return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {timeout_s} s")


def tierroute_config(workdir: Path, upstream: str, ledger: str, extra: str = "") -> Path:
    location = f'url = "{ledger}"' if ledger.startswith("postgresql") else f'path = "{ledger}"'
    text = f"""
[server]
api_keys = [{{ name = "bench", hash = "{hash_key(KEY)}" }}]
{extra}
[ledger]
{location}

[[tiers]]
name = "gw"
backend = "openai"
max_tokens = 64
timeout_s = 30

[tiers.openai]
base_url = "{upstream}"
model = "instant"

[tiers.price]
usd_per_1m_input_tokens = {PRICE_IN}
usd_per_1m_output_tokens = {PRICE_OUT}
stands_for = "an instant upstream (bench)"
"""
    path = workdir / "tierroute.toml"
    path.write_text(text)
    return path


def litellm_config(workdir: Path, upstream: str) -> Path:
    path = workdir / "litellm.yaml"
    path.write_text(
        "model_list:\n  - model_name: gw\n    litellm_params:\n      model: openai/instant\n"
        f"      api_base: {upstream}\n      api_key: not-needed\n"
        "litellm_settings:\n  drop_params: true\n  set_verbose: false\n"
        "general_settings:\n  master_key: sk-" + KEY + "\n"
    )
    return path


def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its threads (its children not counted)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def level(port: int, path: str, key: str | None, rate: float, seconds: float) -> dict[str, Any]:
    conns = raw_load.Connections("127.0.0.1", port)
    data = raw_load.request_bytes("127.0.0.1", port, path, BODY, key)
    await raw_load.warm(conns, data, 64)
    n = int(rate * seconds)
    schedule = [i / rate for i in range(n)]
    replies, wall = await raw_load.open_loop(conns, data, schedule)
    conns.close()
    ok = [r.latency_s for r in replies if r.status == 200]
    shed = [r for r in replies if r.status == 503]
    return {
        "rate": rate,
        "sent": n,
        "wall_s": round(wall, 3),
        "ok": len(ok),
        "shed_503": len(shed),
        "shed_with_retry_after": sum(1 for r in shed if r.retry_after),
        "shed_ms_p50": _ms(percentile([r.latency_s for r in shed], 50)) if shed else None,
        "shed_ms_max": _ms(max(r.latency_s for r in shed)) if shed else None,
        "other_status": sorted({r.status for r in replies if r.status not in (0, 200, 503)}),
        "other": sum(1 for r in replies if r.status not in (0, 200, 503)),
        "lost_timeout": sum(1 for r in replies if r.error == "timeout"),
        "lost_connection": sum(1 for r in replies if r.error == "connection"),
        "p50_ms": _ms(percentile(ok, 50)) if ok else None,
        "p90_ms": _ms(percentile(ok, 90)) if ok else None,
        "p99_ms": _ms(percentile(ok, 99)) if ok else None,
        "max_ms": _ms(max(ok)) if ok else None,
        "connections": conns.opened,
    }


def _ms(s: float) -> float:
    return round(1000 * s, 3)


def drive(
    port: int, path: str, key: str | None, rates: list[float], seconds: float, pid: int | None
) -> list[dict[str, Any]]:
    out = []
    for rate in rates:
        before = cpu_s(pid) if pid else 0.0
        row = _run(level(port, path, key, rate, seconds))
        if pid:
            row["server_cpu_ms_per_request"] = round(1000 * (cpu_s(pid) - before) / max(1, row["sent"] + 64), 3)
        print(json.dumps(row), flush=True)
        out.append(row)
        time.sleep(1.0)
    return out


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def instructions(proc: subprocess.Popen[bytes], port: int, n: int, work: Path) -> dict[str, Any]:
    """Instructions the server executes per request (valgrind's callgrind, started with
    instrumentation off): warmed up first, then counted over `n` requests, 4 at a time. Counts do
    not depend on what else the machine runs, as times do."""
    data = raw_load.request_bytes("127.0.0.1", port, "/v1/chat/completions", BODY, KEY)

    async def batch(count: int) -> int:
        conns = raw_load.Connections("127.0.0.1", port)
        ok = 0
        for _ in range(count // 4):
            replies = [raw_load.Reply(0, 0.0) for _ in range(4)]
            await asyncio.gather(*(conns.send(data, r, 120.0) for r in replies))
            ok += sum(r.status == 200 for r in replies)
        conns.close()
        return ok

    _run(batch(64))
    subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
    ok = _run(batch(n))
    subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
    total = 0
    for out in work.glob("cg.out*"):  # the dump of the counted stretch (the exit's file counts 0 more)
        for line in out.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
    return {"requests": n, "answered": ok, "instructions": total, "instructions_per_request": total // max(1, n)}


def ledger_check(path: Path, answered: int) -> dict[str, Any]:
    """Every answered request has its row at its exact cost (12 in, 2 out at the tier's prices)."""
    conn = sqlite3.connect(path)
    try:
        rows, costs = conn.execute(
            "SELECT count(*), count(DISTINCT round(cost_usd, 12)) FROM requests WHERE key_id = 'bench'"
        ).fetchone()
        cost = conn.execute("SELECT min(cost_usd), max(cost_usd) FROM requests WHERE key_id = 'bench'").fetchone()
        pending = conn.execute("SELECT count(*) FROM pending").fetchone()[0]
    finally:
        conn.close()
    exact = (12 * PRICE_IN + 2 * PRICE_OUT) / 1e6
    return {
        "answered_200_incl_warmup": answered,
        "rows": rows,
        "pending_rows": pending,
        "cost_each": cost,
        "cost_expected": exact,
        "costs_exact": rows > 0 and all(abs(c - exact) < 1e-12 for c in cost),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="50,200,500,1000")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--litellm", default=None, help="LiteLLM's `litellm` executable (its own venv)")
    parser.add_argument("--only", default="direct,tierroute,litellm", help="which servers, in order")
    parser.add_argument("--ledger", default=None, help="a postgresql:// URL (default: a SQLite file)")
    parser.add_argument("--server-extra", default="", help="TOML lines added to tierroute's [server]")
    parser.add_argument("--telemetry", action="store_true", help="tierroute exports traces (to the instant upstream)")
    parser.add_argument(
        "--tierroute-cmd", default=None, help="how to start tierroute (default: this python -m router.cli)"
    )
    parser.add_argument("--profile", type=Path, default=None, help="py-spy tierroute into this directory instead")
    parser.add_argument(
        "--callgrind", type=int, default=0, help="instead: count tierroute's instructions over N requests (valgrind)"
    )
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    only = args.only.split(",")
    work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    results: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "nice": os.nice(0),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "loadavg_before": os.getloadavg(),
        "body": BODY.decode(),
        "servers": {},
    }
    up_port = free_port()
    upstream = spawn([sys.executable, "-m", "router.bench.instant_upstream", str(up_port)], work / "upstream.log")
    procs = [upstream]
    try:
        wait_http(f"http://127.0.0.1:{up_port}/v1/models")
        if "direct" in only:
            print("# direct", flush=True)
            results["servers"]["direct"] = {
                "levels": drive(up_port, "/v1/chat/completions", None, rates, args.seconds, upstream.pid)
            }
        if "tierroute" in only:
            print("# tierroute", flush=True)
            port = free_port()
            ledger = args.ledger or str(work / "ledger.sqlite3")
            config = tierroute_config(work, f"http://127.0.0.1:{up_port}/v1", ledger, args.server_extra)
            if args.telemetry:  # the instant upstream answers every POST, an OTLP export too
                config.write_text(
                    config.read_text() + f'\n[telemetry]\nendpoint = "http://127.0.0.1:{up_port}/v1/traces"\n'
                )
            base = args.tierroute_cmd.split() if args.tierroute_cmd else [sys.executable, "-m", "router.cli"]
            cmd = [*base, "--config", str(config), "serve", "--port", str(port), "--log-level", "warning"]
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
            if args.callgrind:
                cmd = [
                    "valgrind",
                    "--tool=callgrind",
                    "--instr-atstart=no",
                    f"--callgrind-out-file={work}/cg.out",
                    *cmd,
                ]
            proc = spawn(cmd, work / "tierroute.log")
            procs.append(proc)
            wait_http(f"http://127.0.0.1:{port}/healthz", timeout_s=600)
            if args.callgrind:
                results["callgrind"] = instructions(proc, port, args.callgrind, work)
                print(json.dumps(results["callgrind"]), flush=True)
                levels = []
            elif args.profile:
                levels = []
                for rate in rates:
                    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                    out = args.profile / f"tierroute-{int(rate)}.txt"
                    rec = subprocess.Popen(
                        [
                            spy,
                            "record",
                            "-p",
                            str(proc.pid),
                            "-r",
                            "250",
                            "-f",
                            "raw",
                            "-o",
                            str(out),
                            "-d",
                            str(int(args.seconds) + 2),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    time.sleep(1.0)
                    levels += drive(port, "/v1/chat/completions", KEY, [rate], args.seconds, proc.pid)
                    rec.wait()
            else:
                levels = drive(port, "/v1/chat/completions", KEY, rates, args.seconds, proc.pid)
            stop(proc)
            entry: dict[str, Any] = {"levels": levels, "config": config.read_text()}
            if not ledger.startswith("postgresql"):
                entry["ledger"] = ledger_check(Path(ledger), sum(r["ok"] for r in levels) + 64 * len(levels))
                print(json.dumps(entry["ledger"]), flush=True)
            results["servers"]["tierroute"] = entry
        if "litellm" in only and args.litellm:
            print("# litellm", flush=True)
            port = free_port()
            config = litellm_config(work, f"http://127.0.0.1:{up_port}/v1")
            proc = spawn(
                [
                    args.litellm,
                    "--config",
                    str(config),
                    "--port",
                    str(port),
                    "--host",
                    "127.0.0.1",
                    "--num_workers",
                    "1",
                ],
                work / "litellm.log",
                env={"LITELLM_LOG": "ERROR", "DISABLE_SCHEMA_UPDATE": "true"},
            )
            procs.append(proc)
            wait_http(f"http://127.0.0.1:{port}/health/liveliness", timeout_s=180)
            results["servers"]["litellm"] = {
                "levels": drive(port, "/v1/chat/completions", "sk-" + KEY, rates, args.seconds, proc.pid)
            }
            stop(proc)
    finally:
        for p in procs:
            stop(p)
    results["loadavg_after"] = os.getloadavg()
    table = render(results)
    print(table)
    results["table"] = table
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


def render(results: dict[str, Any]) -> str:
    servers = results["servers"]
    direct = {r["rate"]: r for r in servers.get("direct", {}).get("levels", [])}
    lines = [
        "| server | rate/s | 200 | 503 (Retry-After) | lost | p50 ms | p99 ms | added p50 / p99 ms"
        " | server CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in servers.items():
        for r in entry["levels"]:
            d = direct.get(r["rate"])
            added = "-"
            if name != "direct" and d and r["p50_ms"] is not None and d["p50_ms"] is not None:
                added = f"+{r['p50_ms'] - d['p50_ms']:.2f} / +{r['p99_ms'] - d['p99_ms']:.2f}"
            lost = r["lost_timeout"] + r["lost_connection"] + r["other"]
            lines.append(
                f"| {name} | {r['rate']:g} | {r['ok']} | {r['shed_503']} ({r['shed_with_retry_after']}) | {lost} | "
                f"{r['p50_ms']} | {r['p99_ms']} | {added} | {r.get('server_cpu_ms_per_request', '-')} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
