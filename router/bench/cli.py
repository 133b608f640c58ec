"""`tierroute bench sweep | burst | overhead | spec`: options, the servers they name, and the commands.

`--url` opens a server's options: the ones after it (`--label`, `--model`, `--pid`, `--launch`,
`--api-key-env`) belong to that server, and given before any `--url` they apply to every one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from router.bench.burst import burst_target
from router.bench.launch import serving
from router.bench.output import (
    print_burst,
    print_overhead,
    print_progress,
    print_spec,
    print_sweep,
    report_header,
    write_json,
)
from router.bench.overhead import run_overhead
from router.bench.spec import (
    DEFAULT_VARIANTS,
    VARIANTS,
    drafting_missing,
    plan_variants,
    read_pair,
    spec_comparison,
)
from router.bench.sweep import compare, sweep_target
from router.bench.workload import PROMPTS, BenchError, Level, Target, Workload


class _TargetOption(argparse.Action):
    """`--url` opens a target; the target options after it belong to that target. Given before any
    `--url`, a target option applies to every target."""

    def __init__(self, option_strings: list[str], dest: str, field: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.field = field

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        spec = getattr(namespace, self.dest, None)
        if spec is None:
            spec = {"defaults": {}, "targets": []}
            setattr(namespace, self.dest, spec)
        if self.field == "url":
            spec["targets"].append({"url": values})
            return
        into = spec["targets"][-1] if spec["targets"] else spec["defaults"]
        if self.field in into:
            parser.error(f"{option_string} given twice for the same target")
        into[self.field] = values


def _targets(args: argparse.Namespace) -> list[Target]:
    spec = args.targets or {"defaults": {}, "targets": []}
    if not spec["targets"]:
        raise BenchError("name at least one server with --url (its base URL, e.g. http://127.0.0.1:8000/v1)")
    out: list[Target] = []
    for i, given in enumerate(spec["targets"]):
        merged = {**spec["defaults"], **given}
        key_env = merged.pop("api_key_env", None)
        api_key = "not-needed"
        if key_env is not None:
            api_key = os.environ.get(key_env, "")
            if not api_key:
                raise BenchError(f"--api-key-env names {key_env}, which is not set")
        label = merged.pop("label", None) or f"target{i + 1}"
        out.append(Target(label=label, api_key=api_key, **merged))
    labels = [t.label for t in out]
    if len(set(labels)) != len(labels):
        raise BenchError(f"two targets share a label: {labels}")
    return out


def _workload(args: argparse.Namespace) -> Workload:
    """The requests every server is sent: the built-in prompts or a file's, at a fixed length."""
    prompts = PROMPTS
    if args.prompts:
        lines = [line for line in Path(args.prompts).read_text().splitlines() if line.strip()]
        if not lines:
            raise BenchError(f"{args.prompts}: no prompts (one per line)")
        prompts = tuple(lines)
    return Workload(
        api=args.api,
        max_tokens=args.max_tokens,
        timeout_s=args.timeout,
        prompts=prompts,
        response_format=_response_format(args.response_format),
    )


def _response_format(path: str | None) -> dict[str, Any] | None:
    """The response_format a file gives: OpenAI's whole parameter (`{"type": "json_schema", ...}`
    or `{"type": "json_object"}`), or a bare JSON schema, sent as a json_schema named `bench`."""
    if path is None:
        return None
    try:
        given = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"--response-format {path}: {exc}") from None
    if not isinstance(given, dict):
        raise BenchError(f"--response-format {path}: a JSON object (a schema, or OpenAI's response_format)")
    if given.get("type") in ("json_object", "json_schema"):
        return given
    return {"type": "json_schema", "json_schema": {"name": "bench", "schema": given}}


