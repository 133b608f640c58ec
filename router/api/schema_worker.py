"""The schema-check worker: a child process that checks the schemas it is sent.

    python -m router.api.schema_worker

Reads one JSON line per batch (a list of schemas) on stdin and writes one JSON line back: per
schema, null when `router.structured.grammars.check_schema` accepts it, else [message, code]. It lowers its
own priority first, so that on a busy machine the service's event loop and the model's engine
thread get the CPU before it does. Started and fed by router.api.schema_checks.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

WORKER_NICENESS = 10


def main() -> None:
    os.nice(WORKER_NICENESS)
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
