"""Where a served request's CPU goes: py-spy's raw (collapsed) stacks of `tierroute serve` in steps.

    scripts/profile_summary.py PROFILE.txt [--requests N] [--cpu-ms MS_PER_REQUEST]

Each sample is given to the step of the request path its innermost frame of a known file belongs
to (generic library frames, such as json, typing, dataclasses or asyncio, are looked through to
the frame that called them): parse and validation, auth, admission, the plan, the upstream call,
response building, the ledger (on the event loop and on its writer thread), metrics, telemetry,
the pipeline's own code, the HTTP server and framework, and the event loop's own C code. An
idle worker thread waiting for work is left out. With `--cpu-ms` (the server's CPU per request
measured without the profiler) each step's share is also given in ms per request.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

# file patterns -> step, tried in order on each frame from the innermost out
STEPS: list[tuple[str, str]] = [
    (r"router/ledger/|sqlite3", "ledger write"),
    (r"router/telemetry/|opentelemetry", "telemetry"),
    (r"prometheus_client|router/metrics\.py", "metrics"),
    (r"router/admission/auth\.py|router/api/deps\.py|router/control/", "auth"),
    (r"router/admission/", "admission"),
    (r"router/backends/openai/|openai/|httpx|httpcore|anyio/|h11/", "upstream call"),
    (
        r"router/cascade\.py|router/tasks\.py|router/learned/|router/policy\.py|numpy|router/verification\.py",
        "plan + cascade",
    ),
    (
        r"router/api/responses\.py|router/api/extension\.py|starlette/responses\.py|fastapi/encoders",
        "response building",
    ),
    (
        r"router/api/requests\.py|router/api/request_parts\.py|router/wire\.py|router/generation\.py|pydantic|"
        r"router/api/app\.py|fastapi/dependencies|router/structured/|fastapi/_compat",
        "parse + validation",
    ),
    (r"router/pipeline/|router/api/routes_|router/cache/|router/quality/", "pipeline"),
    (r"uvicorn|httptools|starlette/|fastapi/", "HTTP server + framework"),
]
# frames looked through to whoever called them
GENERIC = re.compile(
    r"\((json/|typing\.py|dataclasses\.py|asyncio/|contextlib\.py|enum\.py|re/|functools\.py|abc\.py|"
    r"<frozen|collections/|uuid\.py|inspect\.py|copy\.py|weakref\.py|threading\.py|concurrent/|<string>|"
    r"email/|urllib/|logging/|types\.py|random\.py|hashlib|hmac|base64|socket\.py|ssl\.py|selectors\.py|"
    r"traceback\.py|warnings\.py|__init__\.py:\d+\)$)"
)
IDLE = re.compile(r"^_worker \(concurrent/futures/thread\.py:81\)$")


def step_of(frames: list[str]) -> str:
    if frames[-1].startswith("Runner.run"):  # the loop's own C code: reading, writing, scheduling
        return "event loop (uvloop's C code)"
    for frame in reversed(frames):
        for pattern, step in STEPS:
            if re.search(pattern, frame):
                return step
    return "other"


def summarize(path: Path) -> tuple[collections.Counter[str], int, int]:
    steps: collections.Counter[str] = collections.Counter()
    thread_steps: collections.Counter[str] = collections.Counter()
    idle = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        if IDLE.match(frames[-1]):
            idle += n
            continue
        kept = [f for f in frames if not GENERIC.search(f)]
        step = step_of(frames if frames[-1].startswith("Runner.run") else kept or frames)
        on_thread = frames[0].startswith("Thread._bootstrap")
        steps[f"{step} (writer thread)" if on_thread else step] += n
        if on_thread:
            thread_steps[step] += n
    return steps, sum(steps.values()), idle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--cpu-ms", type=float, default=None, help="server CPU ms per request, measured unprofiled")
    args = parser.parse_args()
    steps, total, idle = summarize(args.profile)
    print(f"{args.profile}: {total} samples on CPU ({idle} of an idle worker thread left out)")
    print("| step | share | ms/request |" if args.cpu_ms else "| step | share |")
    print("|---|---|---|" if args.cpu_ms else "|---|---|")
    for step, n in steps.most_common():
        share = n / total
        extra = f" {share * args.cpu_ms:.3f} |" if args.cpu_ms else ""
        print(f"| {step} | {100 * share:.1f}% |{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
