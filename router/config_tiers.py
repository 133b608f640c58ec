"""The settings of one tier (`[[tiers]]`): its backend (llama.cpp or an OpenAI-compatible server and
its deployments), price, verifiers, task policies, shadow sampling and speculative cascade.

Part of the configuration `router.config` reads (it re-exports every name here); a module of its
own so that neither holds more than one part of the file's shape.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from router.tasks import TASKS, Task

_TASK_NAMES: tuple[str, ...] = tuple(TASKS)
_TIER_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PriceSettings(_Strict):
    """What a tier costs. Hosted models are priced by tokens, self-hosted hardware by busy time."""

    usd_per_1m_input_tokens: float | None = Field(None, ge=0, description="Token price for input.")
    usd_per_1m_output_tokens: float | None = Field(None, ge=0, description="Token price for output.")
    usd_per_hour: float | None = Field(
        None, ge=0, description="Hardware price, charged for the measured busy time of each request."
    )
    stands_for: str = Field("", description="What this price models, printed in every report.")

    @model_validator(mode="after")
    def _one_mode(self) -> PriceSettings:
        by_tokens = self.usd_per_1m_input_tokens is not None or self.usd_per_1m_output_tokens is not None
        by_time = self.usd_per_hour is not None
        if by_tokens == by_time:
            raise ValueError("set either usd_per_1m_input_tokens and usd_per_1m_output_tokens, or usd_per_hour")
        if by_tokens and (self.usd_per_1m_input_tokens is None or self.usd_per_1m_output_tokens is None):
            raise ValueError("token pricing needs both usd_per_1m_input_tokens and usd_per_1m_output_tokens")
        return self


class VerifierSpec(_Strict):
    name: str = Field(description="Registered verifier name, e.g. 'confidence' or a plugin's name.")
    weight: float = Field(1.0, gt=0, description="Weight in the tier's combined score.")
    params: dict[str, Any] = Field(default_factory=dict, description="Passed to the verifier factory.")


class PrerouterSettings(_Strict):
    """A prompt-only estimator that skips this tier, before it generates, when it predicts the
    tier will answer wrong. Trained by `tierroute eval train`, which prints this section."""

    artifact: Path = Field(description="The pre-router file written by `tierroute eval train`.")
    sha256: str = Field(
        pattern=r"^[0-9a-fA-F]{64}$", description="The file's SHA-256: any other file is refused at start-up."
    )
    threshold: float = Field(ge=0, le=1, description="Skip the tier when P(right) from the prompt is below this.")


class TaskPolicySettings(_Strict):
    """How a tier judges answers to one task (`tiers[].tasks.<task>`). Every field left unset is
    the tier's own (`verifiers`, `combine`, `threshold`)."""

    verifiers: list[VerifierSpec] | None = Field(
        None, description="The verifiers for this task; unset: the tier's own. An empty list accepts every answer."
    )
    combine: Literal["mean", "min"] | None = Field(None, description="How their scores combine; unset: the tier's.")
    threshold: float | None = Field(
        None, ge=0, le=1, description="Accept when the combined score >= this; unset: the tier's."
    )


class SpecCascadeSettings(_Strict):
    """The speculative cascade (research mode; README, "Speculative cascade"): at each position
    the draft model drafted, a deferral rule compares the draft model's distribution q with this
    model's p. Not deferring keeps the drafted token unchecked; deferring applies the ordinary
    speculative rule against p. The tier's answer is then no longer this model's alone."""

    rule: Literal["chow", "diff", "opt"] = Field(
        description="Defer to this model when: chow, max q < 1 - margin; diff, max q < max p - margin; "
        "opt, max q < max p - margin * TV(p, q)."
    )
    margin: float = Field(
        ge=-1,
        le=1,
        description="The rule's margin: -1 always defers (exact speculative decoding), 1 never defers "
        "under diff and opt (every drafted token is kept).",
    )


_SHA256 = r"^[0-9a-fA-F]{64}$"


