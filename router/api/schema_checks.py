"""Schema checks off the event loop, in worker processes.

Turning a request into its typed form checks every JSON schema it carries (router.structured.grammars:
constructs, the grammar's cost bound, and the meta-schema validation the format verifier needs),
and a new 30 KB schema costs a quarter to half a second of pure-Python CPU. Run on the event loop,
three requests with a few dozen such schemas held `/healthz` for 15.7 s. Run on threads, the loop
would still wait for the GIL behind them at every switch interval (measured: /healthz's median
went from 3 ms to 35 ms). So the schemas of a request that were not checked before are sent to a
worker process (router.api.schema_worker); their verdicts come back (and are remembered by
router.structured.grammars), and the request is made typed on the loop with those verdicts pinned, where each
check is then a look-up. A request whose schemas are all known never waits for a worker, so
strangers' new schemas cannot queue it.

There are `SCHEMA_CHECK_WORKERS` workers, each fed by a thread of its own that waits on the pipe
without the GIL: that bounds the CPU new schemas take at once, whatever their number, and the
workers run at a lower priority. They are plain child processes (`python -m`), not
multiprocessing's, which would import the service's main module again in each. A worker that
dies or stalls is replaced; where none can be started the checks run on the feeding thread, off
the loop still.
"""

from __future__ import annotations

import asyncio
import json
import logging
import select
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from router.errors import RequestError, UnavailableError
from router.structured import grammars

log = logging.getLogger(__name__)

SCHEMA_CHECK_WORKERS = 2
BATCH_TIMEOUT_S = 10.0  # a batch's allowance, and this much more per schema in it (each takes < 1 s)
PER_SCHEMA_S = 2.0
WORKER_ARGS: tuple[str, ...] = ("-m", "router.api.schema_worker")  # after the interpreter

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_local = threading.local()  # each feeding thread's worker process


class _Worker:
    """One child process and the pipe to it; used by one thread at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *WORKER_ARGS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # a worker's traceback goes where the service's own output goes
        )

    def check(self, schemas: list[Any]) -> list[grammars.Verdict]:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps(schemas).encode() + b"\n")
        stdin.flush()
        if not _readable(stdout, BATCH_TIMEOUT_S + PER_SCHEMA_S * len(schemas)):
            raise TimeoutError("a schema-check worker did not answer in time")
        line = stdout.readline()
        if not line:
            raise EOFError("a schema-check worker ended")
        return [None if v is None else (str(v[0]), v[1]) for v in json.loads(line)]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _readable(stream: IO[bytes], timeout: float) -> bool:
    ready, _, _ = select.select([stream], [], [], timeout)
    return bool(ready)


def _check(schemas: list[Any]) -> list[grammars.Verdict]:
    """On a feeding thread: the verdicts, from this thread's worker (started or replaced as needed)."""
    failed: Exception | None = None
    for _ in range(2):
        worker: _Worker | None = getattr(_local, "worker", None)
        try:
            if worker is None or worker.proc.poll() is not None:
                worker = _local.worker = _Worker()
        except OSError as exc:  # no process can be started here
            log.warning("schema-check worker unavailable (%s); checking on this thread", exc)
            _local.worker = None
            return [grammars.schema_verdict(s) for s in schemas]
        try:
            return worker.check(schemas)
        except (TimeoutError, EOFError, ValueError, OSError) as exc:  # stalled, died, or its pipe broke
            log.warning("schema-check worker failed (%s); starting another", exc)
            failed = exc
        worker.close()
        _local.worker = None
    if isinstance(failed, TimeoutError):
        raise UnavailableError("the request's JSON schemas could not be checked in time; retry later")
    raise RequestError(
        "the request's JSON schemas could not be checked: the check failed twice", code="schema_check_failed"
    )


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(SCHEMA_CHECK_WORKERS, thread_name_prefix="schema-check")
        return _pool


async def verdicts(schemas: list[Any]) -> list[tuple[Any, grammars.Verdict]]:
    """Each schema with its check's verdict, computed in a worker: for `grammars.pinned`."""
    distinct = list({grammars.schema_key(s): s for s in schemas}.values())
    found = await asyncio.get_running_loop().run_in_executor(_executor(), _check, distinct)
    return list(zip(distinct, found, strict=True))
