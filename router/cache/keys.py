"""What a cached answer is keyed by, and who may read it back.

The key is SHA-256 over canonical JSON (sorted keys, no spaces, integral floats written as
integers) of everything that determines the answer: the request as the API validated it (model
or `auto`, messages or prompt, tools, tool_choice, response_format, every sampling parameter,
seed, n, logprobs, stop, our `tierroute` extension), the endpoint's shape, the tier policy
version, the reader's scope, and whether the caller may have its code run (the verifiers read
it, so two keys of one team that differ in it never share an answer). Left out are only fields
that change how an answer is delivered, never what it says: `stream`, `stream_options` and
`user`. A field a client adds that tierroute does not know is ignored by the API, so it cannot
change the answer either.

The tier policy version is a hash of the resolved tier config that decides answers (each tier's
backend and model, its verifiers, thresholds, task policies, limits and deadlines) and of the
cascade's settings, so a config change that alters a tier's policy keys every later request
differently: earlier entries are never served again, and age out. Prices and shadow sampling
change what an answer costs or what is learnt from it, not the answer, so they are left out, and
so is an `openai` tier's transport (its deployments, their balancing, retries, breakers, probes,
keys and byte bounds: `OPENAI_TRANSPORT`), which decides where the tier's model is asked, not what
it answers. What its deployments are asked for is in, though: the set of model names they are sent
(each deployment's own `model`, or the tier's), so pointing a deployment at another model stops
serving the old model's answers.

The scope is part of the key and is also stored beside the entry and matched on reading, so even
two equal hashes could not cross tenants. `scope_of` is the one place a scope is chosen: per API
key by default, or per team (a key without a team keeps its own), named by `Tenant.scope` (the
rule a local tier's prefix cache names its tenants by too); `has_share` says whether that scope
is held to its own share of the entries, so that one tenant's many distinct requests evict only
its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel

from router.admission.auth import ANONYMOUS, Principal
from router.config import Settings, TierSettings

FORMAT = 1  # bumped when what is keyed or stored changes: earlier entries are then never read
_NOT_IN_KEY = frozenset({"stream", "stream_options", "user"})  # how the answer is delivered, not what it is
_NOT_POLICY = frozenset({"price", "shadow"})  # what an answer costs, or what is learnt from it
# An `openai` tier's transport: which of its deployments serves a request and how it is reached,
# retried, bounded and health-checked. The deployments serve the tier's model in the operator's
# judgement, so a weight or a new replica must not drop every entry. What stays in: the tier's
# `model`, what its verifiers read (logprobs, prompt scoring), and the model names its deployments
# are sent (`_deployment_policies`: a deployment's own `model` decides what answers).
# Every field of the section is in one set or the other (tests/router/cache/test_cache_keys.py), so
# a new one is decided, not silently hashed or left out.
OPENAI_TRANSPORT = frozenset(
    {
        "base_url",
        "deployments",
        "strategy",
        "probe_interval_s",
        "probe_successes",
        "attempt_timeout_s",
        "api_key_env",
        "max_attempts",
        "backoff_initial_s",
        "backoff_max_s",
        "breaker_failures",
        "breaker_cooldown_s",
        "breaker_successes",
        "max_response_bytes",
        "max_stream_events",
        "hosted_prompt_tokens",
    }
)
OPENAI_POLICY = frozenset({"model", "logprobs", "prompt_logprobs", "chat_template"})
# One deployment's fields, decided the same way: only the model it is sent is hashed (as the set of
# every deployment's, so adding a replica of the same model, or reordering them, changes nothing).
DEPLOYMENT_TRANSPORT = frozenset({"base_url", "name", "api_key_env", "weight", "max_concurrent"})
DEPLOYMENT_POLICY = frozenset({"model"})


_EXCLUDED: dict[str, Any] = {**dict.fromkeys(_NOT_POLICY, True), "openai": set(OPENAI_TRANSPORT)}


def canonical(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, integral floats as integers (0.0 and 0 are one key)."""
    return json.dumps(_normal(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _normal(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return value


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def policy_version(settings: Settings) -> str:
    """A hash of the config that decides what a request is answered with."""
    return sha256(
        canonical(
            {
                "tiers": [_tier_policy(t) for t in settings.tiers],
                "cascade": settings.cascade.model_dump(mode="json"),
                "namespace": settings.cache.namespace,
            }
        )
    )


def _tier_policy(tier: TierSettings) -> dict[str, Any]:
    policy = tier.model_dump(mode="json", exclude=_EXCLUDED)
    if tier.openai is not None:
        policy["deployments"] = _deployment_policies(tier)
    return policy


def _deployment_policies(tier: TierSettings) -> list[str]:
    """What an `openai` tier's deployments are sent that decides answers: each one's
    `DEPLOYMENT_POLICY` fields (a deployment without its own model is sent the tier's), as a sorted
    set, so a replica of the same model, or an order, changes nothing."""
    assert tier.openai is not None
    seen = set()
    for d in tier.openai.resolved_deployments():
        fields = d.model_dump(mode="json", include=set(DEPLOYMENT_POLICY))
        fields["model"] = d.model or tier.openai.model
        seen.add(canonical(fields))
    return sorted(seen)


def deterministic(body: BaseModel) -> bool:
    """Whether a repeat asks for the same answer: served greedy, or seeded. Read from the sampling
    the request is served with (`router.api.requests.BaseRequest.sampling`), not the field as
    sent: an omitted or null temperature, and one too small to sample with, are served at 0, as
    greedy as a `"temperature": 0`, whatever OpenAI's own default."""
    served: dict[str, Any] = body.sampling()  # type: ignore[attr-defined]  # every cached body is a BaseRequest
    return served["temperature"] == 0 or served["seed"] is not None


def scope_of(principal: Principal, scope: Literal["key", "team", "global"]) -> str:
    """Whose entries a caller reads and writes. 'key': the API key's name (without keys, every
    caller is 'anonymous', one tenant); 'team': the key's team, shared by its keys (a key without
    a team is its own tenant); 'global': everyone's."""
    return principal.tenant.scope(scope)


def has_share(principal: Principal, scope: Literal["key", "team", "global"]) -> bool:
    """Whether the caller's scope is one tenant among others, held to its own share of the cache
    (`cache.max_entries_per_scope`): not under 'global', nor on a keyless server, whose every
    caller is the one tenant 'anonymous'."""
    return scope != "global" and dataclasses.replace(principal, may_send_tests=False) != ANONYMOUS


def cache_key(body: BaseModel, *, shape: str, policy: str, scope: str, client_code: bool) -> str:
    """The entry's key: the request as validated, less how it is delivered, with its endpoint's
    shape, the policy version, the scope, and whether the caller may have its code run
    (`Principal.may_send_tests`): the verifiers are told so (`client_code`), and `code_tests`
    then runs the prompt's own helpers and examples, so it decides the answer as the request does."""
    request = body.model_dump(mode="json", exclude=set(_NOT_IN_KEY))
    return sha256(
        canonical(
            {
                "v": FORMAT,
                "shape": shape,
                "policy": policy,
                "scope": scope,
                "client_code": client_code,
                "request": request,
            }
        )
    )


def directives(cache_control: str | None) -> tuple[bool, bool]:
    """(read, store) from the client's Cache-Control: `no-cache` skips the lookup and still stores
    the fresh answer (HTTP's meaning: do not answer from storage without revalidating); `no-store`
    does neither."""
    if not cache_control:
        return True, True
    said = {part.strip().lower().split("=", 1)[0] for part in cache_control.split(",")}
    if "no-store" in said:
        return False, False
    return "no-cache" not in said, True