class LlamaCppSettings(_Strict):
    model: str = Field(description="Catalog name, a local .gguf path, or 'hf:REPO/FILE'.")
    model_sha256: str | None = Field(
        None,
        pattern=_SHA256,
        description="The SHA-256 of a local or hf: model file: any other file is refused, and such a "
        "model with no pin is refused unless allow_unpinned. A catalog model carries its own pin.",
    )
    draft_model_sha256: str | None = Field(
        None, pattern=_SHA256, description="The same pin for draft_model, when it is a local or hf: file."
    )
    allow_unpinned: bool = Field(
        False,
        description="Load a local or hf: model (or draft model) that has no sha256 pin: whatever file is "
        "at that path or on the hub then runs in this process. A warning is logged at every load.",
    )
    n_ctx: int = Field(4096, ge=256, description="Context size shared by all parallel sequences' KV.")
    n_threads: int = Field(0, ge=0, description="CPU threads; 0 means the machine's physical cores.")
    n_batch: int = Field(512, ge=16, description="Most tokens in one decode step (prefill chunk).")
    n_parallel: int = Field(4, ge=1, le=64, description="Sequences decoded together in one step.")
    max_queue: int = Field(64, ge=1, description="Requests waiting for a slot before 503.")
    prefix_cache_slots: int = Field(
        4,
        ge=0,
        le=64,
        description="Prompt prefixes kept in the KV cache after a request, for reuse by later requests "
        "of the same tenant (prefix_cache_scope); 0 keeps none (concurrent requests of one tenant still "
        "share their prompts).",
    )
    prefix_cache_scope: Literal["key", "team", "global"] = Field(
        "key",
        description="Who reuses whose prompt KV, kept or running: 'key', each API key only its own "
        "(a server without keys is one tenant); 'team', the keys of one team (a key without a team "
        "keeps its own); 'global', everyone. A prefix reused is a prompt answered sooner, so whoever "
        "shares a scope can tell by timing whether a guess of another's prompt (a system prompt, "
        "word by word) was sent before: 'team' and 'global' let teammates, or every caller, do that.",
    )
    kv_cache_type: Literal["f16", "q8_0", "q4_0"] = Field(
        "f16", description="KV cache precision; quantized types halve or quarter its memory."
    )
    draft_model: str | None = Field(
        None,
        description="A smaller model of the same vocabulary that drafts tokens for this one to verify "
        "(speculative decoding; same forms as `model`); unset: no drafting.",
    )
    draft_max: int = Field(8, ge=1, le=32, description="Most tokens drafted per sequence per decode step.")
    draft_max_batch: int = Field(
        1,
        ge=1,
        le=256,
        description="The draft model drafts only while at most this many sequences decode at once: a "
        "batch already reads the weights once for all its sequences, and measured here, drafting at "
        "concurrency 8 cost 38% of the throughput (docs/benchmarks.md).",
    )
    draft_p_min: float = Field(
        0.6,
        ge=0,
        le=1,
        description="Drafting stops before a token the draft model gives less than this probability "
        "(the draft length adapts: a sure draft runs to draft_max, an unsure one stops early).",
    )
    reuse_rejected: bool = Field(
        True,
        description="When a local tier of the same vocabulary escalates to this one, its rejected answer "
        "is this tier's first draft (greedy: the longest prefix this model agrees with is kept at once).",
    )
    spec_cascade: SpecCascadeSettings | None = Field(
        None,
        description="Research mode, off when unset: keep a drafted token without this model's check "
        "where a deferral rule says the draft model is sure enough (needs draft_model).",
    )

    @model_validator(mode="after")
    def _spec_cascade_drafts(self) -> LlamaCppSettings:
        if self.spec_cascade is not None and self.draft_model is None:
            raise ValueError("spec_cascade needs a draft_model: its rule judges the draft model's tokens")
        return self


