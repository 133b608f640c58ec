"""The `openai` backend: a tier served by any OpenAI-compatible server (vLLM, llama.cpp, hosted).

One logical request gives one `Generation` or one exception, never both and never two, and an
upstream is trusted no more than a client is (docs/design.md, security boundary). One module per
job, each saying in its docstring which part of that promise it keeps:

- `backend`: `OpenAIBackend`, the request flow: tries within a deadline, the circuit breakers,
  streams retried only until their first piece of text, optional parameters a server refuses,
  scoring a given answer for `cross_tier`.
- `client`: the SDK client, over `router.backends.openai.upstream_io.CappedTransport` (every byte read
  through a size cap, nothing compressed, no redirect followed).
- `call`: one request's deadline, the bounds its answer is held to, and the body sent for it.
- `reading`: a plain answer's choices, usage, logprobs, top-k and tool calls, checked and clamped.
- `streams`: a stream's chunks folded into one answer, and when a stream counts as complete.
- `failures`: which failed attempts are retried, and the typed error (`router.errors`) a client
  hears, with its `Retry-After`; the upstream's own words stay in the log.
- `deployments`: the tier's servers (one `base_url`, or several `deployments`), each with its own
  client, breaker, `Retry-After` mark, load and probe, and the pool a request picks from.
- `balancing`: the routing strategies (least outstanding, weighted random, ordered failover).
- `failover`: a request's attempts across the deployments: another deployment at once, then
  backed-off retries, all within the deadline.

The backend is registered by name (`openai`) in `router.backends.builtins`; `OpenAIBackend` is
re-exported here, so that registration and callers name the package, not its layout.
"""

from router.backends.openai.backend import OpenAIBackend

__all__ = ["OpenAIBackend"]
