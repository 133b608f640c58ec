"""Router overhead with telemetry, three builds side by side in one run: the figures of docs/telemetry.md.

    PYTHONPATH=$PWD .venv/bin/python scripts/telemetry_overhead.py --seconds 20 --rounds 2 \\
        --out docs/bench/telemetry/overhead

Three services with instant backends behind every tier (`router.bench.instant_server`: the model
is never the bottleneck) on `bench/no-shadow-overhead.toml` (the `confidence` verifier on the small
tier, every answer accepted there: a server span, a tier attempt, a verifier, a decision and the
ledger write per request), each in its own process, all started before the first measurement:

- `baseline`: the tree before telemetry existed (`--baseline`, default the merge base with
  `main`), extracted with `git archive` and run with `PYTHONPATH` pointing at it;
- `unconfigured`: this tree, no `[telemetry]` and no OTEL_* variable (the facade's no-op path);
- `tracing`: this tree with OTEL_EXPORTER_OTLP_ENDPOINT set to a live OTLP/HTTP receiver process
  (tests/support/otlp_receiver.py), every span exported in batches.

Each is driven in turn by `router.bench.overhead.drive_overhead` (open-loop Poisson arrivals at
`--rate`, non-streamed chat), in `--rounds` rounds whose order rotates, so a change in the
machine's load falls on every mode alike. Two figures per mode: the app's own time per request
(its Server-Timing), pooled over the rounds, and the service process's CPU time (user + system,
from /proc, warm-up included) per request answered. On a loaded machine the first is mostly
queueing for a CPU, the second what the work itself costs. It writes OUT.json (every figure, the
load average before and after) and OUT.txt (the table, in Markdown), and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from router.bench.launch import free_port
from router.bench.overhead import drive_overhead
from router.bench.stats import distribution_ms, rounded

ROOT = Path(__file__).resolve().parents[1]
RECEIVER = ROOT / "tests" / "support" / "otlp_receiver.py"
MODES = ("baseline", "unconfigured", "tracing")
# the child: the instant-backend service of router.bench, from whichever tree PYTHONPATH names
CHILD = """
import sys
from multiprocessing import Pipe
from router.bench.instant_server import _serve_instant
errors, send = Pipe(duplex=False)
_serve_instant(sys.argv[1], int(sys.argv[2]), "config", sys.argv[3], send)
if errors.poll():
    sys.exit(f"the service did not start: {errors.recv()}")
"""


def baseline_tree(rev: str, into: Path) -> Path:
    """`rev`'s router, verifiers and evals packages, extracted under `into`."""
    archive = into / "baseline.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "router", "verifiers", "evals"], stdout=f, check=True)
    tree = into / "baseline"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