def http_base_url(url: str) -> str:
    """An OpenAI-compatible base URL as the HTTP client can use it: http(s), with a host. Anything
    else (file://, unix://, no host) would fail only at the first request, as a connection error."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"a base_url is an http(s) URL with a host, not {url!r}")
    return url


class DeploymentSettings(_Strict):
    """One deployment of an `openai` tier (`[[tiers.openai.deployments]]`): a server, region or
    provider serving the tier's model, in the operator's judgement (router.backends.openai.deployments)."""

    base_url: str = Field(description="OpenAI-compatible base URL of this deployment.")
    name: str | None = Field(
        None,
        description="Shown in /metrics, the `tierroute` object and the ledger; unset: the base_url's host "
        "(and port, when it names one).",
    )
    api_key_env: str | None = Field(
        None, description="Environment variable holding this deployment's key; unset: the tier's api_key_env."
    )
    # bounded so the weights' sum stays finite: random.choices refuses an infinite total
    weight: float = Field(
        1.0, gt=0, le=1_000_000, description="Share of traffic under weighted_random; a tie-break elsewhere."
    )
    model: str | None = Field(None, description="Model name sent to this deployment; unset: the tier's model.")
    max_concurrent: int | None = Field(
        None, ge=1, description="Most requests in flight at this deployment; unset: no limit."
    )

    @field_validator("base_url")
    @classmethod
    def _http_base_url(cls, url: str) -> str:
        return http_base_url(url)

    @property
    def label(self) -> str:
        parts = urlsplit(self.base_url)
        host = f"{parts.hostname}:{parts.port}" if parts.hostname and parts.port else parts.hostname
        return self.name or host or self.base_url


class OpenAIBackendSettings(_Strict):
    base_url: str | None = Field(
        None,
        description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8001/v1 (or list `deployments` instead).",
    )
    deployments: list[DeploymentSettings] = Field(
        default_factory=list,
        description="Several deployments of the tier's model, instead of one base_url: failover and balancing "
        "(docs/deployments.md).",
    )
    strategy: Literal["least_outstanding", "weighted_random", "ordered_failover"] = Field(
        "least_outstanding", description="How a request picks among the deployments that are available."
    )
    # lower bounds: 1e-9 was accepted, and probed back to back or timed every try but the last out at once
    probe_interval_s: float | None = Field(
        None,
        ge=0.05,
        description="Ask each deployment's GET /models this often (at least 0.05 s); a failing one takes no "
        "traffic. Unset: off.",
    )
    attempt_timeout_s: float | None = Field(
        None,
        ge=0.5,
        description="Most seconds one attempt may take while other deployments are still untried (at least "
        "0.5 s); unset: the time left split evenly among them (the last try always has all the time left).",
    )
    model: str = Field(description="Model name sent upstream.")
    api_key_env: str | None = Field(
        None, description="Name of the environment variable holding the upstream key (never the key)."
    )
    max_attempts: int = Field(3, ge=1, le=10, description="Tries per request, retryable errors only.")
    backoff_initial_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(8.0, gt=0)
    breaker_failures: int = Field(5, ge=1, description="Consecutive failures that open the breaker.")
    breaker_cooldown_s: float = Field(30.0, gt=0, description="Open time before a half-open probe.")
    # unset resolves by shape (`resolved_breaker_successes`): a one-base_url config keeps the one good
    # call it always needed, while a deployment that flaps has others to take its traffic meanwhile
    breaker_successes: int | None = Field(
        None,
        ge=1,
        le=100,
        description="Good half-open probes in a row that close an open breaker (one call at a time until "
        "then; a failed one opens it again): a flapping upstream is not sent full traffic at each good call. "
        "Unset: 2 for a tier listing several deployments, 1 otherwise (one base_url, as before deployments).",
    )
    probe_successes: int = Field(
        2,
        ge=1,
        le=100,
        description="With probe_interval_s: passing probes in a row a deployment that failed its probe needs "
        "before it takes traffic again, so one that flaps between probes is not sent traffic at each pass.",
    )
    logprobs: bool = Field(True, description="Ask upstream for the sampled tokens' logprobs.")
    prompt_logprobs: Literal["none", "echo", "vllm"] = Field(
        "none",
        description="How this tier scores another tier's answer by prefill (the cross_tier verifier): "
        "'echo' (completions with echo and logprobs: llama.cpp servers, vLLM), 'vllm' (vLLM's "
        "prompt_logprobs), or 'none' (it cannot).",
    )
    chat_template: Literal["chatml", "qwen2.5"] | None = Field(
        None,
        description="The model's chat template, for 'echo' scoring of chat requests (rendered here): "
        "'chatml', or 'qwen2.5' (ChatML with Qwen's default system prompt).",
    )
    max_response_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Most bytes read from one upstream answer (a body, an error body or a whole "
        "stream), never unbounded memory. A larger one is an upstream failure, unless the request asked for "
        "an answer that large: then its 400, refused at admission where the estimate says so (docs/deployments.md).",
    )
    hosted_prompt_tokens: int = Field(
        4096,
        ge=0,
        le=1_000_000,
        description="Prompt tokens the upstream may count beyond what it is sent (a hosted API's own "
        "system prompt). Usage above what was sent plus this is refused, and admission reserves it "
        "for every request to this tier: lower it for a server that adds none (vLLM, llama.cpp).",
    )
    max_stream_events: int = Field(
        65_536,
        ge=16,
        description="Most server-sent events read from one upstream stream; an answer may also "
        "arrive in at most twice as many network reads.",
    )

    @field_validator("base_url")
    @classmethod
    def _http_base_url(cls, url: str | None) -> str | None:
        return None if url is None else http_base_url(url)

    @model_validator(mode="after")
    def _one_way_to_the_upstream(self) -> OpenAIBackendSettings:
        if (self.base_url is None) == (not self.deployments):
            raise ValueError("set either base_url or [[tiers.openai.deployments]], not both and not neither")
        labels = [d.label for d in self.deployments]
        if len(set(labels)) != len(labels):
            raise ValueError(f"deployment names must differ (set `name`): {', '.join(labels)}")
        return self

    @property
    def resolved_breaker_successes(self) -> int:
        """`breaker_successes`, or its default for this tier's shape: 2 with several deployments, else 1
        (one base_url, or a list of one: nothing else could take its traffic while it proves itself)."""
        if self.breaker_successes is not None:
            return self.breaker_successes
        return 2 if len(self.deployments) > 1 else 1

    def resolved_deployments(self) -> list[DeploymentSettings]:
        """The tier's deployments: those listed, or the one its `base_url` names."""
        if self.deployments:
            inherit = {"api_key_env": self.api_key_env}
            return [d if d.api_key_env else d.model_copy(update=inherit) for d in self.deployments]
        assert self.base_url is not None
        # checked once already, as this tier's base_url (an eval import's `import:` marker is built
        # past that check, and is never called)
        return [DeploymentSettings.model_construct(base_url=self.base_url, api_key_env=self.api_key_env)]


