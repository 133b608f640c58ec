"""The typed values that flow between the API, the cascade, backends and verifiers."""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from router.telemetry.spans import Span


@dataclass(frozen=True)
class ToolCall:
    """One function call, as OpenAI carries it: `arguments` is JSON text (the model wrote it, so
    it may not parse; the `tool_call` verifier says whether it does)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolSpec:
    """A function the client offers. The parameters' JSON Schema is kept as canonical JSON text,
    so a request stays hashable and comparable; `parameters` parses it (once)."""

    name: str
    description: str | None = None
    parameters_json: str | None = None
    strict: bool = False
    # the schema this service decodes forced calls under and validates arguments against, when it
    # is not `parameters` itself: a non-strict function's, loosened (router.structured.grammars)
    checked_json: str | None = None

    @functools.cached_property
    def parameters(self) -> dict[str, Any] | None:
        return None if self.parameters_json is None else dict(json.loads(self.parameters_json))

    @functools.cached_property
    def checked(self) -> dict[str, Any] | None:
        """The arguments' schema as this service enforces it (`parameters` unless loosened)."""
        return self.parameters if self.checked_json is None else dict(json.loads(self.checked_json))

    def to_openai(self) -> dict[str, Any]:
        """The tool as OpenAI's API (and chat templates written for it) spell it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        if self.strict:
            function["strict"] = True
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class NamedTool:
    """tool_choice naming one function: the answer must call it."""

    name: str


ToolChoice = Literal["auto", "none", "required"] | NamedTool


@dataclass(frozen=True)
class Message:
    role: str
    content: str  # an assistant's null content (it only called tools) reads as ""
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls, in the history
    tool_call_id: str | None = None  # a `tool` message: the call it answers


MAX_TOP_LOGPROBS = 20  # OpenAI's own bound on top_logprobs
MAX_CHOICES = 8  # n: samples per request (more is a batch job, not a chat request)


@dataclass(frozen=True)
class ResponseFormat:
    """The structure the caller asked the answer to have: any JSON value (`json_object`) or one
    that validates against `schema` (`json_schema`). Local tiers decode under a grammar made from
    it; remote tiers are sent it; the `format` verifier checks the answer against it."""

    kind: Literal["json_object", "json_schema"]
    schema: dict[str, Any] | None = field(default=None, hash=False)  # compared, not hashed (a dict)
    name: str = ""
    strict: bool | None = None

    def to_openai(self) -> dict[str, Any]:
        """The parameter as OpenAI's API takes it (what a remote tier is sent)."""
        if self.kind == "json_object":
            return {"type": "json_object"}
        spec: dict[str, Any] = {"name": self.name, "schema": self.schema}
        if self.strict is not None:
            spec["strict"] = self.strict
        return {"type": "json_schema", "json_schema": spec}


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its text piece, its logprob, and the most likely tokens at its
    position (`top`: (piece, logprob) pairs, most likely first; empty when none were asked for).
    A piece that is part of a multi-byte character reads as U+FFFD."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Tenant:
    """Who a request is served for, as the API authenticated it: the key's name and its team (or
    'anonymous' and no team on a server without keys: one tenant). State a request leaves behind
    that another could read or time (the response cache, a local tier's prompt KV) is kept per
    tenant, and `scope` is the one rule that names whose it is."""

    key: str
    team: str | None = None

    def scope(self, kind: Literal["key", "team", "global"]) -> str:
        """Who shares with this tenant: 'key', the key alone ('key:NAME'); 'team', the key's team
        ('team:NAME'; a key without a team is its own); 'global', everyone ('*')."""
        if kind == "global":
            return "*"
        if kind == "team" and self.team is not None:
            return f"team:{self.team}"
        return f"key:{self.key}"