def cmd_sweep(args: argparse.Namespace) -> int:
    targets = _targets(args)
    workload = _workload(args)
    if args.poisson:
        levels = [Level("rate", r) for r in args.poisson]
    else:
        levels = [Level("concurrency", c) for c in args.concurrency]
    requests = None if args.duration is not None else args.requests
    report: dict[str, Any] = {**report_header(args, "sweep"), "workload": workload.describe(), "targets": []}
    failed = False
    for target in targets:
        try:
            with serving(target, start_timeout_s=args.launch_timeout) as live:
                print_progress(f"[{live.label}] {live.url} (pid {live.pid or 'unknown'})")
                result = asyncio.run(
                    sweep_target(
                        live,
                        workload,
                        levels,
                        requests=requests,
                        duration_s=args.duration,
                        warmup=args.warmup,
                        seed=args.seed,
                        progress=print_progress,
                    )
                )
        except BenchError as exc:
            print_progress(f"error: {exc}")
            result, failed = {**target.describe(), "error": str(exc)}, True
        report["targets"].append(result)
        write_json(args.json, report, quiet=True)  # a long run cut short keeps what it measured
    report["comparison"] = compare(report["targets"])
    print_sweep(report, workload)
    write_json(args.json, report)
    unanswered = any(level["ok"] == 0 for t in report["targets"] for level in t.get("levels", []))
    return 1 if failed or unanswered else 0


def cmd_spec(args: argparse.Namespace) -> int:
    if args.config is None:
        raise BenchError("name the plain tier's config: tierroute --config PLAIN.toml bench spec --draft-config ...")
    plain, draft = Path(args.config), Path(args.draft_config)
    pair = read_pair(plain, draft)
    workload = _workload(args)
    variants = plan_variants(
        args.variants,
        plain_config=plain,
        draft_config=draft,
        pair=pair,
        llama_server=Path(args.llama_server) if args.llama_server else None,
    )
    levels = [Level("concurrency", c) for c in args.concurrency]
    report: dict[str, Any] = {
        **report_header(args, "spec"),
        "workload": workload.describe(),
        "pair": pair.describe(),
        "targets": [],
    }
    failed = False
    for variant in variants:
        if variant.target is None:
            print_progress(f"[{variant.label}] skipped: {variant.skipped}")
            report["targets"].append(variant.describe())
            continue
        try:
            with serving(variant.target, start_timeout_s=args.launch_timeout) as live:
                print_progress(f"[{live.label}] {live.url} (pid {live.pid or 'unknown'})")
                result = asyncio.run(
                    sweep_target(
                        live,
                        workload,
                        levels,
                        requests=args.requests,
                        duration_s=None,
                        warmup=args.warmup,
                        progress=print_progress,
                        drafts=True,
                    )
                )
        except BenchError as exc:
            print_progress(f"error: {exc}")
            result, failed = {**variant.describe(), "error": str(exc)}, True
        if drafting_missing(result):
            result["warning"] = "the server counted no draft tokens at some level: it did not draft"
            print_progress(f"[{variant.label}] warning: {result['warning']}")
            failed = True
        report["targets"].append(result)
        write_json(args.json, report, quiet=True)  # a long run cut short keeps what it measured
    report["comparison"] = spec_comparison(report["targets"])
    print_spec(report, workload)
    write_json(args.json, report)
    unanswered = any(level["ok"] == 0 for t in report["targets"] for level in t.get("levels", []))
    return 1 if failed or unanswered else 0


def cmd_burst(args: argparse.Namespace) -> int:
    targets = _targets(args)
    if len(targets) != 1:
        raise BenchError("burst measures one server: give one --url")
    workload = _workload(args)
    with serving(targets[0], start_timeout_s=args.launch_timeout) as live:
        print_progress(f"[{live.label}] {live.url} (pid {live.pid or 'unknown'})")
        result = asyncio.run(
            burst_target(
                live,
                workload,
                requests=args.requests,
                concurrency=args.concurrency,
                rounds=args.rounds,
                settle_s=args.settle,
                warmup=args.warmup,
                progress=print_progress,
            )
        )
    report = {**report_header(args, "burst"), "workload": workload.describe(), "target": result}
    print_burst(
        result, title=f"tierroute bench burst: {args.requests} requests at concurrency {args.concurrency}, {live.label}"
    )
    verdict = result["verdict"]
    write_json(args.json, report)
    return 0 if verdict["alive_after"] and verdict["every_request_answered_or_503"] else 1