class ShadowSettings(_Strict):
    """Shadow escalation (`tiers[].shadow`, router.quality.shadow): a sampled share of the answers this
    tier accepts is also asked of a larger tier in the background, after the client has its
    answer, to estimate the tier's live accuracy and watch it for drift (router.quality.drift)."""

    rate: float = Field(ge=0, le=1, description="Share of this tier's accepted answers also sent to the target.")
    target: str | None = Field(None, description="The tier asked in the shadow; unset: the next tier.")
    usd_per_day: float = Field(
        ge=0,
        description="Most shadow work may cost per UTC day (estimated before, charged after); at it, "
        "shadow work stops until the next day. Charged to the operator key '_shadow'.",
    )
    max_concurrency: int = Field(2, ge=1, le=256, description="Shadow requests of this tier running at once.")
    max_queue: int = Field(
        64, ge=0, le=100_000, description="Shadow requests waiting; past it new ones are dropped (and counted)."
    )
    baseline_accept: dict[str, float] = Field(
        default_factory=dict,
        description="The acceptance rate the drift alarm compares against, per task ('*': every task), "
        "e.g. from the calibration; a task without one learns it from its first baseline_n requests.",
    )
    baseline_agree: dict[str, float] = Field(
        default_factory=dict,
        description="The shadow agreement rate the drift alarm compares against, per task ('*': every "
        "task); a task without one learns it from its first baseline_n shadow pairs.",
    )
    baseline_n: int = Field(200, ge=20, description="Observations a learned baseline is estimated from.")

    @field_validator("baseline_accept", "baseline_agree")
    @classmethod
    def _rates(cls, v: dict[str, float]) -> dict[str, float]:
        for task, rate in v.items():
            if task != "*" and task not in _TASK_NAMES:
                raise ValueError(f"unknown task {task!r}; tasks: '*', {', '.join(_TASK_NAMES)}")
            if not 0 < rate < 1:
                raise ValueError(f"a baseline rate is strictly between 0 and 1 (got {rate} for {task!r})")
        return v