@dataclass(frozen=True)
class GenerationRequest:
    """One generation, chat (messages) or plain completion (prompt): exactly one is set."""

    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    deadline: float | None = None  # time.monotonic() after which the work is abandoned
    top_logprobs: int = 0  # alternatives wanted per generated token (0..MAX_TOP_LOGPROBS); 0: none
    tools: tuple[ToolSpec, ...] = ()  # functions the model may call (chat only)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True  # False: at most one call per answer
    response_format: ResponseFormat | None = None  # None: free text
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), as OpenAI's
    presence_penalty: float = 0.0  # subtracted once from the logit of every token already generated
    frequency_penalty: float = 0.0  # subtracted per earlier occurrence of the token
    n: int = 1  # samples of the same prompt; a backend returns them as one Generation (`others`)
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)
    # the API's caller (set by the route from the authenticated key); None: the service's own work
    # (evals, the command line), one tenant of its own. Work done for a request (verifiers asking a
    # tier, shadow comparisons) carries its tenant on.
    tenant: Tenant | None = None
    # a guard found data in it that may not leave the machine (router.guards, `keep_local`): only a
    # local tier may be sent it; a remote backend refuses it (ResidencyError), and so does shadow
    # escalation. Work done for the request (a judge, a second opinion) carries it on, as `tenant`.
    local_only: bool = False
    # the span this work reports under (a tier attempt's; router.telemetry.spans): a backend's
    # upstream call and the verifiers hang theirs under it; None while tracing is off
    trace: Span | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("exactly one of messages and prompt must be set")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}")
        if self.tools and self.messages is None:
            raise ValueError("tools need a chat request (messages)")
        if not 1 <= self.n <= MAX_CHOICES:
            raise ValueError(f"n must be in 1..{MAX_CHOICES}")

    def sample(self, i: int) -> GenerationRequest:
        """The request for choice `i` of n, alone: a seeded request gives each choice its own seed
        (seed + i), so the n samples differ and the same request gives the same n again."""
        seed = None if self.seed is None else (self.seed + i + (1 << 63)) % (1 << 64) - (1 << 63)
        return self.with_(n=1, seed=seed)

    @property
    def offers_tools(self) -> bool:
        """Whether the model is shown tools: some are given and tool_choice is not `none`."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    def with_(self, **changes: Any) -> GenerationRequest:
        return replace(self, **changes)

    def remaining(self) -> float | None:
        """Seconds left before the deadline (never negative), or None without one."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def last_user_text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        assert self.messages is not None
        for m in reversed(self.messages):
            if m.role == "user":
                return m.content
        return self.messages[-1].content if self.messages else ""


FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True)
class Generation:
    """A backend's answer: text, counts and the logprob of each sampled token."""

    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    token_logprobs: tuple[float, ...] | None  # None when the backend cannot give them
    latency_s: float
    ttft_s: float | None = None
    busy_s: float | None = None  # compute time attributable to this request (for time pricing)
    model: str = ""
    # per generated token, when the request asked for top_logprobs and the backend gives them
    top_logprobs: tuple[TokenLogprob, ...] | None = None
    # calls a backend received as structured data (an upstream's `tool_calls`); None: the answer
    # is all in `text`, where a local model writes its calls (`router.structured.tools.answer` reads them)
    tool_calls: tuple[ToolCall, ...] | None = None
    # decoded under a grammar from the request's response_format (True); asked of an upstream
    # that enforces it or not as it does (None); free text (False)
    constrained: bool | None = False
    # speculative decoding: (source, tokens drafted, tokens accepted) per draft source, "model" (a
    # draft model) or "rejected" (a lower tier's rejected answer); empty when nothing was drafted
    drafts: tuple[tuple[str, int, int], ...] = ()
    # choices 2..n of a request with n > 1; this Generation's own text is choice 1, and its counts
    # and compute cover all n (the prompt once), so the cascade prices and the ledger records them all
    others: tuple[Generation, ...] = ()
    # which of the tier's deployments answered (an `openai` tier's; None for a local tier): its
    # name as the ledger and /metrics know it (by default its host:port), and as clients see it
    # (the operator's name or its place, '#2'; None for a tier of one unnamed deployment)
    deployment: str | None = None
    deployment_shown: str | None = None

    @property
    def choices(self) -> tuple[Generation, ...]:
        """Every choice, this one first; each of the others carries its own counts."""
        return (self, *self.others)


def merge_choices(samples: list[Generation]) -> Generation:
    """n samples of one prompt as one Generation: the first's text, prompt tokens counted once
    (the samples share its prefill), completion tokens and compute summed, latency the slowest."""
    first, rest = samples[0], tuple(samples[1:])
    if not rest:
        return first
    busy = [g.busy_s for g in samples]
    return replace(
        first,
        completion_tokens=sum(g.completion_tokens for g in samples),
        latency_s=max(g.latency_s for g in samples),
        busy_s=None if None in busy else sum(b for b in busy if b is not None),
        drafts=_sum_drafts(samples),
        others=rest,
    )


def _sum_drafts(samples: list[Generation]) -> tuple[tuple[str, int, int], ...]:
    totals: dict[str, tuple[int, int]] = {}
    for g in samples:
        for source, drafted, accepted in g.drafts:
            d, a = totals.get(source, (0, 0))
            totals[source] = (d + drafted, a + accepted)
    return tuple((source, d, a) for source, (d, a) in totals.items())


@dataclass(frozen=True)
class Delta:
    """A piece of streamed text, with what the generation has spent so far where the backend
    knows it (so a stream cut short is still accounted for)."""

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # generated so far, this piece included
    busy_s: float | None = None  # compute so far
    top_logprobs: tuple[TokenLogprob, ...] | None = None  # this piece's tokens, when asked for
    deployment: str | None = None  # which of the tier's deployments is streaming it
    deployment_shown: str | None = None  # and what clients see it called (Generation's)
