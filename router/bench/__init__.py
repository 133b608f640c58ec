"""`tierroute bench`: load against any OpenAI-compatible server, and the router's own overhead.

Three modes, each printing a table and writing every number to JSON (`--json PATH`):

- `sweep`: a closed-loop concurrency sweep (or Poisson arrivals at given rates) of streamed
  requests with fixed prompts and output lengths, against one or more servers in one run, one
  after another. Per level: aggregate output tok/s, time to first token and latency p50/p95/p99,
  requests answered, refused (503) and failed, and the server's peak resident memory.
- `burst`: N requests at high concurrency, in rounds: answered / refused with 503 / other
  errors, whether the server still answers afterwards, and its memory before, after, and after
  settling, round by round, to show whether memory stays flat.
- `overhead`: the service itself, with every tier served by an instant backend in a child
  process, driven open-loop at a fixed rate; what the client sees is what the router adds.

Servers are named with `--url` (the base URL, including /v1). A server can be started by the
bench itself (`--launch CMD`): it is started before its turn, measured alone, and stopped after,
and its memory is sampled without a `--pid`.

Every request is timed on the client: TTFT is the first chunk that carries text, latency the end
of the stream, output tokens the server's usage when it reports it (`stream_options.include_usage`)
and the number of text chunks when it does not (llama-cpp-python's server sends one token per
chunk); each level says which it used. Aggregate tok/s is the answered requests' output tokens
over the level's wall time. Percentiles interpolate linearly between closest ranks, as numpy does.

One module per job: `workload` (prompts, servers, levels), `stats`, `outcome` (a request, a
level), `load` (the load generators), `memory` (/proc), `launch` (servers the bench starts),
`instant_server` (the service on instant backends), `sweep`, `burst`, `overhead` (the modes),
`output` (tables, JSON), `cli` (options and commands).
"""

from router.bench.cli import register
from router.bench.load import arrivals, closed_loop, open_loop
from router.bench.outcome import Outcome, summarize
from router.bench.stats import distribution_ms, percentile
from router.bench.workload import PROMPTS, BenchError, Level, Target, Workload

__all__ = [
    "PROMPTS",
    "BenchError",
    "Level",
    "Outcome",
    "Target",
    "Workload",
    "arrivals",
    "closed_loop",
    "distribution_ms",
    "open_loop",
    "percentile",
    "register",
    "summarize",
]