class TierSettings(_Strict):
    name: str
    backend: str = Field(
        description=(
            "A registered backend: 'llamacpp' (in-process), 'openai' (any OpenAI-compatible server) or a plugin's."
        )
    )
    llamacpp: LlamaCppSettings | None = None
    openai: OpenAIBackendSettings | None = None
    options: dict[str, Any] = Field(default_factory=dict, description="Settings of a plugin backend.")
    price: PriceSettings = Field(description="Required: every tier is priced.")
    verifiers: list[VerifierSpec] = Field(default_factory=list)
    combine: Literal["mean", "min"] = Field("mean", description="How verifier scores are combined.")
    threshold: float = Field(0.5, ge=0, le=1, description="Accept when the combined score >= this.")
    tasks: dict[Task, TaskPolicySettings] = Field(
        default_factory=dict,
        description="Policies per task (structured, choice, code, maths, open_ended): verifiers, combine and "
        "threshold for requests of that task; what a policy leaves unset, and tasks without one, use the tier's own.",
    )
    max_tokens: int = Field(512, ge=1, description="Cap on a request's max_tokens at this tier.")
    timeout_s: float = Field(120.0, gt=0, description="Deadline for one generation at this tier.")
    verify_timeout_s: float = Field(
        60.0, gt=0, description="Deadline for scoring one answer; past it the answer is not accepted (it goes up)."
    )
    prerouter: PrerouterSettings | None = Field(
        None, description="Optional: skip this tier (never the last) when a prompt-only estimator predicts failure."
    )
    shadow: ShadowSettings | None = Field(
        None,
        description="Optional: also send a sampled share of accepted answers to a larger tier (off the client's path).",
    )
    local: bool | None = Field(
        None,
        description="Whether what this tier is sent stays on this machine (guards' keep_local answers only "
        "from local tiers, docs/guardrails.md). Unset: true for 'llamacpp' (in-process), false for 'openai' "
        "and plugin backends; set true only for a server on this machine (a vLLM or llama.cpp on loopback).",
    )

    @property
    def is_local(self) -> bool:
        """`local`, or its default by backend: only the in-process llama.cpp backend is local unless
        the operator says otherwise (a remote default is the safe mistake)."""
        return self.local if self.local is not None else self.backend == "llamacpp"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _TIER_NAME.match(v) or v == "auto":
            raise ValueError("tier names are lowercase [a-z0-9_.-], and 'auto' is reserved")
        return v

    @model_validator(mode="after")
    def _backend_section(self) -> TierSettings:
        # the built-in backends have typed sections; whether the name is registered at all is
        # checked against the backend registry at start-up (router.engine.check_resources)
        for section in ("llamacpp", "openai"):
            if self.backend == section and getattr(self, section) is None:
                raise ValueError(f"backend '{self.backend}' needs a [tiers.{self.backend}] section")
            if self.backend != section and getattr(self, section) is not None:
                raise ValueError(f"backend is '{self.backend}' but a [tiers.{section}] section is set")
        if self.backend in ("llamacpp", "openai") and self.options:
            raise ValueError(f"options are for plugin backends; backend '{self.backend}' has its own section")
        return self