def cmd_overhead(args: argparse.Namespace) -> int:
    result = run_overhead(
        args.config,
        rate=args.rate,
        seconds=args.seconds,
        kind=args.arrivals,
        verifiers=args.verifiers,
        model=args.model,
        max_tokens=args.max_tokens,
        seed=args.seed,
        warmup=args.warmup,
        floor=args.floor,
        ledger_url=args.ledger_url,
    )
    report = {**report_header(args, "overhead"), **result}
    title = (
        f"router overhead: {result['requests']} requests, {args.arrivals} arrivals at {args.rate:g}/s, "
        f"instant backends, verifiers: {args.verifiers}"
    )
    print_overhead(result, title=title)
    write_json(args.json, report)
    return 0 if result["ok"] == result["requests"] else 1


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("expected positive integers")
    return values


def _rate_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rates separated by commas, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError("expected positive rates")
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("expected a positive whole number")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("expected a positive number")
    return value


def _variant_list(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [v for v in values if v not in VARIANTS]
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(VARIANTS)}, separated by commas")
    return values


def _workload_options(p: argparse.ArgumentParser, *, max_tokens: int) -> None:
    """What every request asks: the API, its length, the prompts, the response format, the timeout."""
    api = p.add_mutually_exclusive_group()
    api.add_argument("--chat", dest="api", action="store_const", const="chat", help="/v1/chat/completions (default)")
    api.add_argument("--completions", dest="api", action="store_const", const="completions", help="/v1/completions")
    p.set_defaults(api="chat", targets=None)
    p.add_argument("--max-tokens", type=_positive_int, default=max_tokens, help="output length asked of every request")
    p.add_argument(
        "--prompts", default=None, metavar="FILE", help="one prompt per line instead of the built-in set of 16"
    )
    p.add_argument(
        "--response-format",
        default=None,
        metavar="FILE.json",
        help="send this JSON schema (or OpenAI response_format object) with every request",
    )
    p.add_argument("--timeout", type=_positive_float, default=600.0, help="seconds per request")
    p.add_argument("--warmup", type=int, default=2, help="requests sent and not counted before measuring")
    p.add_argument("--json", default=None, metavar="PATH", help="write every number here")
    p.add_argument("--launch-timeout", type=_positive_float, default=300.0, help="seconds a launched server may take")


def _client_options(p: argparse.ArgumentParser, *, max_tokens: int) -> None:
    g = p.add_argument_group("servers", "--url starts a server's options; the options after it are that server's own")
    g.add_argument(
        "--url",
        action=_TargetOption,
        field="url",
        dest="targets",
        metavar="URL",
        help="base URL including /v1; repeat to measure several servers in one run",
    )
    g.add_argument(
        "--label", action=_TargetOption, field="label", dest="targets", metavar="NAME", help="name in the report"
    )
    g.add_argument(
        "--model",
        action=_TargetOption,
        field="model",
        dest="targets",
        metavar="NAME",
        help="model name sent (default: auto)",
    )
    g.add_argument(
        "--pid",
        action=_TargetOption,
        field="pid",
        dest="targets",
        type=int,
        metavar="PID",
        help="server process on this machine whose resident memory is sampled",
    )
    g.add_argument(
        "--launch",
        action=_TargetOption,
        field="launch",
        dest="targets",
        metavar="CMD",
        help="start the server with CMD before its turn and stop it after (its pid is watched)",
    )
    g.add_argument(
        "--api-key-env",
        action=_TargetOption,
        field="api_key_env",
        dest="targets",
        metavar="VAR",
        help="environment variable holding the server's API key",
    )
    _workload_options(p, max_tokens=max_tokens)


