"""The schema-check worker: a child process that checks the schemas it is sent.

    python -m router.api.schema_worker

Reads one JSON line per batch (a list of schemas) on stdin and writes one JSON line back: per
schema, null when `router.structured.grammars.check_schema` accepts it, else [message, code]. It lowers its
own priority first, so that on a busy machine the service's event loop and the model's engine
thread get the CPU before it does, and caps its own address space (`WORKER_MEMORY_BYTES`), so a
schema whose check would allocate without bound fails the worker's own allocation (that schema
refused, or the worker replaced) instead of taking the host's memory. Its time is bounded by the
service, which replaces a worker that does not answer (router.api.schema_checks). Started and fed
by router.api.schema_checks.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import traceback
from collections.abc import Callable
from typing import Any

WORKER_NICENESS = 10
# its address space: the interpreter, jsonschema and a 30 KB schema's check peak near 30 MB of it
WORKER_MEMORY_BYTES = 1 << 30


def main() -> None:
    os.nice(WORKER_NICENESS)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = WORKER_MEMORY_BYTES if hard == resource.RLIM_INFINITY else min(WORKER_MEMORY_BYTES, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    from router.structured.grammars import schema_verdict  # after the nice: importing is work too

    for line in sys.stdin:
        sys.stdout.write(json.dumps([_verdict(schema, schema_verdict) for schema in json.loads(line)]) + "\n")
        sys.stdout.flush()


def _verdict(schema: Any, check: Callable[[Any], Any]) -> Any:
    try:
        return check(schema)
    except Exception as exc:  # noqa: BLE001 - a bug in a check refuses that schema; the worker lives on
        traceback.print_exc()
        return f"the JSON schema could not be checked ({type(exc).__name__})", None


if __name__ == "__main__":
    main()
