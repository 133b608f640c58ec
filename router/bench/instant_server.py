"""The service with an instant backend behind every tier, in a child process: what `bench overhead` drives.

With generation taking no time, what a client sees is what the router itself adds (parsing,
verifiers, the cascade, the ledger, HTTP). The service runs in its own interpreter so the load
generator does not share its GIL, and reports its own time per request in `Server-Timing`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.bench.launch import free_port
from router.bench.workload import BenchError

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from router.config import Settings


class ServerTiming:
    """ASGI wrapper that reports the app's own time per request in a `Server-Timing` header: from
    the request reaching the app to the response starting (the whole body, for a JSON answer)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()

        async def timed(message: Any) -> None:
            if message["type"] == "http.response.start":
                dur = (time.perf_counter() - t0) * 1000.0
                headers = [*message.get("headers", []), (b"server-timing", f"app;dur={dur:.4f}".encode())]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, timed)


def instant_settings(
    settings: Settings, *, verifiers: str, ledger_path: Path, ledger_url: str | None = None
) -> Settings:
    """The config as the overhead mode serves it: on loopback without keys, with a scratch ledger
    (or the PostgreSQL database at `ledger_url`, to time the ledger and the cache where replicas
    share them), and with the tiers' verifiers (their own and their policies' per task) as
    configured or removed.

    The config's own `ledger.url` is never used: a production config names the replicas' shared
    database, and the instant backend's fake answers would land in its ledger and cache. And the
    cache always gets a namespace of its own (`bench-<random hex>`), which is part of the tier
    policy version, so even a `ledger_url` naming a shared database never stores an entry the
    service (or another bench run) would read back as a hit."""
    tiers = [t.model_copy(update={"verifiers": [], "tasks": {}}) if verifiers == "none" else t for t in settings.tiers]
    server = settings.server.model_copy(update={"host": "127.0.0.1", "allow_unauthenticated": True, "api_keys": []})
    ledger = settings.ledger.model_copy(update={"path": ledger_path, "url": ledger_url or None})
    cache = settings.cache.model_copy(update={"namespace": f"bench-{uuid.uuid4().hex}"})
    return settings.model_copy(update={"tiers": tiers, "server": server, "ledger": ledger, "cache": cache})


def _serve_instant(
    config: str | None, port: int, verifiers: str, scratch: str, errors: Connection, ledger_url: str | None = None
) -> None:
    """Child process: the app with an instant backend behind every tier, under uvicorn."""
    try:
        import uvicorn

        from router.api.app import create_app
        from router.backends.instant import InstantBackend
        from router.config import load_settings
        from router.plugins import VerifierRegistry as Registry

        scratch_ledger = Path(scratch) / "ledger.sqlite3"
        settings = instant_settings(
            load_settings(config), verifiers=verifiers, ledger_path=scratch_ledger, ledger_url=ledger_url
        )
        extra: dict[str, Any] = {"registry": Registry()} if verifiers == "none" else {}
        app = create_app(settings, backends={t.name: InstantBackend(t.name) for t in settings.tiers}, **extra)
        server = uvicorn.Server(
            uvicorn.Config(ServerTiming(app), host="127.0.0.1", port=port, log_level="warning", access_log=False)
        )
    except Exception as exc:  # the parent prints it; a traceback from a child helps nobody
        errors.send(f"{type(exc).__name__}: {exc}")
        return
    server.run()


@contextlib.contextmanager
def instant_service(
    config: str | os.PathLike[str] | None,
    *,
    verifiers: str = "config",
    start_timeout_s: float = 60.0,
    ledger_url: str | None = None,
) -> Iterator[tuple[str, int]]:
    """Run the service with instant backends in a child process (its own interpreter, so the load
    generator does not share its GIL); yield its base URL and pid."""
    import multiprocessing

    import httpx

    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    receive, send = ctx.Pipe(duplex=False)
    with tempfile.TemporaryDirectory(prefix="tierroute-bench-") as scratch:
        proc = ctx.Process(
            target=_serve_instant,
            args=(None if config is None else str(config), port, verifiers, scratch, send, ledger_url),
            name="tierroute-bench-instant",
        )
        proc.start()
        send.close()
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + start_timeout_s
            while True:
                if not proc.is_alive():
                    why = f"exit code {proc.exitcode}"
                    with contextlib.suppress(EOFError, OSError):
                        if receive.poll(1):
                            why = receive.recv()
                    raise BenchError(f"the instant-backend service did not start: {why}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise BenchError(f"the instant-backend service did not answer within {start_timeout_s:g} s")
                time.sleep(0.1)
            assert proc.pid is not None
            yield url, proc.pid
        finally:
            proc.terminate()
            proc.join(15)
            if proc.is_alive():
                proc.kill()
                proc.join()
            receive.close()
