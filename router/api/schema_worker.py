"""The schema-check worker: a child process that checks the schemas it is sent.

    python -m router.api.schema_worker

Reads one JSON line per batch (a list of schemas) on stdin and writes one JSON line back: per
schema, null when `router.grammars.check_schema` accepts it, else [message, code]. It lowers its
own priority first, so that on a busy machine the service's event loop and the model's engine
thread get the CPU before it does. Started and fed by router.api.schema_checks.
"""

from __future__ import annotations

import json
import os
import sys

WORKER_NICENESS = 10


def main() -> None:
    os.nice(WORKER_NICENESS)
    from router.grammars import schema_verdict  # after the nice: importing is work too

    for line in sys.stdin:
        verdicts = [schema_verdict(schema) for schema in json.loads(line)]
        sys.stdout.write(json.dumps(verdicts) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