@contextlib.contextmanager
def service(tree: Path, config: Path, env: dict[str, str], scratch: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    scratch.mkdir(parents=True, exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TIERROUTE_"))}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(config), str(port), str(scratch)],
        env={**clean, "PYTHONPATH": str(tree), **env},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"a service exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("a service did not start within 120 s")
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.terminate()  # SIGTERM: uvicorn drains, the lifespan flushes the last spans
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def receiver(out: Path) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, str(RECEIVER), str(out)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.terminate()
        proc.wait(10)


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spans_alone_us(n: int = 20_000) -> float:
    """What tracing's spans cost one request on its own path, in microseconds of this process's CPU:
    the five spans a request through one tier makes (server, attempt, verifier, decision, ledger
    write, with attributes like the service's), created, filled, ended and queued on the batch
    processor, whose exporter encodes them as the service's does (on its own thread, counted too).
    Run against another tree (`PYTHONPATH`) to compare builds; the side-by-side runs give the
    service's whole figure."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from router.config import TelemetrySettings
    from router.telemetry.otlp_encode import encode_spans
    from router.telemetry.setup import Tracing

    class Encoding(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            encode_spans(spans)
            return SpanExportResult.SUCCESS

    exporter = Encoding()
    tracer = Tracing._with(TelemetrySettings(), exporter, BatchSpanProcessor(exporter, max_queue_size=n * 5)).tracer
    server_attrs = {"http.request.method": "POST", "url.path": "/v1/chat/completions", "server.address": "127.0.0.1"}

    def one_request() -> None:
        server = tracer.server("POST /v1/chat/completions", [(b"host", b"127.0.0.1")], server_attrs)
        attempt = tracer.start("chat small", server, "internal", {"gen_ai.request.model": "small"}, ())
        attempt.set_attributes(
            {"gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 3, "tierroute.cost_usd": 0.0}
        )
        verify = tracer.start("verify confidence", attempt, "internal", {"gen_ai.evaluation.name": "confidence"}, ())
        verify.set_attribute("gen_ai.evaluation.score.value", 0.9)
        verify.end()
        tracer.start("tierroute.decision", attempt, "internal", {"tierroute.decision": "accepted"}, ()).end()
        attempt.end()
        tracer.start("tierroute.ledger.write", server, "internal", None, ()).end()
        server.set_attribute("http.response.status_code", 200)
        server.end()

    for _ in range(n // 10):
        one_request()
    tracer.provider.force_flush()
    started = time.process_time()
    for _ in range(n):
        one_request()
    tracer.provider.force_flush()
    used = time.process_time() - started
    tracer.provider.shutdown()
    return round(used / n * 1e6, 1)


def off_path_us(n: int = 200_000) -> float:
    """What the telemetry hooks cost one request while nothing is configured, in microseconds of
    this process's CPU: the calls a plain request through one tier makes (the cascade's attempt
    spans and decision, the verifier and backend checks, the ledger write's span, the account's
    record lookup), timed together. A figure the side-by-side runs cannot resolve on a loaded
    machine, measured directly."""
    from router.cascade import Attempt
    from router.telemetry import context, spans
    from router.telemetry.attempts import cascade_spans

    assert not spans.active()
    attempt = Attempt(tier="small", threshold=0.5)

    def one_request() -> None:
        record = context.current()  # the account: no record while off
        traced = cascade_spans(None or context.request_span(), True)
        span = traced.begin(attempt, "llamacpp", 16)
        span.is_recording()  # the tier request's trace
        traced.decided(attempt, "open_ended")
        traced.end()
        spans.active()  # the backend's upstream span
        write = spans.start("tierroute.ledger.write", context.request_span(), attributes={"tierroute.request_id": "x"})
        write.end()
        if record is not None:
            raise AssertionError("a record while off")

    t0 = time.process_time()
    for _ in range(n):
        one_request()
    return rounded(1e6 * (time.process_time() - t0) / n, 3) or 0.0


def change(a: float | None, b: float | None) -> float | None:
    """b against a, as a fraction (+0.05: 5% more)."""
    return None if a is None or b is None or a == 0 else rounded(b / a - 1.0, 4)


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    modes: dict[str, Any] = {}
    for mode, results in runs.items():
        app = [r["server_ms"] / 1000.0 for res in results for r in res["per_request"] if "server_ms" in r]
        client = [r["latency_ms"] / 1000.0 for res in results for r in res["per_request"] if r.get("error") is None]
        if not results:
            modes[mode] = {"requests": 0, "ok": 0, "app_ms": distribution_ms([]), "client_ms": distribution_ms([])}
            modes[mode] |= {"app_p50_per_round": [], "cpu_ms_per_request": None, "peak_rss_mib": None}
            continue
        modes[mode] = {
            "requests": sum(res["requests"] for res in results),
            "ok": sum(res["ok"] for res in results),
            "app_ms": distribution_ms(app),
            "client_ms": distribution_ms(client),
            "app_p50_per_round": [res["server_ms"]["p50"] for res in results],
            "cpu_ms_per_request": rounded(
                1000.0 * math.fsum(res["cpu_s"] for res in results) / max(1, sum(res["sent"] for res in results))
            ),
            "peak_rss_mib": max((res["memory"] or {}).get("peak_rss_mib") or 0 for res in results),
        }
    out: dict[str, Any] = {"modes": modes, "changes": {}}
    for label, a, b, target in (
        ("unconfigured vs baseline", "baseline", "unconfigured", 0.03),
        ("tracing vs unconfigured", "unconfigured", "tracing", 0.15),
    ):
        p50 = change(modes[a]["app_ms"]["p50"], modes[b]["app_ms"]["p50"])
        mean = change(modes[a]["app_ms"]["mean"], modes[b]["app_ms"]["mean"])
        cpu = change(modes[a]["cpu_ms_per_request"], modes[b]["cpu_ms_per_request"])
        out["changes"][label] = {
            "p50": p50,
            "mean": mean,
            "cpu": cpu,
            "target": target,
            "met_p50": p50 is not None and p50 <= target,
            "met_cpu": cpu is not None and cpu <= target,
        }
    return out


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| mode | requests (ok) | app p50 ms | app p95 ms | app p99 ms | app mean ms | p50 per round | client p50 ms "
        "| CPU ms per request |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, m in summary["modes"].items():
        a = m["app_ms"]
        rounds = ", ".join(f"{x:.3f}" for x in m["app_p50_per_round"] if x is not None)
        if m.get("rounds_not_finished"):
            rounds += f" ({m['rounds_not_finished']} not finished)"
        cells = [a["p50"], a["p95"], a["p99"], a["mean"]]
        shown = " | ".join(ms(x) for x in cells)
        lines.append(
            f"| {mode} | {m['requests']} ({m['ok']}) | {shown} | {rounds} | {ms(m['client_ms']['p50'])} | "
            f"{ms(m['cpu_ms_per_request'])} |"
        )
    lines += [
        "",
        "| comparison | app p50 change | app mean change | CPU per request change | target | met (p50 / CPU) |",
        "|---|---|---|---|---|---|",
    ]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:+.1%}"

    for label, c in summary["changes"].items():
        met = f"{'yes' if c['met_p50'] else 'no'} / {'yes' if c['met_cpu'] else 'no'}"
        lines.append(
            f"| {label} | {pct(c['p50'])} | {pct(c['mean'])} | {pct(c['cpu'])} | <= +{c['target']:.0%} | {met} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "bench" / "no-shadow-overhead.toml")
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=20.0, help="per mode and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--baseline", default=None, help="git revision before telemetry (default: merge base with main)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "telemetry" / "overhead")
    p.add_argument(
        "--spans-alone", action="store_true", help="only time a request's spans in this process (spans_alone_us)"
    )
    args = p.parse_args()
    if args.spans_alone:
        print(f"a request's 5 spans, created, ended, queued and encoded: {spans_alone_us()} µs of CPU")
        return
    rev = (
        args.baseline
        or subprocess.run(
            ["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    hooks_us = off_path_us()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    unfinished = dict.fromkeys(MODES, 0)
    with tempfile.TemporaryDirectory(prefix="tierroute-telemetry-bench-") as tmp:
        scratch = Path(tmp)
        spans = scratch / "spans.jsonl"
        base = baseline_tree(rev, scratch)
        with contextlib.ExitStack() as stack:
            otlp = stack.enter_context(receiver(spans))
            tracing_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp, "OTEL_SERVICE_NAME": "tierroute-bench"}
            urls = {
                "baseline": stack.enter_context(service(base, args.config, {}, scratch / "baseline")),
                "unconfigured": stack.enter_context(service(ROOT, args.config, {}, scratch / "unconfigured")),
                "tracing": stack.enter_context(service(ROOT, args.config, tracing_env, scratch / "tracing")),
            }
            for r in range(args.rounds):
                order = MODES[r % 3 :] + MODES[: r % 3]
                for mode in order:
                    url, pid = urls[mode]
                    cpu0 = cpu_seconds(pid)
                    drive = drive_overhead(url, rate=args.rate, seconds=args.seconds, floor=False, pid=pid, seed=r)
                    try:
                        # a service that cannot keep up builds a backlog the client then drains for
                        # minutes on a loaded machine: such a round is reported as not finished
                        result = asyncio.run(asyncio.wait_for(drive, timeout=4 * args.seconds + 60))
                    except TimeoutError:
                        unfinished[mode] += 1
                        print(f"round {r + 1} {mode}: not finished within {4 * args.seconds + 60:g} s", flush=True)
                        continue
                    result["cpu_s"] = cpu_seconds(pid) - cpu0
                    result["sent"] = result["requests"] + result["warmup"]
                    runs[mode].append(result)
                    print(f"round {r + 1} {mode}: app p50 {result['server_ms']['p50']} ms", flush=True)
            stack.close()  # services stopped (the tracing one flushed), then the receiver
        exported = sum(1 for _ in spans.open()) if spans.exists() else 0
    summary = summarize(runs)
    for mode, n in unfinished.items():
        summary["modes"][mode]["rounds_not_finished"] = n
    summary["setup"] = {
        "command": " ".join(["scripts/telemetry_overhead.py", *sys.argv[1:]]),
        "config": str(args.config.relative_to(ROOT)) if args.config.is_relative_to(ROOT) else str(args.config),
        "baseline_rev": rev,
        "rate": args.rate,
        "seconds_per_mode_and_round": args.seconds,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "off_path_hooks_us_per_request": hooks_us,
        "spans_exported": exported,
        "spans_per_request": rounded(exported / max(1, summary["modes"]["tracing"]["ok"]), 2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    text = table(summary)
    s = summary["setup"]
    note = (
        f"`{s['command']}`: {s['rounds']} rounds x {s['seconds_per_mode_and_round']:g} s per mode at "
        f"{s['rate']:g} req/s on {s['cpus']} CPUs, load average {s['load_average_before'][0]} before and "
        f"{s['load_average_after'][0]} after; baseline {rev[:12]}; {exported} spans exported "
        f"({s['spans_per_request']} per traced request). Unconfigured, the telemetry hooks of one request "
        f"cost {hooks_us:g} µs of CPU, measured directly (`off_path_us`).\n"
    )
    args.out.with_suffix(".txt").write_text(note + "\n" + text)
    print(note + "\n" + text)


if __name__ == "__main__":
    main()