def register(sub: Any, add: Any) -> None:
    bench = sub.add_parser("bench", help="measure throughput, latency, memory and the router's overhead")
    bsub = bench.add_subparsers(dest="bench_command", metavar="MODE", required=True)

    p = add(
        "sweep",
        "streamed load at rising concurrency (or Poisson rates) against OpenAI-compatible servers",
        cmd_sweep,
        bsub,
    )
    _client_options(p, max_tokens=128)
    p.add_argument("--concurrency", type=_int_list, default=[1, 2, 4, 8, 16], metavar="1,2,4,8,16")
    p.add_argument(
        "--poisson",
        type=_rate_list,
        default=None,
        metavar="RATES",
        help="open-loop Poisson arrivals at these rates (req/s) instead of the concurrency sweep",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--requests", type=_positive_int, default=32, help="requests per level (default 32)")
    size.add_argument("--duration", type=_positive_float, default=None, help="seconds per level instead")
    p.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrival times")

    p = add(
        "spec",
        "speculative decoding side by side: a local tier plain, drafted, and llama-server --model-draft",
        cmd_spec,
        bsub,
    )
    _workload_options(p, max_tokens=128)
    p.add_argument(
        "--draft-config",
        required=True,
        metavar="TOML",
        help="the same tier as --config with draft_model (and draft_max) set",
    )
    p.add_argument(
        "--llama-server",
        default=None,
        metavar="BIN",
        help="llama.cpp's llama-server (scripts/build_llama_server.sh builds it); without it, its variants are skipped",
    )
    p.add_argument(
        "--variants",
        type=_variant_list,
        default=list(DEFAULT_VARIANTS),
        metavar=",".join(DEFAULT_VARIANTS),
        help=f"servers to measure, in this order (of {', '.join(VARIANTS)})",
    )
    p.add_argument("--concurrency", type=_int_list, default=[1, 8], metavar="1,8")
    p.add_argument("--requests", type=_positive_int, default=16, help="requests per level (default 16)")

    p = add("burst", "a burst of requests at high concurrency, in rounds: answered, refused, memory", cmd_burst, bsub)
    _client_options(p, max_tokens=32)
    p.add_argument("--requests", type=_positive_int, default=500, help="requests per round")
    p.add_argument("--concurrency", type=_positive_int, default=64)
    p.add_argument("--rounds", type=_positive_int, default=2, help="bursts in a row; memory is compared between them")
    p.add_argument("--settle", type=float, default=5.0, help="seconds to wait after a round before reading memory")

    p = add(
        "overhead", "the router's own latency: every tier an instant backend, open-loop at a rate", cmd_overhead, bsub
    )
    p.add_argument("--rate", type=_positive_float, default=100.0, help="requests per second")
    p.add_argument("--seconds", type=_positive_float, default=10.0)
    p.add_argument("--arrivals", choices=("poisson", "uniform"), default="poisson")
    p.add_argument(
        "--verifiers",
        choices=("config", "none"),
        default="config",
        help="keep the tiers' configured verifiers (router work too), or remove them",
    )
    p.add_argument("--model", default="auto", help="model name sent (auto runs the cascade)")
    p.add_argument("--max-tokens", type=_positive_int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=50, help="requests sent and not counted before measuring")
    p.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the second pass against /healthz (the HTTP floor, no router work)",
    )
    p.add_argument(
        "--ledger-url",
        default=None,
        metavar="URL",
        help="serve the ledger (and the response cache) from this postgresql://user@host:port/db database "
        "(no password in it: the config's ledger.password_env is read) instead of a scratch SQLite file; "
        "the config's own ledger.url is never used, and the bench's cache entries are under a namespace "
        "of their own",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="write every number here")
